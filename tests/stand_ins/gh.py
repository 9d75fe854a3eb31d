"""A stand-in for the GitHub CLI (nothing here can reach GitHub): answers the ``gh`` calls that
``syncguard comment`` makes from a JSON state file, records every call, and applies creates and edits to the
state. Installed as an executable named ``gh`` first on PATH by tests/test_comment.py."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlparse


def main(argv: list[str]) -> int:
    state_path = Path(os.environ["FAKE_GH_STATE"])
    state = json.loads(state_path.read_text())
    call: dict[str, object] = {"argv": argv}
    if "--input" in argv:
        call["input"] = json.loads(Path(argv[argv.index("--input") + 1]).read_text())
    with Path(os.environ["FAKE_GH_LOG"]).open("a") as log:
        log.write(json.dumps(call) + "\n")
    if argv[:2] == ["auth", "status"]:
        if not state.get("authenticated", True):
            print("You are not logged into any GitHub hosts. To log in, run: gh auth login", file=sys.stderr)
            return 1
        return 0
    if argv[:2] == ["repo", "view"]:
        print(json.dumps(state.get("repo_view", {"nameWithOwner": state["repo"]})))
        return 0
    if argv[:2] == ["api", "user"]:
        if state.get("login") is None:
            print("HTTP 403: Resource not accessible by integration", file=sys.stderr)
            return 1
        print(json.dumps({"login": state["login"]}))
        return 0
    if argv[0] != "api":
        print(f"stand-in gh: unexpected call {argv}", file=sys.stderr)
        return 2
    method = argv[argv.index("-X") + 1] if "-X" in argv else "GET"
    endpoint = next(a for a in argv[1:] if a.startswith("repos/"))
    url = urlparse(endpoint)
    listing = re.fullmatch(r"repos/([^/]+/[^/]+)/issues/(\d+)/comments", url.path)
    single = re.fullmatch(r"repos/([^/]+/[^/]+)/issues/comments/(\d+)", url.path)
    pull = re.fullmatch(r"repos/([^/]+/[^/]+)/pulls/(\d+)", url.path)
    label = re.fullmatch(r"repos/([^/]+/[^/]+)/issues/(\d+)/labels/([^/]+)", url.path)
    status = re.fullmatch(r"repos/([^/]+/[^/]+)/statuses/([0-9a-f]{40})", url.path)
    comments = state["comments"]
    if pull and method == "GET" and "pull_answer" in state:  # a proxy's HTML page, an error object
        print(state["pull_answer"])
        return 0
    if pull and method == "GET":
        print(json.dumps(state["pulls"][pull.group(2)]))
        return 0
    if status and method == "POST":
        fields = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-f")
        state.setdefault("statuses", []).append({"sha": status.group(2), **fields})
        state_path.write_text(json.dumps(state))
        print(json.dumps({"state": fields.get("state")}))
        return 0
    if label and method == "DELETE":
        labels = state["pulls"][label.group(2)]["labels"]
        labels[:] = [x for x in labels if x["name"] != label.group(3)]
        state_path.write_text(json.dumps(state))
        print("[]")
        return 0
    if listing and method == "GET":
        query = parse_qs(url.query)
        size, page = int(query["per_page"][0]), int(query["page"][0])
        if state.get("repeat_pages"):  # a gh (or proxy) that answers every page with the first
            page = 1
        print(json.dumps(comments[(page - 1) * size : page * size]))
        return 0
    if listing and method == "POST" and "post_answer" in state:
        print(state["post_answer"])
        return 0
    if listing and method == "POST":
        numbers = [c["id"] for c in comments if isinstance(c, dict) and isinstance(c.get("id"), int)]
        new_id = max(numbers, default=1000) + 1
        if state.pop("race", False):  # another run for the same key posted just before this one
            comments.append({"id": new_id, "user": {"login": state["login"]}, **call["input"]})
            new_id += 1
        comment = {"id": new_id, "user": {"login": state["login"] or "github-actions[bot]"}, **call["input"]}
        comment["html_url"] = f"https://github.com/{state['repo']}/pull/1#issuecomment-{new_id}"
        comments.append(comment)
    elif single and method == "PATCH":
        comment = next(c for c in comments if c["id"] == int(single.group(2)))
        comment.update(call["input"])
    elif single and method == "DELETE":
        comments[:] = [c for c in comments if c["id"] != int(single.group(2))]
        state_path.write_text(json.dumps(state))
        return 0
    else:
        print(f"stand-in gh: unexpected API call {method} {endpoint}", file=sys.stderr)
        return 2
    state_path.write_text(json.dumps(state))
    print(json.dumps(comment))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
