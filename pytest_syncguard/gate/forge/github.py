"""GitHub through its CLI ``gh``: a pull request's comments (:class:`GitHub`, a :class:`.Comments`), and the API
calls the trusted workflow makes (:meth:`GitHub.api`). Every call is one ``gh`` invocation (arguments, never a
shell)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from typing import Any

from .base import PAGE_SIZE, CommentError, Forge, Note, every_page

#: GitHub refuses a comment's body over 65,536 characters (syncguard counts UTF-8 bytes, never fewer).
GITHUB = Forge(
    "GitHub",
    "pull request",
    65_536,
    "https://github.com",
    blob="blob",
    commits="commit",
    nested=False,
    connect=lambda server, timeout: GitHub(timeout=timeout),
)
#: Seconds one gh call may take before it is given up (a hung ``gh auth status`` waiting on a keyring, say).
GH_TIMEOUT_S = 60.0


class GitHub:
    """The few GitHub calls ``comment`` makes, each one ``gh api`` invocation (arguments, never a shell)."""

    def __init__(self, gh: str | None = None, *, timeout: float = GH_TIMEOUT_S) -> None:
        found = gh or shutil.which("gh")
        if found is None:
            raise CommentError("the GitHub CLI `gh` is not on PATH: install it from https://cli.github.com")
        self.gh = found
        self.timeout = timeout

    def _call(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``gh args`` (a list, never a shell); a gh that cannot start, hangs or answers in another encoding
        than UTF-8 is a CommentError naming the call."""
        what = f"gh {' '.join(args[:3])}"
        try:
            return subprocess.run(
                [self.gh, *args],
                capture_output=True,
                text=True,
                encoding="utf-8",
                errors="replace",
                timeout=self.timeout,
            )
        except subprocess.TimeoutExpired:
            raise CommentError(f"{what} did not finish within {self.timeout:g} s (--gh-timeout)") from None
        except (OSError, subprocess.SubprocessError) as exc:
            raise CommentError(f"{what} could not run ({self.gh}): {exc}") from exc

    def _run(self, *args: str, input_json: dict[str, Any] | None = None) -> Any:
        payload = None
        try:
            if input_json is not None:
                handle, payload = tempfile.mkstemp(prefix="syncguard-comment-", suffix=".json")
                with os.fdopen(handle, "w", encoding="utf-8") as sink:
                    json.dump(input_json, sink)
                args = (*args, "--input", payload)
            done = self._call(*args)
        finally:
            if payload is not None:
                os.unlink(payload)
        if done.returncode != 0:
            raise CommentError(f"gh {' '.join(args[:3])} failed (exit {done.returncode}): {done.stderr.strip()[:500]}")
        try:
            return json.loads(done.stdout) if done.stdout.strip() else None
        except json.JSONDecodeError as exc:
            raise CommentError(f"gh {' '.join(args[:3])} did not answer JSON: {done.stdout[:200]!r}") from exc

    def api(self, *args: str) -> Any:
        """``gh api ARGS``'s answer as JSON (None: no answer); a gh that cannot run, hangs, fails or answers no JSON
        (an HTML page of a proxy) is a :class:`CommentError` naming the call."""
        return self._run("api", *args)

    def check_auth(self) -> None:
        done = self._call("auth", "status")
        if done.returncode != 0:
            raise CommentError(
                "gh is not authenticated: run `gh auth login`, or set GH_TOKEN (in a workflow: "
                "GH_TOKEN: ${{ github.token }}) " + f"({(done.stderr or done.stdout).strip()[:300]})"
            )

    def me(self) -> str | None:
        """The account's login; a workflow's GITHUB_TOKEN, which cannot read its user, posts as
        ``github-actions[bot]``; None elsewhere."""
        try:
            data = self._run("api", "user")
        except CommentError:
            data = None
        if isinstance(data, dict) and "login" in data:
            return str(data["login"])
        return "github-actions[bot]" if os.environ.get("GITHUB_ACTIONS") == "true" else None

    def current_repository(self) -> str:
        data = self._run("repo", "view", "--json", "nameWithOwner")
        name = data.get("nameWithOwner") if isinstance(data, dict) else None
        if not isinstance(name, str) or GITHUB.repository_problem(name):
            raise CommentError(f"gh repo view named no repository ({str(data)[:100]!r}): pass --repo OWNER/NAME")
        return name

    def notes(self, repo: str, pr: int) -> list[Note]:
        """All comments of the PR (:meth:`comments`) as notes; one without a numeric id is an error."""
        found = []
        for c in self.comments(repo, pr):
            user = c.get("user")
            number = comment_id(c)
            if number is None:  # no comment this tool can edit; one that bears its marker is an error
                if "pytest-syncguard:comment" in str(c.get("body", "")):
                    raise CommentError(f"gh api listed this tool's comment with id {c.get('id')!r}: not a number")
                continue
            login = str(user.get("login")) if isinstance(user, dict) else ""
            found.append(Note(number, login, str(c.get("body", "")), str(c.get("html_url", ""))))
        return found

    def comments(self, repo: str, pr: int) -> list[dict[str, Any]]:
        """All comments of the PR, page by page (:func:`.base.every_page`)."""
        items = every_page(
            lambda page: self._run("api", f"repos/{repo}/issues/{pr}/comments?per_page={PAGE_SIZE}&page={page}"),
            "gh api",
            f"the comments of {repo}#{pr}",
        )
        return [c for c in items if isinstance(c, dict)]  # anything else is no comment of this tool's

    def create(self, repo: str, pr: int, body: str) -> Note:
        answer = self._run("api", "-X", "POST", f"repos/{repo}/issues/{pr}/comments", input_json={"body": body})
        return _comment(answer, "gh api -X POST (create)")

    def update(self, repo: str, pr: int, note: int, body: str) -> Note:
        answer = self._run("api", "-X", "PATCH", f"repos/{repo}/issues/comments/{note}", input_json={"body": body})
        return _comment(answer, "gh api -X PATCH (update)")

    def delete(self, repo: str, pr: int, note: int) -> None:
        self._run("api", "-X", "DELETE", f"repos/{repo}/issues/comments/{note}")


def _comment(answer: Any, call: str) -> Note:
    """The comment a create or update answered, which must carry its id."""
    number = comment_id(answer) if isinstance(answer, dict) else None
    if number is None:
        raise CommentError(
            f"{call} answered no comment ({str(answer)[:100]!r}): nothing was posted as far as "
            "syncguard can tell; look at the pull request"
        )
    user = answer.get("user")
    login = str(user.get("login")) if isinstance(user, dict) else ""
    return Note(number, login, str(answer.get("body", "")), str(answer.get("html_url", "")))


def comment_id(comment: dict[str, Any]) -> int | None:
    """A comment's id (None: none, or not a number)."""
    value = comment.get("id")
    return value if isinstance(value, int) and not isinstance(value, bool) else None
