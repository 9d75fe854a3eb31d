"""GitLab through its REST API (v4): a merge request's notes (:class:`GitLab`, a :class:`.Comments`), with a token
of an account that may comment (a project access token, say; a job's ``CI_JOB_TOKEN`` cannot write notes).

The server is ``--server``, else the job's ``CI_SERVER_URL``, else https://gitlab.com; the token
``SYNCGUARD_GITLAB_TOKEN``, else ``GITLAB_TOKEN``; the project the job's ``CI_PROJECT_PATH`` where ``--repo`` does
not name it."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from .base import PAGE_SIZE, CommentError, Forge, Note, every_page

#: GitLab's limit on a note's body, in characters.
BODY_LIMIT = 1_000_000
TOKEN_VARIABLES = ("SYNCGUARD_GITLAB_TOKEN", "GITLAB_TOKEN")


def server_of(server: str | None) -> str:
    """The server's URL: the one given, else the job's ``CI_SERVER_URL``, else gitlab.com; without a trailing
    ``/``; anything but an http(s) URL is a :class:`CommentError`."""
    url = (server or os.environ.get("CI_SERVER_URL") or "https://gitlab.com").rstrip("/")
    if not url.startswith(("https://", "http://")) or any(c.isspace() for c in url):
        raise CommentError(f"--server {url!r}: not an http(s) URL of a GitLab server")
    return url


def gitlab(server: str | None = None) -> Forge:
    return Forge(
        "GitLab",
        "merge request",
        BODY_LIMIT,
        server_of(server),
        blob="-/blob",
        commits="-/commit",
        nested=True,
        connect=lambda at, timeout: GitLab(at, timeout=timeout),
    )


class GitLab:
    """The few GitLab calls ``comment`` makes, each one HTTPS request with the token in ``PRIVATE-TOKEN``."""

    def __init__(self, server: str | None = None, token: str | None = None, *, timeout: float = 60.0) -> None:
        self.server = server_of(server)
        self.token = token or next((os.environ[v] for v in TOKEN_VARIABLES if os.environ.get(v)), None)
        self.timeout = timeout

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The API's answer to ``method path`` as JSON (None: no content); a refusal, an unreachable server, a hang
        or an answer that is no JSON is a :class:`CommentError` naming the call."""
        what = f"GitLab {method} {path.partition('?')[0]}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.server}/api/v4/{path}", data=data, method=method)
        request.add_header("PRIVATE-TOKEN", self.token or "")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                text = answer.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", errors="replace").strip()[:300]
            raise CommentError(f"{what} failed: HTTP {exc.code} {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise CommentError(f"{what} could not reach {self.server}: {exc}") from None
        try:
            return json.loads(text) if text.strip() else None
        except json.JSONDecodeError:
            raise CommentError(f"{what} did not answer JSON: {text[:200]!r}") from None

    def check_auth(self) -> None:
        if not self.token:
            raise CommentError(
                f"no GitLab token: set {' or '.join(TOKEN_VARIABLES)} to a token that may comment on merge requests "
                "(a project access token with the api scope; CI_JOB_TOKEN cannot write notes)"
            )

    def me(self) -> str | None:
        """The token's account (a project access token's bot user included); a refused token is an error."""
        data = self._call("GET", "user")
        return str(data["username"]) if isinstance(data, dict) and "username" in data else None

    def current_repository(self) -> str:
        name = os.environ.get("CI_PROJECT_PATH")
        if not name:
            raise CommentError("no project: pass --repo GROUP/PROJECT (a GitLab job sets CI_PROJECT_PATH)")
        return name

    def _notes_path(self, repository: str, number: int) -> str:
        return f"projects/{quote(repository, safe='')}/merge_requests/{number}/notes"

    def _url(self, repository: str, number: int, note: int) -> str:
        return f"{self.server}/{repository}/-/merge_requests/{number}#note_{note}"

    def notes(self, repository: str, number: int) -> list[Note]:
        """The merge request's notes, page by page (:func:`.base.every_page`), its system notes left out."""
        path = self._notes_path(repository, number)
        items = every_page(
            lambda page: self._call("GET", f"{path}?sort=asc&order_by=created_at&per_page={PAGE_SIZE}&page={page}"),
            "GitLab",
            f"the notes of {repository}!{number}",
        )
        return [n for item in items if (n := self._note(item, repository, number)) is not None]

    def _note(self, item: Any, repository: str, number: int) -> Note | None:
        """A user's note (None: a system note, or no note at all)."""
        if not isinstance(item, dict) or item.get("system"):
            return None
        number_id = item.get("id")
        if not isinstance(number_id, int) or isinstance(number_id, bool):
            return None
        author = item.get("author")
        name = str(author.get("username")) if isinstance(author, dict) else ""
        return Note(number_id, name, str(item.get("body", "")), self._url(repository, number, number_id))

    def _written(self, answer: Any, call: str, repository: str, number: int) -> Note:
        note = self._note(answer, repository, number)
        if note is None:
            raise CommentError(
                f"GitLab {call} answered no note ({str(answer)[:100]!r}): nothing was posted as far as syncguard "
                "can tell; look at the merge request"
            )
        return note

    def create(self, repository: str, number: int, body: str) -> Note:
        answer = self._call("POST", self._notes_path(repository, number), {"body": body})
        return self._written(answer, "POST (create)", repository, number)

    def update(self, repository: str, number: int, note: int, body: str) -> Note:
        answer = self._call("PUT", f"{self._notes_path(repository, number)}/{note}", {"body": body})
        return self._written(answer, "PUT (update)", repository, number)

    def delete(self, repository: str, number: int, note: int) -> None:
        self._call("DELETE", f"{self._notes_path(repository, number)}/{note}")
