"""One sticky PR comment per key (GPU model) through the ``gh`` CLI.

The comment carries a hidden marker with its key as its last line. Posting pages through all of the PR's comments,
and edits the one that ends with the marker *and* was written by the same account; otherwise it creates one. Anyone
else's comment, even one that quotes the marker, is never edited (``gh pr comment --edit-last`` would edit
the account's last comment, whatever it was).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

from ...render.links import is_repository

PAGE_SIZE = 100
#: The most pages of comments read (a gh that answers every page alike would page forever).
MAX_PAGES = 300
BODY_LIMIT = 65_536
#: Seconds one gh call may take before it is given up (a hung ``gh auth status`` waiting on a keyring, say).
GH_TIMEOUT_S = 60.0
_KEY = re.compile(r"^[A-Za-z0-9._-]{1,100}$")


class CommentError(Exception):
    """Something ``comment`` cannot do; the message says what to fix."""


def marker(key: str) -> str:
    return f"<!-- pytest-syncguard:comment key={key} -->"


@dataclass(frozen=True)
class Posted:
    action: str
    """created or updated"""
    comment_id: int
    url: str


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

    def login(self) -> str | None:
        """The account's login; None for a token that cannot read its user (a workflow's GITHUB_TOKEN)."""
        try:
            data = self._run("api", "user")
        except CommentError:
            return None
        return str(data["login"]) if isinstance(data, dict) and "login" in data else None

    def repository(self) -> str:
        data = self._run("repo", "view", "--json", "nameWithOwner")
        name = data.get("nameWithOwner") if isinstance(data, dict) else None
        if not isinstance(name, str) or not is_repository(name):
            raise CommentError(f"gh repo view named no repository ({str(data)[:100]!r}): pass --repo OWNER/NAME")
        return name

    def comments(self, repo: str, pr: int) -> list[dict[str, Any]]:
        """All comments of the PR, page by page: at most :data:`MAX_PAGES` pages, and a page that repeats the one
        before (a gh that answers every page alike) stops it."""
        found: list[dict[str, Any]] = []
        before: list[Any] = []
        for page in range(1, MAX_PAGES + 1):
            batch = self._run("api", f"repos/{repo}/issues/{pr}/comments?per_page={PAGE_SIZE}&page={page}")
            if not isinstance(batch, list):
                raise CommentError(f"gh api: unexpected answer for the comments of {repo}#{pr}")
            if batch and batch == before:
                raise CommentError(
                    f"gh api answered page {page} of the comments of {repo}#{pr} with page "
                    f"{page - 1}'s again: stopped rather than page forever"
                )
            found.extend(c for c in batch if isinstance(c, dict))  # anything else is no comment of this tool's
            if len(batch) < PAGE_SIZE:
                return found
            before = batch
        raise CommentError(f"the comments of {repo}#{pr} ran past {MAX_PAGES} pages of {PAGE_SIZE}: stopped")

    def create(self, repo: str, pr: int, body: str) -> dict[str, Any]:
        answer = self._run("api", "-X", "POST", f"repos/{repo}/issues/{pr}/comments", input_json={"body": body})
        return _comment(answer, "gh api -X POST (create)")

    def update(self, repo: str, comment_id: int, body: str) -> dict[str, Any]:
        answer = self._run(
            "api", "-X", "PATCH", f"repos/{repo}/issues/comments/{comment_id}", input_json={"body": body}
        )
        return _comment(answer, "gh api -X PATCH (update)")

    def delete(self, repo: str, comment_id: int) -> None:
        self._run("api", "-X", "DELETE", f"repos/{repo}/issues/comments/{comment_id}")


def _comment(answer: Any, call: str) -> dict[str, Any]:
    """The comment a create or update answered, which must carry its id."""
    if not isinstance(answer, dict) or comment_id(answer) is None:
        raise CommentError(
            f"{call} answered no comment ({str(answer)[:100]!r}): nothing was posted as far as "
            "syncguard can tell; look at the pull request"
        )
    return answer


def comment_id(comment: dict[str, Any]) -> int | None:
    """A comment's id (None: none, or not a number)."""
    value = comment.get("id")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def post(
    body: str,
    pr: int,
    *,
    key: str,
    repo: str | None = None,
    author: str | None = None,
    github: GitHub | None = None,
    timeout: float = GH_TIMEOUT_S,
) -> Posted:
    """Create or update this tool's comment for ``key`` on PR ``pr``."""
    if not _KEY.match(key):
        raise CommentError(f"--key {key!r}: use letters, digits, '.', '_' or '-' (a device slug), at most 100")
    if repo is not None and not is_repository(repo):
        raise CommentError(f"--repo {repo!r}: expected OWNER/NAME")
    if pr <= 0:
        raise CommentError(f"--pr {pr}: expected a pull request number")
    tag = marker(key)
    text = f"{body.rstrip()}\n\n{tag}\n"
    if len(text) > BODY_LIMIT:
        raise CommentError(
            f"the comment is {len(text)} characters, GitHub's limit is {BODY_LIMIT}: render it with "
            "`syncguard report --markdown`, which truncates"
        )
    github = github or GitHub(timeout=timeout)
    github.check_auth()
    repo = repo or github.repository()
    me = author or github.login()
    if me is None:
        if os.environ.get("GITHUB_ACTIONS") == "true":
            me = "github-actions[bot]"
        else:
            raise CommentError("cannot tell which account gh uses (gh api user failed): pass --author LOGIN")
    mine = _ours(github.comments(repo, pr), tag, me)
    if mine:
        oldest = min(mine)
        done = github.update(repo, oldest, text)
        return Posted("updated", oldest, str(done.get("html_url", "")))
    done = github.create(repo, pr, text)
    created = comment_id(done)
    assert created is not None
    # Another run for the same key may have created one at the same time: the oldest stays, with this body.
    older = [i for i in _ours(github.comments(repo, pr), tag, me) if i < created]
    if older:
        github.delete(repo, created)
        kept = github.update(repo, min(older), text)
        return Posted("updated", min(older), str(kept.get("html_url", "")))
    return Posted("created", created, str(done.get("html_url", "")))


def _ours(comments: list[dict[str, Any]], tag: str, me: str) -> list[int]:
    """The ids of the comments written by ``me`` whose last line is ``tag`` (where :func:`post` puts it: a marker
    quoted elsewhere in a body, a test id's say, marks nothing); one without a numeric id is an error."""
    found = []
    for c in comments:
        user = c.get("user")
        last = str(c.get("body", "")).rstrip().rpartition("\n")[2]
        if last == tag and isinstance(user, dict) and str(user.get("login")) == me:
            number = comment_id(c)
            if number is None:
                raise CommentError(f"gh api listed this tool's comment with id {c.get('id')!r}: not a number")
            found.append(number)
    return found
