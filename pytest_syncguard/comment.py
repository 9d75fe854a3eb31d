"""One sticky PR comment per key (GPU model) through the ``gh`` CLI.

The comment carries a hidden marker with its key. Posting pages through all of the PR's comments, and
edits the one that has the marker *and* was written by the same account; otherwise it creates one. Anyone
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

PAGE_SIZE = 100
BODY_LIMIT = 65_536
#: Seconds one gh call may take before it is given up (a hung ``gh auth status`` waiting on a keyring, say).
GH_TIMEOUT_S = 60.0
_KEY = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


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
                [self.gh, *args], capture_output=True, text=True, encoding="utf-8", errors="replace",
                timeout=self.timeout,
            )  # fmt: skip
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
        return str(data["nameWithOwner"])

    def comments(self, repo: str, pr: int) -> list[dict[str, Any]]:
        """All comments of the PR, page by page."""
        found: list[dict[str, Any]] = []
        page = 1
        while True:
            batch = self._run("api", f"repos/{repo}/issues/{pr}/comments?per_page={PAGE_SIZE}&page={page}")
            if not isinstance(batch, list):
                raise CommentError(f"gh api: unexpected answer for the comments of {repo}#{pr}")
            found.extend(batch)
            if len(batch) < PAGE_SIZE:
                return found
            page += 1

    def create(self, repo: str, pr: int, body: str) -> dict[str, Any]:
        return dict(self._run("api", "-X", "POST", f"repos/{repo}/issues/{pr}/comments", input_json={"body": body}))

    def update(self, repo: str, comment_id: int, body: str) -> dict[str, Any]:
        return dict(
            self._run("api", "-X", "PATCH", f"repos/{repo}/issues/comments/{comment_id}", input_json={"body": body})
        )


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
    if repo is not None and not _REPO.match(repo):
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
    mine = [
        c
        for c in github.comments(repo, pr)
        if tag in str(c.get("body", "")) and str((c.get("user") or {}).get("login")) == me
    ]
    if mine:
        latest = max(mine, key=lambda c: int(c["id"]))
        done = github.update(repo, int(latest["id"]), text)
        return Posted("updated", int(latest["id"]), str(done.get("html_url", "")))
    done = github.create(repo, pr, text)
    return Posted("created", int(done.get("id", 0)), str(done.get("html_url", "")))
