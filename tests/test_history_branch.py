"""The history branch against careless and hostile values: another branch named, a name that is an option, a branch
whose name ends like the history's, files of others on the branch, names git quotes, bytes that are no UTF-8.

Real git: a bare repository as the remote and clones as the runners."""

from __future__ import annotations

import gzip
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_syncguard.document import file as results_file
from pytest_syncguard.document.measured import MeasuredTest
from pytest_syncguard.gate import history_branch
from pytest_syncguard.judge import history

DATA = Path(__file__).parent / "data" / "h100_pr"
SLUG = "nvidia-h100-80gb-hbm3"


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> list[MeasuredTest]:
    path = tmp_path_factory.mktemp("suite") / "unchanged.json"
    path.write_bytes(gzip.decompress((DATA / "unchanged.json.gz").read_bytes()))
    return results_file.read(path)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def remote(bare_remote: Path) -> Path:
    return bare_remote


def _clone(remote: Path, into: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(remote), str(into)], check=True)
    return into


def _quiet(line: str) -> None:
    pass


def _edit_branch(remote: Path, into: Path, edit: Callable[[Path], None]) -> None:
    """A maintainer's commit on the history branch: a clone, ``edit`` of its files, a push."""
    editor = _clone(remote, into)
    _git(editor, "checkout", "-q", history_branch.BRANCH)
    edit(editor)
    _git(editor, "add", ".")
    _git(editor, "-c", "user.name=t", "-c", "user.email=t@x", "commit", "-qm", "edit")
    _git(editor, "push", "-q", "origin", history_branch.BRANCH)


def test_a_branch_that_holds_no_history_is_never_written(
    tmp_path: Path, remote: Path, suite: list[MeasuredTest]
) -> None:
    runner = _clone(remote, tmp_path / "runner")
    main_before = _git(remote, "rev-parse", "main")
    with pytest.raises(history_branch.BranchError, match="origin main exists and holds no syncguard history"):
        history_branch.push(runner, suite, "a" * 40, branch="main", say=_quiet)
    assert _git(remote, "rev-parse", "main") == main_before
    results = tmp_path / "run.json"
    results.write_bytes(gzip.decompress((DATA / "unchanged.json.gz").read_bytes()))
    done = subprocess.run([sys.executable, "-m", "pytest_syncguard.gate.cli", "history", "record", str(results),
                           "--commit", "a" * 40, "--push", "origin", "--branch", "main"], cwd=runner,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2 and "holds no syncguard history" in done.stderr, done.stderr
    assert _git(remote, "rev-parse", "main") == main_before


def test_the_branch_keeps_files_of_others_and_reads_only_history_files(
    tmp_path: Path, remote: Path, suite: list[MeasuredTest]
) -> None:
    runner = _clone(remote, tmp_path / "runner")
    history_branch.push(runner, suite, "a" * 40, say=_quiet)

    # A maintainer adds a README, a file whose name has a space and one that is no device slug.
    def edit(editor: Path) -> None:
        (editor / "README.md").write_text("the history of our GPU job\n")
        (editor / "notes on runs.txt").write_text("runner 3 was replaced\n")
        (editor / "README.jsonl").write_text("not a history\n")

    _edit_branch(remote, tmp_path / "editor", edit)
    held = history_branch.push(runner, suite, "b" * 40, say=_quiet)
    assert held[SLUG].runs == 2
    names = _git(remote, "ls-tree", "--name-only", history_branch.BRANCH).splitlines()
    assert {"README.md", '"notes on runs.txt"', "README.jsonl", f"{SLUG}.jsonl"} <= set(names) or {
        "README.md", "notes on runs.txt", "README.jsonl", f"{SLUG}.jsonl"} <= set(names)  # fmt: skip
    assert _git(remote, "show", f"{history_branch.BRANCH}:README.md") == "the history of our GPU job\n"
    pr = _clone(remote, tmp_path / "pr")
    assert history_branch.fetch(pr, pr / "h")
    assert sorted(p.name for p in (pr / "h").iterdir()) == [
        f"{SLUG}.details.json",
        f"{SLUG}.jsonl",
        f"{SLUG}.latest.json",
    ]
    found = history.read(pr / "h", SLUG)
    assert found is not None and len(found.runs) == 2


@pytest.mark.parametrize("option", ["--upload-pack=touch pwned", "--receive-pack=touch pwned", "-oops"])
def test_a_remote_or_branch_that_is_an_option_never_reaches_git_as_one(
    tmp_path: Path, remote: Path, suite: list[MeasuredTest], option: str
) -> None:
    runner = _clone(remote, tmp_path / "runner")
    with pytest.raises(history_branch.BranchError, match="not a git"):
        history_branch.push(runner, suite, "a" * 40, remote=option, say=_quiet)
    with pytest.raises(history_branch.BranchError, match="not a git"):
        history_branch.fetch(runner, tmp_path / "h", remote=option)
    with pytest.raises(history_branch.BranchError, match="not a git"):
        history_branch.push(runner, suite, "a" * 40, branch=option, say=_quiet)
    assert not (runner / "pwned").exists() and not (tmp_path / "pwned").exists()
    cli = [sys.executable, "-m", "pytest_syncguard.gate.cli", "history", "fetch", "--into", "h", f"--remote={option}"]
    done = subprocess.run(cli, cwd=runner, capture_output=True, text=True)
    assert done.returncode == 2 and "not a git" in done.stderr and "Traceback" not in done.stderr
    assert not (runner / "pwned").exists()


def test_a_branch_whose_name_ends_like_the_history_is_not_it(
    tmp_path: Path, remote: Path, suite: list[MeasuredTest]
) -> None:
    runner = _clone(remote, tmp_path / "runner")
    history_branch.push(runner, suite, "a" * 40, branch=f"feature/{history_branch.BRANCH}", say=_quiet)
    pr = _clone(remote, tmp_path / "pr")
    assert not history_branch.fetch(pr, pr / "h")  # the history branch itself does not exist yet
    assert history_branch.fetch(pr, pr / "f", branch=f"feature/{history_branch.BRANCH}")


def test_a_history_file_that_is_not_utf8_is_an_error_naming_it(
    tmp_path: Path, remote: Path, suite: list[MeasuredTest]
) -> None:
    runner = _clone(remote, tmp_path / "runner")
    history_branch.push(runner, suite, "a" * 40, say=_quiet)

    def edit(editor: Path) -> None:
        with (editor / f"{SLUG}.jsonl").open("ab") as file:
            file.write(b'{"commit": "\xff\xfe"}\n')

    _edit_branch(remote, tmp_path / "editor", edit)
    pr = _clone(remote, tmp_path / "pr")
    assert history_branch.fetch(pr, pr / "h")
    with pytest.raises(history.HistoryError, match=f"{SLUG}.jsonl: not readable"):
        history.read(pr / "h", SLUG)


def test_ten_pushes_at_once_all_land(tmp_path: Path, remote: Path) -> None:
    """10 ``history record --push`` processes started together against one bare remote: each rejected push tries
    again on the new tip after a jittered, growing pause (before: 5 retries with no pause, and 2 of 8 were lost)."""
    results = tmp_path / "run.json"
    results.write_bytes(gzip.decompress((DATA / "unchanged.json.gz").read_bytes()))
    runners = [_clone(remote, tmp_path / f"runner{i}") for i in range(10)]
    record = [sys.executable, "-m", "pytest_syncguard.gate.cli", "history", "record", str(results), "--push", "origin"]
    processes = [
        subprocess.Popen([*record, "--commit", f"{i + 1:040x}"], cwd=runner, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for i, runner in enumerate(runners)
    ]  # fmt: skip
    done = [(p.returncode, *p.communicate(timeout=280)) for p in processes]
    assert all(p.returncode == 0 for p in processes), [err for _, _, err in done if err]
    pr = _clone(remote, tmp_path / "pr")
    assert history_branch.fetch(pr, pr / "h")
    found = history.read(pr / "h", SLUG)
    assert found is not None and sorted(r.commit for r in found.runs) == [f"{i + 1:040x}" for i in range(10)]
    log = _git(remote, "log", "--format=%s", history_branch.BRANCH).splitlines()
    assert len(log) == 10


def test_closed_segments_go_onto_the_branch_once_and_a_report_fetches_only_what_it_reads(
    tmp_path: Path, remote: Path, suite: list[MeasuredTest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Segments of 2 runs, 5 pushes: the branch holds 2 closed segments beside the open one and the checkpoint; a
    report's fetch copies the checkpoint, open segment and details only, the page's every run."""
    monkeypatch.setattr(history, "SEGMENT", 2)
    runner = _clone(remote, tmp_path / "runner")
    for push in range(5):
        history_branch.push(runner, suite, f"{push + 1:040x}", remote="origin", say=_quiet)
    names = _git(remote, "ls-tree", "--name-only", history_branch.BRANCH).split()
    closed = [f"{SLUG}.000000.jsonl", f"{SLUG}.000002.jsonl"]
    judging = [f"{SLUG}.jsonl", f"{SLUG}.state.json", f"{SLUG}.latest.json", f"{SLUG}.details.json"]
    assert sorted(names) == sorted([*closed, *judging])
    first_closed = _git(remote, "log", "--format=%s", history_branch.BRANCH, "--", closed[0]).splitlines()
    assert len(first_closed) == 1  # written by the push that closed it, never again
    tip = _git(remote, "rev-parse", history_branch.BRANCH)
    said: list[str] = []
    again = history_branch.push(runner, suite, f"{4:040x}", remote="origin", say=said.append)  # in a closed segment
    assert again[SLUG].kept and _git(remote, "rev-parse", history_branch.BRANCH) == tip
    assert said == [f"syncguard history: {again[SLUG].describe(SLUG)}; nothing pushed"], said
    pr = _clone(remote, tmp_path / "pr")
    assert history_branch.fetch(pr, pr / "window")
    assert sorted(p.name for p in (pr / "window").iterdir()) == sorted(judging)
    assert history_branch.fetch(pr, pr / "all", every_run=True)
    whole = history.read(pr / "all", SLUG, every_run=True)
    window = history.read(pr / "window", SLUG)
    assert whole is not None and window is not None and whole.count == window.count == 5
    assert [r.commit for r in whole.runs] == [f"{n + 1:040x}" for n in range(5)]
    assert history.levels(window).baseline.tests == history.levels(whole).baseline.tests


@pytest.mark.parametrize(
    ("where", "cloned"), [(history_branch.BRANCH, True), ("refs/syncguard/history", False)], ids=["branch", "outside"]
)
def test_a_history_outside_the_branches_is_judged_alike_and_not_cloned(
    tmp_path: Path, remote: Path, suite: list[MeasuredTest], where: str, cloned: bool
) -> None:
    """``--branch refs/syncguard/history``: pushed and fetched as the branch is, but a developer's ``git clone`` does
    not download it (the branch's every commit comes with a clone: git clone fetches refs/heads/*)."""
    runner = _clone(remote, tmp_path / "runner")
    for push in range(3):
        history_branch.push(runner, suite, f"{push + 1:040x}", remote="origin", branch=where, say=_quiet)
    pr = _clone(remote, tmp_path / "pr")
    assert history_branch.fetch(pr, pr / "h", branch=where)
    found = history.read(pr / "h", SLUG)
    assert found is not None and len(found.runs) == 3
    ref = where if where.startswith("refs/") else f"refs/heads/{where}"
    tip = _git(remote, "rev-parse", ref).strip()
    developer = tmp_path / "developer"  # over git's transport, as from a server (a local clone copies every object)
    subprocess.run(["git", "clone", "-q", "--no-local", str(remote), str(developer)], check=True)
    held = subprocess.run(["git", "-C", str(developer), "cat-file", "-e", tip], capture_output=True)
    assert (held.returncode == 0) == cloned
    for wrong in ("refs/heads/x", "refs/syncguard/", "refs/syncguard/a b", "refs/tags/v1"):
        with pytest.raises(history_branch.BranchError, match="not a branch name"):
            history_branch.fetch(pr, pr / "w", branch=wrong)
