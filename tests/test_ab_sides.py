"""A warm side of ``syncguard ab``: one real pytest process, run turn after turn through its channel."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_syncguard.gate.ab.sides import ABError, WarmSide

#: The A/Bs and sides these tests start are forked from the suite's warm server (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("warm_executable")


CONFTEST = """
import os
from pathlib import Path

import pytest
import torch


def note(line):
    with Path(os.environ["AB_FIXTURES"]).open("a") as log:
        log.write(line + "\\n")


@pytest.fixture(scope="session")
def weights():
    note("session up")
    yield torch.ones(4, device="cuda" if torch.cuda.is_available() else "cpu")  # on CUDA a CPU read is no sync
    note("session down")
"""

MODULE = """
import pytest

from conftest import note


@pytest.fixture(scope="module")
def table(weights):
    note("module up")
    yield weights * 2
    note("module down")


@pytest.fixture
def scratch():
    note("function up")
    yield
    note("function down")


def test_reads(syncguard, table, scratch):
    def loop():
        note("run")
        return [float(table.sum()) for _ in range(3)]

    syncguard.measure(loop, tokens=3, repeat=2)


def test_free(syncguard, table):
    syncguard.measure(lambda: table + 1, tokens=1, repeat=2)
"""

OTHER = """
def test_other(syncguard, weights):
    syncguard.measure(lambda: weights.sum().item(), tokens=1, repeat=2)
"""


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "side"
    folder.mkdir()
    (folder / "test_mod.py").write_text(MODULE)
    (folder / "conftest.py").write_text(CONFTEST)
    (folder / "test_other.py").write_text(OTHER)
    monkeypatch.setenv("AB_FIXTURES", str(tmp_path / "fixtures.log"))
    monkeypatch.setenv("SYNCGUARD_NATIVE", "0")
    return folder


def test_a_warm_side_runs_each_turn_afresh_in_one_process_and_keeps_its_session(checkout: Path, tmp_path: Path) -> None:
    """Three turns, the second without one test: each turn's results hold what it ran, measured afresh (the same
    syncs each time, not added up); the session fixture is set up once for all, the function fixture once per run,
    every fixture torn down by the end; --junitxml gives each run its own properties."""
    out, junit = tmp_path / "out", tmp_path / "side.xml"
    out.mkdir()
    side = WarmSide("head", checkout, ["-q", "--junitxml", str(junit)], out)
    try:
        collected = side.ready(120)
        first = side.run("round1-head", [], 120)
        second = side.run("round2-head", ["test_other.py::test_other"], 120)
        third = side.run("round3-head", [], 120)
    finally:
        side.finish()
    assert side.process.returncode == 0
    assert collected == ["test_mod.py::test_reads", "test_mod.py::test_free", "test_other.py::test_other"]
    assert set(first) == set(third) == set(collected)
    assert set(second) == {"test_mod.py::test_reads", "test_mod.py::test_free"}
    assert [turn["test_mod.py::test_reads"].syncs for turn in (first, second, third)] == [3, 3, 3]
    assert first["test_other.py::test_other"].syncs == third["test_other.py::test_other"].syncs == 1
    notes = (tmp_path / "fixtures.log").read_text().split("\n")
    assert notes.count("session up") == notes.count("session down") == 1
    assert notes.count("function up") == notes.count("function down") == 3
    assert notes.count("module up") == notes.count("module down") >= 1
    cases = [c for c in ET.parse(junit).getroot().iter("testcase") if c.get("name") == "test_reads"]
    assert len(cases) == 3
    for case in cases:
        names = [p.get("name") for p in case.iter("property")]
        assert names.count("syncguard.nodeid") == 1, names


def test_a_held_test_is_called_again_warm_with_its_fixtures_kept_until_the_next_is_asked_for(
    checkout: Path, tmp_path: Path
) -> None:
    """A held test is set up, warmed up and measured once; each replay is its call alone, measured afresh with no
    warm-up and no fixture set up again; it is torn down when the next test is held; a replay of a test no longer
    held measures nothing."""
    out = tmp_path / "out"
    out.mkdir()
    side = WarmSide("head", checkout, ["-q"], out)
    try:
        side.ready(120)
        held = side.hold("t1-round1-head", "test_mod.py::test_reads", 120)
        again = [side.replay(f"t1-round{n}-head", "test_mod.py::test_reads", 120, repeat=0) for n in (2, 3)]
        other = side.hold("t2-round1-head", "test_other.py::test_other", 120)
        gone = side.replay("t1-round4-head", "test_mod.py::test_reads", 120)
    finally:
        side.finish()
    assert side.process.returncode == 0 and side.can_hold
    assert [r["test_mod.py::test_reads"].syncs for r in (held, *again)] == [3, 3, 3]  # afresh, not added up
    assert set(other) == {"test_other.py::test_other"} and gone == {}
    notes = [n for n in (tmp_path / "fixtures.log").read_text().split("\n") if n]
    reads = notes[notes.index("function up") : notes.index("function down") + 1]
    # The hold: its warm-up, the counting run and 2 timed runs; each replay (--syncguard-repeat 0): one run.
    assert reads == ["function up", *["run"] * 4, "run", "run", "function down"]
    assert notes.count("session up") == notes.count("module up") == 1


def test_a_warm_side_that_cannot_collect_names_itself_and_its_log(checkout: Path, tmp_path: Path) -> None:
    (checkout / "test_broken.py").write_text("def test_(:\n")
    out = tmp_path / "out"
    out.mkdir()
    side = WarmSide("base", checkout, ["-q"], out)
    try:
        with pytest.raises(ABError, match=r"start: the base's pytest exited 2: E   SyntaxError: .*log: .*base\.log"):
            side.ready(120)
    finally:
        side.end()
    assert "SyntaxError" in (out / "base.log").read_text()
    with pytest.raises(ProcessLookupError):
        os.kill(side.process.pid, 0)


@pytest.mark.parametrize(
    ("value", "message"),
    [("abc", "give two file descriptors, READ,WRITE"), ("97,98", "file descriptor 97 is not open")],
)
def test_a_side_option_that_names_no_channel_is_a_usage_error_naming_it(
    checkout: Path, value: str, message: str
) -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", f"--syncguard-ab-worker={value}", "-q", "-p",
                           "no:cacheprovider"], cwd=checkout, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 4, done.stdout + done.stderr
    assert f"--syncguard-ab-worker {value!r}: {message}" in done.stderr


STUCK = """
import time

import pytest


@pytest.fixture
def slow_to_leave():
    yield
    time.sleep(300)  # a teardown that never ends in time


def test_stuck(syncguard, slow_to_leave):
    syncguard.measure(lambda: None, tokens=1, repeat=1)
"""


def test_a_side_that_does_not_end_when_told_is_ended_with_its_stacks_written(checkout: Path, tmp_path: Path) -> None:
    """Told to stop, a side whose teardown hangs is given until the deadline, then asked for every thread's Python
    stack (SIGUSR2, its faulthandler) and ended: the A/B says so, naming the file, which shows where it hung."""
    (checkout / "test_stuck.py").write_text(STUCK)
    out = tmp_path / "out"
    out.mkdir()
    side = WarmSide("base-2", checkout, ["-q", "test_stuck.py"], out)
    try:
        side.ready(120)
        side.hold("t1-round1-base-2", "test_stuck.py::test_stuck", 120)
        side.tell_to_stop()
        said = side.finish(time.monotonic() + 3)
    finally:
        side.end()
    assert side.process.returncode is not None
    assert said == f"the base-2's pytest did not end when told (its stacks: {out / 'base-2.stacks.txt'})"
    stacks = (out / "base-2.stacks.txt").read_text()
    assert 'test_stuck.py", line 10 in slow_to_leave' in stacks, stacks
