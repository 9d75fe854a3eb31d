"""The history's default store: a data branch of the repository itself (``syncguard-history``), written only by the
default branch's push job and read by pull-request jobs, with nothing else to host.

:func:`push` fetches the branch (or starts it, without a parent, the first time), appends the run to a copy of its
files, commits them with git's plumbing and pushes; a push rejected because another job pushed first is retried on
the new tip (the run appended again to what that job wrote), so two pushes at once both land. The branch holds only
history files, never the code: a force-pushed default branch leaves it as it is, and a run of a commit no longer on
the default branch is still a measurement of that GPU model. :func:`fetch` copies the branch's files into a folder
for ``syncguard report --history``. No torch here."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ..document.measured import MeasuredTest
from . import history

BRANCH = "syncguard-history"
#: How often a push rejected by another job's push is tried again on the new tip.
RETRIES = 5
GIT_TIMEOUT_S = 300


class BranchError(history.HistoryError):
    """A git step of the history branch failed; the message names it and what git said."""


def _git(
    checkout: Path, *args: str, check: bool = True, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, check=False, env={**os.environ, **(env or {})})  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        raise BranchError(f"git {args[0]} could not run: {exc}") from exc
    if check and done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[:400] or f"exit status {done.returncode}"
        raise BranchError(f"git {' '.join(args[:2])} in {checkout}: {said}")
    return done


def _fetched(checkout: Path, remote: str, branch: str) -> str | None:
    """The commit the remote's branch is at, fetched; None where the remote has no such branch yet."""
    listed = _git(checkout, "ls-remote", "--heads", remote, branch).stdout.split()
    if not listed:
        return None
    _git(checkout, "fetch", "--quiet", remote, f"+refs/heads/{branch}:refs/syncguard/{branch}")
    return _git(checkout, "rev-parse", f"refs/syncguard/{branch}").stdout.strip()


def fetch(checkout: Path, into: Path, *, remote: str = "origin", branch: str = BRANCH) -> bool:
    """Copy the history branch's files into folder ``into``; False (nothing copied) where it has none yet."""
    tip = _fetched(checkout, remote, branch)
    if tip is None:
        return False
    into.mkdir(parents=True, exist_ok=True)
    for name in _git(checkout, "ls-tree", "--name-only", tip).stdout.split():
        if name.endswith((".jsonl", ".details.json")) and "/" not in name:
            (into / name).write_text(_git(checkout, "show", f"{tip}:{name}").stdout, encoding="utf-8")
    return True


def push(
    checkout: Path,
    results: Sequence[MeasuredTest],
    commit: str,
    *,
    remote: str = "origin",
    branch: str = BRANCH,
    now: Callable[[], str] | None = None,
    say: Callable[[str], object] = print,
) -> dict[str, int]:
    """Append the run of ``results`` (measured at ``commit``) to the history branch of ``remote`` and push it, again
    on the new tip while another job's push rejects it; per GPU model, the runs its history then holds. The commit is
    made with git's plumbing (a tree of the branch's files, a commit whose parent is the fetched tip): the checkout's
    own branches, index and working tree are not touched."""
    when = (now or history.now)()
    for attempt in range(1, RETRIES + 2):
        folder = Path(tempfile.mkdtemp(prefix="syncguard-history-"))
        try:
            files = folder / "files"
            tip = _fetched(checkout, remote, branch)
            if tip is not None:
                fetch(checkout, files, remote=remote, branch=branch)
            held = history.record(files, results, commit, when)
            index = str(folder / "index")
            _git(checkout, f"--work-tree={files}", "add", "--all", ".", env={"GIT_INDEX_FILE": index})
            tree = _git(checkout, "write-tree", env={"GIT_INDEX_FILE": index}).stdout.strip()
            message = f"syncguard history: {commit[:12]} ({', '.join(f'{s}: run {n}' for s, n in held.items())})"
            parents = ["-p", tip] if tip is not None else []
            identity = {"GIT_AUTHOR_NAME": "syncguard", "GIT_AUTHOR_EMAIL": "syncguard@localhost",
                        "GIT_COMMITTER_NAME": "syncguard", "GIT_COMMITTER_EMAIL": "syncguard@localhost"}  # fmt: skip
            made = _git(checkout, "commit-tree", tree, *parents, "-m", message, env=identity).stdout.strip()
            pushed = _git(checkout, "push", "--quiet", remote, f"{made}:refs/heads/{branch}", check=False)
            if pushed.returncode == 0:
                say(f"{message} pushed to {remote} {branch}")
                return held
            said = (pushed.stderr or pushed.stdout).strip()
            if attempt > RETRIES or not any(w in said for w in ("rejected", "fetch first", "non-fast-forward")):
                raise BranchError(f"git push of {branch} to {remote} failed: {said[:400]}")
            say(f"syncguard history: {remote} {branch} moved on (another job pushed): again on its new tip")
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    raise AssertionError("unreachable")
