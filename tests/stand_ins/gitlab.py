"""A stand-in for GitLab's REST API (nothing here can reach a GitLab server): the user and a merge request's notes,
served over HTTP on localhost from a state the test sets, every request recorded. Started in a thread by
tests/test_gitlab.py; ``syncguard comment --forge gitlab --server URL`` speaks to it as to a real server."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

NOTES = re.compile(r"/api/v4/projects/([^/]+)/merge_requests/(\d+)/notes(?:/(\d+))?")


class StandIn:
    """GitLab's answers from ``notes`` (per project path and merge request IID), for the account ``username``
    whose token is ``token``."""

    def __init__(self, token: str = "glpat-stand-in", username: str = "syncguard-bot") -> None:
        self.token, self.username = token, username
        self.notes: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self.calls: list[tuple[str, str, Any]] = []
        self.repeat_pages = False
        self.lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"stand_in": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def note(self, project: str, iid: int, body: str, author: str, system: bool = False) -> dict[str, Any]:
        with self.lock:
            notes = self.notes.setdefault((project, iid), [])
            ids = [n["id"] for mr in self.notes.values() for n in mr]
            note = {"id": max(ids, default=1000) + 1, "body": body, "author": {"username": author}, "system": system}
            notes.append(note)
            return note


class _Handler(BaseHTTPRequestHandler):
    stand_in: StandIn

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _answer(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        s = self.stand_in
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        s.calls.append((method, self.path, body))
        if self.headers.get("PRIVATE-TOKEN") != s.token:
            return self._answer(401, {"message": "401 Unauthorized"})
        if url.path == "/api/v4/user" and method == "GET":
            return self._answer(200, {"username": s.username})
        found = NOTES.fullmatch(url.path)
        if not found:
            return self._answer(404, {"message": "404 Not Found"})
        key = (unquote(found.group(1)), int(found.group(2)))
        notes = s.notes.setdefault(key, [])
        if found.group(3) is None and method == "GET":
            query = parse_qs(url.query)
            size, page = int(query["per_page"][0]), int(query["page"][0])
            page = 1 if s.repeat_pages else page
            return self._answer(200, notes[(page - 1) * size : page * size])
        if found.group(3) is None and method == "POST":
            return self._answer(201, s.note(*key, body["body"], s.username))
        note = next((n for n in notes if n["id"] == int(found.group(3) or 0)), None)
        if note is None:
            return self._answer(404, {"message": "404 Note Not Found"})
        if note["author"]["username"] != s.username:
            return self._answer(403, {"message": "403 Forbidden"})
        if method == "PUT":
            note["body"] = body["body"]
            return self._answer(200, note)
        if method == "DELETE":
            notes.remove(note)
            self.send_response(204)
            self.end_headers()
            return None
        return self._answer(405, {"message": "405 Method Not Allowed"})

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")
