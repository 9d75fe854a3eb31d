"""The history's default store: a data branch of the repository itself (``syncguard-history``), written only by the
default branch's push job and read by pull-request jobs, with nothing else to host.

:func:`push` fetches the branch (or starts it, without a parent, the first time), appends the run to a copy of its
history files, commits the tip's tree with them replaced (other files on the branch stay) with git's plumbing and
pushes; a push rejected because another job pushed first is retried on the new tip after a jittered pause (the run
appended again to what that job wrote), so pushes at once all land. Every remote and branch reaches git as a name,
after ``--end-of-options``. The branch holds only
history files, never the code: a force-pushed default branch leaves it as it is, and a run of a commit no longer on
the default branch is still a measurement of that GPU model. :func:`fetch` copies the branch's files into a folder
for ``syncguard report --history``. No torch here."""

from __future__ import annotations

import itertools
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ..document.measured import MeasuredTest
from ..judge import history

BRANCH = "syncguard-history"
#: How long a push rejected by other jobs' pushes is tried again on the new tip, in all.
PUSH_WITHIN_S = 300.0
#: The first pause before a try again, doubled each try up to :data:`PAUSE_MAX_S`, each drawn at random up to it
#: (so that jobs that collided do not collide again).
PAUSE_S = 0.25
PAUSE_MAX_S = 15.0
GIT_TIMEOUT_S = 300


class BranchError(history.HistoryError):
    """A git step of the history branch failed; the message names it and what git said."""


def _git(
    checkout: Path, *args: str, check: bool = True, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            ["git", "-C", str(checkout), *args],
            capture_output=True,
            text=True,
            errors="replace",  # a file name in another encoding is no slug's: never a traceback
            timeout=GIT_TIMEOUT_S,
            check=False,
            env={**os.environ, **(env or {})},
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise BranchError(f"git {args[0]} could not run: {exc}") from exc
    if check and done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[:400] or f"exit status {done.returncode}"
        raise BranchError(f"git {' '.join(args[:2])} in {checkout}: {said}")
    return done


def checked_name(what: str, value: str) -> str:
    """``value`` as a remote or branch name git takes as a name, never as an option; :class:`BranchError` naming
    ``what`` otherwise."""
    if not value or value.startswith("-") or any(c in value for c in "\0\n\r") or value != value.strip():
        raise BranchError(f"{what} {value!r}: not a git {what.lstrip('-')} name")
    return value


#: Where a history may live outside the branches: a ref that ``git clone`` does not fetch (``refs/syncguard/history``).
OUTSIDE_BRANCHES = "refs/syncguard/"


def _ref(branch: str) -> str:
    """The full ref of ``--branch``: a branch name (``refs/heads/NAME``), or a ref under :data:`OUTSIDE_BRANCHES`,
    which a developer's clone does not download (and a branch ruleset does not protect)."""
    checked_name("--branch", branch)
    full = branch.startswith(OUTSIDE_BRANCHES)
    name = branch.removeprefix(OUTSIDE_BRANCHES) if full else branch
    if (
        not name
        or name.startswith("refs/")
        or ".." in branch
        or branch.endswith((".lock", "/"))
        or "//" in branch
        or any(c in branch for c in " ~^:?*[\\")
    ):
        raise BranchError(
            f"--branch {branch!r}: not a branch name (give it without refs/heads/) nor a ref under {OUTSIDE_BRANCHES}"
        )
    return branch if full else f"refs/heads/{branch}"


def _tracking(branch: str) -> str:
    """Where a fetched history is kept in the checkout: ``refs/syncguard/fetched/<the ref past refs/>``."""
    return "refs/syncguard/fetched/" + _ref(branch).removeprefix("refs/")


def _fetched(checkout: Path, remote: str, branch: str) -> str | None:
    """The commit the remote's branch (exactly that branch: ``feature/syncguard-history`` is not ``syncguard-history``)
    is at, fetched without its history (``--depth 1``); None where the remote has no such branch yet."""
    ref = _ref(branch)
    checked_name("--remote", remote)
    listed = _git(checkout, "ls-remote", "--end-of-options", remote, ref).stdout.splitlines()
    if not any(line.split("\t")[-1] == ref for line in listed):
        return None
    # Its tip only: the files a record or a report reads are the tip's (measured with bench/bench_history_fetch.py,
    # 50 tests x 1,100 pushes: 0.86 MB in 0.2 s, the whole branch 3.83 MB in 2.6 s).
    _git(checkout, "fetch", "--quiet", "--depth", "1", "--end-of-options", remote, f"+{ref}:{_tracking(branch)}")
    return _git(checkout, "rev-parse", "--verify", "--end-of-options", f"{_tracking(branch)}^{{commit}}").stdout.strip()


def _files(checkout: Path, tip: str) -> list[tuple[str, str, int]]:
    """The top-level files of commit ``tip``: (name, blob, size), names as git stores them (spaces and all)."""
    listed = _git(checkout, "ls-tree", "-z", "--long", "--end-of-options", tip).stdout.split("\0")
    files = []
    for line in filter(None, listed):
        meta, _, name = line.partition("\t")
        mode, kind, blob, size = meta.split()
        if kind == "blob" and mode in ("100644", "100755"):
            files.append((name, blob, int(size)))
    return files


def _history_files(files: Sequence[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    """Of a branch's files, the history files of device slugs (``<slug>.jsonl``, ``<slug>.details.json``)."""
    return [f for f in files if history.slug_of(f[0]) is not None]


def fetch(checkout: Path, into: Path, *, remote: str = "origin", branch: str = BRANCH, every_run: bool = False) -> bool:
    """Copy the history branch's files that a record or a report reads (each GPU model's checkpoint, open segment
    and details; with ``every_run`` its closed segments too, for the history page) into folder ``into``; False
    (nothing copied) where it has none yet. Another file on the branch (a README) is left where it is; a history
    file over :data:`.history.MAX_FILE_BYTES` is an error naming it."""
    tip = _fetched(checkout, remote, branch)
    if tip is None:
        return False
    into.mkdir(parents=True, exist_ok=True)
    for name, blob, size in _history_files(_files(checkout, tip)):
        if not every_run and not history.judging_file(name):
            continue
        if size > history.MAX_FILE_BYTES:
            raise BranchError(
                f"{remote} {branch}: {name} is {size} bytes, over the "
                f"{history.MAX_FILE_BYTES >> 20} MB a history file may hold"
            )
        (into / name).write_bytes(_blob(checkout, blob))
    return True


def _blob(checkout: Path, blob: str) -> bytes:
    try:
        done = subprocess.run(
            ["git", "-C", str(checkout), "cat-file", "blob", blob],
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise BranchError(f"git cat-file could not run: {exc}") from exc
    if done.returncode != 0:
        raise BranchError(f"git cat-file blob {blob}: {done.stderr.decode(errors='replace').strip()[:400]}")
    return done.stdout


def _holds_history(checkout: Path, tip: str, files: Sequence[tuple[str, str, int]]) -> bool:
    """Whether commit ``tip`` is a history branch's: a commit of syncguard's, or one that holds a history file."""
    message = _git(checkout, "log", "-1", "--format=%s", "--end-of-options", tip).stdout
    if message.startswith("syncguard history:"):
        return True
    for name, blob, size in _history_files(files):
        if name.endswith(history.RUNS_SUFFIX) and size <= history.MAX_FILE_BYTES:
            first = _blob(checkout, blob).split(b"\n", 1)[0]
            if f'"schema": "{history.SCHEMA}"'.encode() in first:
                return True
    return False


def push(
    checkout: Path,
    results: Sequence[MeasuredTest],
    commit: str,
    *,
    remote: str = "origin",
    branch: str = BRANCH,
    now: Callable[[], str] | None = None,
    say: Callable[[str], object] = print,
    within_s: float = PUSH_WITHIN_S,
) -> dict[str, history.Recorded]:
    """Append the run of ``results`` (measured at ``commit``) to the history branch of ``remote`` and push it, again
    on the new tip while another job's push rejects it (after a jittered, growing pause, for up to ``within_s``
    seconds in all); per GPU model, what was recorded. The commit is made with git's plumbing (the tip's tree with
    the history files replaced, a commit whose parent is the tip): the branch's other files stay, and the checkout's
    own branches, index and working tree are not touched. A branch that exists and is no history branch (``main``)
    is refused."""
    when = (now or history.now)()
    started = time.monotonic()
    for attempt in itertools.count(1):
        folder = Path(tempfile.mkdtemp(prefix="syncguard-history-"))
        try:
            files = folder / "files"
            files.mkdir()
            tip = _fetched(checkout, remote, branch)
            index = {"GIT_INDEX_FILE": str(folder / "index")}
            if tip is not None:
                if not _holds_history(checkout, tip, _files(checkout, tip)):
                    raise BranchError(
                        f"{remote} {branch} exists and holds no syncguard history: not written (name "
                        f"the history's own branch, default {BRANCH})"
                    )
                fetch(checkout, files, remote=remote, branch=branch)
                _git(checkout, "read-tree", "--end-of-options", tip, env=index)
            held = history.record(files, results, commit, when)
            if all(recorded.kept for recorded in held.values()):
                for slug, recorded in held.items():
                    say(f"syncguard history: {recorded.describe(slug)}; nothing pushed")
                return held
            for path in sorted(files.iterdir()):
                blob = _git(checkout, "hash-object", "-w", "--", str(path)).stdout.strip()
                _git(checkout, "update-index", "--add", "--cacheinfo", f"100644,{blob},{path.name}", env=index)
            tree = _git(checkout, "write-tree", env=index).stdout.strip()
            message = f"syncguard history: {commit[:12]} ({', '.join(f'{s}: run {r.runs}' for s, r in held.items())})"
            parents = ["-p", tip] if tip is not None else []
            identity = {
                "GIT_AUTHOR_NAME": "syncguard",
                "GIT_AUTHOR_EMAIL": "syncguard@localhost",
                "GIT_COMMITTER_NAME": "syncguard",
                "GIT_COMMITTER_EMAIL": "syncguard@localhost",
            }
            made = _git(checkout, "commit-tree", tree, *parents, "-m", message, env=identity).stdout.strip()
            pushed = _git(
                checkout, "push", "--quiet", "--end-of-options", remote, f"{made}:{_ref(branch)}", check=False
            )
            if pushed.returncode == 0:
                say(f"{message} pushed to {remote} {branch}")
                for slug, recorded in held.items():
                    say(f"syncguard history: {recorded.describe(slug)}")
                return held
            said = (pushed.stderr or pushed.stdout).strip()
            retryable = any(w in said for w in ("rejected", "fetch first", "non-fast-forward", "cannot lock ref"))
            pause = random.uniform(0, min(PAUSE_MAX_S, PAUSE_S * 2**attempt))
            if not retryable or time.monotonic() - started + pause > within_s:
                raise BranchError(f"git push of {branch} to {remote} failed after {attempt} tries: {said[:400]}")
            say(
                f"syncguard history: {remote} {branch} moved on (another job pushed): again on its new tip in "
                f"{pause:.1f} s"
            )
            time.sleep(pause)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    raise AssertionError("unreachable")
