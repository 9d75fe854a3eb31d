"""The history in PostgreSQL (``--store postgresql://...``), against a real server started by the project's own script
(ci/postgres.sh: Debian's package, a Unix socket in a folder of its own): records at once all land, the store holds
what the branch holds file for file (so it judges the same), and a store that cannot be reached is an error naming
it, its password never shown. On CI (``CI=true``) a machine without the server fails here instead of skipping."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_syncguard.document import file as results_file
from pytest_syncguard.document.measured import MeasuredTest
from pytest_syncguard.gate import history_postgres
from pytest_syncguard.judge import history
from pytest_syncguard.judge.run import compare_run

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "h100_pr"
SLUG = "nvidia-h100-80gb-hbm3"


@pytest.fixture(scope="module")
def store() -> Iterator[str]:
    """A fresh PostgreSQL server for this module; its connection string."""
    if os.environ.get("CI") != "true":
        pytest.importorskip("psycopg")
    folder = tempfile.mkdtemp(prefix="syncguard-pg-")  # outside pytest's folders, which the server's user cannot enter
    started = subprocess.run(["bash", str(ROOT / "ci" / "postgres.sh"), "start", folder], capture_output=True,
                             text=True, timeout=120)  # fmt: skip
    if started.returncode == 3 and os.environ.get("CI") != "true":
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(started.stderr.strip())
    assert started.returncode == 0, started.stderr
    try:
        yield started.stdout.strip()
    finally:
        subprocess.run(["bash", str(ROOT / "ci" / "postgres.sh"), "stop", folder], capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def database(store: str) -> str:
    """The store, emptied for each test."""
    import psycopg

    with psycopg.connect(store) as connection:
        connection.execute(f"DROP TABLE IF EXISTS {history_postgres.TABLE}")
    return store


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> list[MeasuredTest]:
    path = tmp_path_factory.mktemp("suite") / "unchanged.json"
    path.write_bytes(gzip.decompress((DATA / "unchanged.json.gz").read_bytes()))
    return results_file.read(path)


def test_sixteen_records_at_once_all_land(tmp_path: Path, database: str) -> None:
    """16 ``history record --store`` processes started together: each waits for the store's lock, none is lost and
    none retries."""
    results = tmp_path / "run.json"
    results.write_bytes(gzip.decompress((DATA / "unchanged.json.gz").read_bytes()))
    record = [sys.executable, "-m", "pytest_syncguard.gate.cli", "history", "record", str(results), "--store", database]
    processes = [
        subprocess.Popen([*record, "--commit", f"{i + 1:040x}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
        for i in range(16)
    ]  # fmt: skip
    done = [(p, *p.communicate(timeout=280)) for p in processes]
    assert all(p.returncode == 0 for p, _, _ in done), [err for _, _, err in done if err]
    assert history_postgres.fetch(database, tmp_path / "h")
    found = history.read(tmp_path / "h", SLUG)
    assert found is not None and sorted(r.commit for r in found.runs) == [f"{i + 1:040x}" for i in range(16)]


def test_the_store_holds_what_a_folder_holds_and_judges_the_same(
    tmp_path: Path, database: str, suite: list[MeasuredTest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Segments of 3 runs, 8 runs recorded into the store and into a folder alike (a run replaced on the way): every
    file the same, byte for byte; a report's fetch reads only what it judges with, and a PR judged against either
    reads the same."""
    monkeypatch.setattr(history, "SEGMENT", 3)
    folder = tmp_path / "folder"
    folder.mkdir()
    commits = [f"{n:040x}" for n in (1, 2, 3, 4, 5, 6, 7, 8, 6)]
    for number, commit in enumerate(commits):
        when = f"2026-11-{number + 1:02d}T00:00:00Z"
        history.record(folder, suite, commit, when)
        history_postgres.record(database, suite, commit, now=lambda when=when: when, say=lambda line: None)
    every = tmp_path / "every"
    assert history_postgres.fetch(database, every, every_run=True)
    assert sorted(p.name for p in every.iterdir()) == sorted(p.name for p in folder.iterdir())
    for path in folder.iterdir():
        assert (every / path.name).read_bytes() == path.read_bytes(), path.name
    judged = tmp_path / "judged"
    assert history_postgres.fetch(database, judged)
    assert sorted(p.name for p in judged.iterdir()) == sorted(
        p.name for p in folder.iterdir() if history.judging_file(p.name)
    )
    pr = tmp_path / "pr.json"
    pr.write_bytes(gzip.decompress((DATA / "planted-item.json.gz").read_bytes()))
    against_store, against_folder = compare_run([pr], None, history=judged), compare_run([pr], None, history=folder)
    assert [(c.case.nodeid, c.comparison.status) for c in against_store.cases] == [
        (c.case.nodeid, c.comparison.status) for c in against_folder.cases
    ]
    assert against_store.with_status("regression")


def test_a_store_that_cannot_be_reached_is_named_with_its_password_hidden(tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    url = f"postgresql://syncguard:s3cret@/syncguard?host={tmp_path}"  # no server listens there
    fetched = subprocess.run([sys.executable, "-m", "pytest_syncguard.gate.cli", "history", "fetch", "--into",
                              str(tmp_path / "h"), "--store", url], capture_output=True, text=True)  # fmt: skip
    assert fetched.returncode == 2 and "cannot connect" in fetched.stderr, fetched.stderr
    assert "s3cret" not in fetched.stderr + fetched.stdout and "syncguard:***@" in fetched.stderr
    wrong = subprocess.run([sys.executable, "-m", "pytest_syncguard.gate.cli", "history", "fetch", "--into",
                            str(tmp_path / "h"), "--store", "mysql://x"], capture_output=True, text=True)  # fmt: skip
    assert wrong.returncode == 2 and "--store 'mysql://x': give a postgresql:// connection string" in wrong.stderr
