"""The bad inputs and misuse a careful user tries: each gives a clear error naming what is at fault, or the right
behaviour; no budget passes without measuring, and the other tests' results are never lost."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest
import torch

from pytest_syncguard.files import write_atomically
from pytest_syncguard.gate.cli import main
from pytest_syncguard.guard import SyncGuard
from pytest_syncguard.probes import native
from pytest_syncguard.probes.syncs import PROBE, SyncRecorder

READS = """
import pytest, torch

def reads(n):
    for _ in range(n):
        torch.ones(1).sum().item()
"""


def test_every_copy_of_a_budget_marker_holds_and_the_strictest_wins(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        READS
        + """
pytestmark = pytest.mark.max_syncs(2)

@pytest.mark.max_syncs("garbage")
@pytest.mark.max_syncs(100)
def test_invalid_copy(syncguard):
    reads(1)

@pytest.mark.max_syncs(1)
@pytest.mark.max_syncs(100)
def test_strictest_of_two(syncguard):
    reads(1)
    reads(3)

@pytest.mark.max_syncs(10)
def test_module_budget_is_not_loosened(syncguard):
    reads(3)

class TestClassLevel:
    pytestmark = pytest.mark.max_syncs(1)

    @pytest.mark.max_syncs(5)
    def test_class_budget_holds(self, syncguard):
        reads(2)

@pytest.mark.parametrize("n", [pytest.param(1, marks=pytest.mark.max_syncs(0)), 2])
def test_param_marks(syncguard, n):
    reads(n)
"""
    )
    result = pytester.runpytest("--syncguard")
    result.assert_outcomes(errors=1, failed=4, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_invalid_copy*@pytest.mark.max_syncs: limit must be a finite number >= 0, got 'garbage'*",
            "*max_syncs: limit 1, measured 4 syncs*",
            "*max_syncs: limit 2, measured 3 syncs*",
            "*max_syncs: limit 1, measured 2 syncs*",
            "*max_syncs: limit 0, measured 1 sync*",
        ]
    )


LEAKS = (
    READS
    + """
held = []

def test_leaves_allow_open(syncguard):
    def intended():
        with syncguard.allow():
            yield
    generator = intended()
    next(generator)
    held.append(generator)

def test_leaves_a_region_open(syncguard):
    def measured():
        with syncguard.generation(tokens=1):
            yield
    generator = measured()
    next(generator)
    held.append(generator)

@pytest.mark.max_syncs(0)
def test_later(syncguard):
    with syncguard.generation(tokens=1):
        reads(3)
"""
)


def test_nothing_a_test_leaves_open_reaches_the_next_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(LEAKS)
    result = pytester.runpytest("--syncguard", "-p", "no:randomly")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(
        [
            "*test_leaves_allow_open*left 1 syncguard.allow() block(s) open after its call*",
            "*test_leaves_a_region_open*left 1 measured region(s) of syncguard.generation()/measure() open*",
            "*max_syncs: limit 0, measured 3 syncs*",
        ]
    )
    alone = pytester.runpytest("--syncguard", "-k", "test_later")
    alone.assert_outcomes(failed=1)
    alone.stdout.fnmatch_lines(["*max_syncs: limit 0, measured 3 syncs*"])
    assert not PROBE.installed and PROBE.left_open() == (0, 0)


def test_nested_regions_count_once(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        READS
        + """
@pytest.mark.max_syncs(4)
@pytest.mark.max_syncs_per_token(1)
def test_nested(syncguard):
    with syncguard.generation(tokens=4) as outer:
        reads(2)
        with syncguard.generation(tokens=2) as inner:
            reads(2)
        syncguard.measure(lambda: reads(1), tokens=1, repeat=2, warmup=0)
    assert (outer.syncs, outer.tokens, inner.syncs, inner.tokens) == (7, 4, 2, 2)
    assert (len(syncguard.measurements), syncguard.last.syncs) == (1, 7)
"""
    )
    result = pytester.runpytest("--syncguard")
    result.assert_outcomes(failed=1)
    # 7 real syncs over 4 tokens (measure(repeat=2) runs three times: its operator-counting run, then two timed
    # runs): before, the inner region and the measure() runs were added again.
    result.stdout.fnmatch_lines(
        ["*limit 1.00 per token, measured 1.75: 7 syncs over 4 tokens", "*max_syncs: limit 4, measured 7 syncs*"]
    )


def _read_twice() -> None:
    torch.ones(1).sum().item()
    torch.ones(1).sum().item()


@pytest.mark.parametrize("kernel", ["native", "python"])
def test_threads_count_per_process_and_allow_per_thread(kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if kernel == "native" and native.NATIVE.load() is None:
        pytest.skip(f"native kernels unavailable: {native.NATIVE.unavailable}")
    if kernel == "python":
        monkeypatch.setattr(native.NATIVE, "_module", None)
    recorder = SyncRecorder(on_device=False)
    inside = threading.Event()
    release = threading.Event()

    def allowing_thread() -> None:
        with PROBE.allowing():
            inside.set()
            release.wait(10)
            _read_twice()  # its own allow() excuses these

    worker = threading.Thread(target=allowing_thread)
    with PROBE.recording(recorder):
        worker.start()
        inside.wait(10)
        _read_twice()  # another thread's allow() excuses nothing here
        other = threading.Thread(target=_read_twice)  # a thread without allow(): counted in the region
        other.start()
        other.join()
        release.set()
        worker.join()
    assert [e.allowed for e in recorder.events] == [False] * 4 + [True] * 2
    assert recorder.syncs == 4


def test_a_marker_added_by_a_fixture_counts_and_one_added_too_late_is_an_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        READS
        + """
@pytest.fixture
def zero_budget(request):
    request.node.add_marker(pytest.mark.max_syncs(0))

def test_fixture_budget(zero_budget, syncguard):
    reads(2)

def test_late_budget(request, syncguard):
    reads(2)
    request.node.add_marker(pytest.mark.max_syncs(0))
"""
    )
    result = pytester.runpytest("--syncguard")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        ["*max_syncs: limit 0, measured 2 syncs*", "*a budget marker was added during the test's call*"]
    )


FAILING = (
    READS
    + """
@pytest.mark.max_syncs(10)
def test_fails_inside(syncguard):
    with syncguard.generation(tokens=1):
        reads(2)
        assert False, "the loop broke"

@pytest.mark.max_syncs(10)
def test_fails_before(syncguard):
    raise RuntimeError("before the region")
    with syncguard.generation(tokens=1):
        reads(4)

@pytest.mark.max_syncs(10)
def test_skips(syncguard):
    reads(1)
    pytest.skip("not today")

@pytest.mark.max_syncs(10)
def test_passes(syncguard):
    reads(4)
"""
)


def test_failed_tests_never_enter_a_baseline(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(FAILING)
    result = pytester.runpytest("--syncguard", "--syncguard-update-baselines", "--junitxml=run.xml")
    result.assert_outcomes(failed=2, passed=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*test_fails_before*FAILED",
            "*test_fails_inside*FAILED",
            "*test_skips*SKIPPED",
            "*not recorded in the baselines (failed: its numbers are partial): *test_fails_before",
            "*wrote 1 baseline entry to*cpu.json",
        ]
    )
    entries = json.loads((pytester.path / "baselines" / "cpu.json").read_text())["tests"]
    assert list(entries) == ["test_failed_tests_never_enter_a_baseline.py::test_passes"]
    # syncguard report does not compare them either.
    report = pytester.path / "report.json"
    assert main(["report", str(pytester.path / "run.xml"), "--baselines", "baselines", "--json", str(report)]) == 0
    statuses = {
        t["nodeid"].partition("::")[2]: t["comparison"]["status"] for t in json.loads(report.read_text())["tests"]
    }
    assert statuses == {
        "test_fails_inside": "not compared", "test_fails_before": "not compared", "test_skips": "not compared",
        "test_passes": "unchanged",
    }  # fmt: skip
    # Fixed, the tests are new, never regressions against a partial count.
    pytester.makepyfile(
        FAILING.replace('assert False, "the loop broke"', "pass").replace("raise RuntimeError", "print")
    )
    again = pytester.runpytest("--syncguard", "-k", "fails")
    again.assert_outcomes(passed=2)
    again.stdout.fnmatch_lines(["new (no baseline entry): *"])
    assert "REGRESSION" not in again.stdout.str()


def test_compile_syncs_are_labelled_and_not_counted(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
import pytest, torch

def head(x, n):
    return x[: int(n)] * 2

@pytest.mark.max_syncs(0)
def test_compiled(syncguard):
    step = torch.compile(head, backend="eager")
    with syncguard.generation(tokens=1) as region:
        step(torch.ones(5), torch.tensor(3))
    torch.testing.assert_close(step(torch.ones(5), torch.tensor(3)), torch.full((3,), 2.0))
"""
    )
    # In a subprocess: an in-process run would unload the torch.compile modules it imported, and importing them
    # again in this process fails.
    result = pytester.runpytest_subprocess("--syncguard")
    result.assert_outcomes(failed=1)
    # The graph break's int(n) is the loop's own sync; dynamo's reads of n while it compiled are not.
    result.stdout.fnmatch_lines(
        [
            "*max_syncs: limit 0, measured 1 sync*",
            "*1 x scalar read (aten::_local_scalar_dense) at test_compile_syncs_are_labelled_and_not_counted.py:4 in head: *",
            "*made by torch.compile while it compiled (its first call), not counted: *",
        ]
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--syncguard-json", "."], "--syncguard-json .: . is a folder"),
        (["--syncguard-json", "a_file/out.json"], "--syncguard-json a_file/out.json: a_file is not a folder"),
        (["--syncguard-artifacts", "a_file"], "--syncguard-artifacts a_file: a_file exists and is not a folder"),
        (
            ["--syncguard-update-baselines", "--syncguard-baselines", "a_file/sub"],
            "*--syncguard-baselines (with --syncguard-update-baselines): *a_file is not a folder",
        ),
    ],
)
def test_unusable_paths_are_usage_errors_before_any_test(
    pytester: pytest.Pytester, options: list[str], message: str
) -> None:
    pytester.makefile(".txt", a_file="not a folder")
    pytester.path.joinpath("a_file.txt").rename(pytester.path / "a_file")
    pytester.makepyfile(READS + "\ndef test_x(syncguard):\n    reads(1)\n")
    result = pytester.runpytest("--syncguard", *options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])


def test_a_folder_that_breaks_during_the_run_is_reported_not_a_crash(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        READS
        + """
from pathlib import Path

@pytest.mark.max_syncs(0)
def test_breaks_the_folders(syncguard):
    from pytest_syncguard.files import lock_path

    lock_path(Path("baselines/cpu.json")).mkdir()  # the lock cannot be taken
    Path("kept").write_text("now a file")
    Path("out").write_text("now a file")
    reads(2)
"""
    )
    result = pytester.runpytest(
        "--syncguard", "--syncguard-update-baselines", "--syncguard-artifacts", "kept",
        "--syncguard-json", "out/results.json",
    )  # fmt: skip
    from pytest_syncguard.files import lock_path

    lock_path(pytester.path / "baselines" / "cpu.json").rmdir()
    result.assert_outcomes(failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*max_syncs: limit 0, measured 2 syncs*",  # the budget failure, not a FileExistsError
            "*test_breaks_the_folders*FAIL",
            "*results NOT written to out/results.json*",
            "*baselines NOT updated: *cpu.json: cannot write the baseline file*",
        ]
    )
    assert "Traceback" not in result.stdout.str() and "INTERNALERROR" not in result.stdout.str()


def test_a_baseline_that_is_not_utf8_is_an_error_naming_it(pytester: pytest.Pytester) -> None:
    (pytester.path / "baselines").mkdir()
    (pytester.path / "baselines" / "cpu.json").write_bytes(b'{"schema": "\xff\xfe"}')
    pytester.makepyfile(READS + "\ndef test_x(syncguard):\n    reads(1)\n")
    result = pytester.runpytest("--syncguard")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*baselines/cpu.json: not UTF-8 text*", "*test_x*ERROR"])


@pytest.mark.parametrize(
    ("limit", "message"),
    [("10**400", "got 1000000000"), ("float('nan')", "got nan"), ("True", "got True")],
)
def test_limits_that_are_no_finite_number_are_usage_errors(pytester: pytest.Pytester, limit: str, message: str) -> None:
    pytester.makepyfile(READS + f"\n@pytest.mark.max_syncs({limit})\ndef test_x(syncguard):\n    reads(1)\n")
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*test_x: @pytest.mark.max_syncs: limit must be a finite number >= 0, {message}*"])
    assert "OverflowError" not in result.stdout.str()


def test_keyboard_interrupt_in_a_region_says_so(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        READS
        + """
@pytest.mark.max_syncs(1)
def test_interrupted(syncguard):
    with syncguard.generation(tokens=1):
        reads(1)
        raise KeyboardInterrupt
"""
    )
    result = pytester.runpytest_subprocess("--syncguard")  # in-process, the interrupt would end this run too
    result.stdout.fnmatch_lines(["*the run was interrupted (KeyboardInterrupt): no measured test finished before it"])
    assert "no test was measured" not in result.stdout.str()
    assert not PROBE.installed and PROBE.left_open() == (0, 0)


@pytest.mark.parametrize(("umask", "existing", "expected"), [(0o022, None, 0o644), (0o077, None, 0o600),
                                                             (0o077, 0o644, 0o644), (0o022, 0o664, 0o664)])  # fmt: skip
def test_rewritten_files_keep_their_mode_and_new_ones_honour_the_umask(
    tmp_path: Path, umask: int, existing: int | None, expected: int
) -> None:
    path = tmp_path / "baseline.json"
    if existing is not None:
        path.write_text("old")
        path.chmod(existing)
    saved = os.umask(umask)
    try:
        write_atomically(path, "new")
    finally:
        os.umask(saved)
    assert (path.read_text(), stat.S_IMODE(path.stat().st_mode)) == ("new", expected)


def test_a_region_left_open_is_closed_by_abandon() -> None:
    guard = SyncGuard("t", device="cpu")
    region = guard.generation(tokens=1)
    region.__enter__()
    assert PROBE.installed
    assert guard.abandon_open_regions() == 1
    assert not PROBE.installed and guard.measurements == []
    region.__exit__(None, None, None)  # closed later (the garbage collector): changes nothing
    assert not PROBE.installed


def test_step_marks_belong_inside_a_region_and_cost_nothing_without_a_capture() -> None:
    guard = SyncGuard("steps", device="cpu")
    with pytest.raises(Exception, match=r"syncguard.step\(\) is called inside"):
        guard.step()
    with guard.generation(tokens=3) as region:
        for _ in range(3):
            guard.step()  # the innermost open region's step
        region.step()
    assert region.marked_steps == 4
    with pytest.raises(Exception, match=r"region.step\(\) is called inside"):
        region.step()


def test_gap_ops_never_reruns_a_test_whose_timeline_was_not_measured(pytester: pytest.Pytester) -> None:
    """On a machine without CUDA a timeline budget is not measured (failed with --syncguard-require-gpu): there
    is nothing to diagnose, and the test is run once."""
    pytester.makepyfile(
        """
import pytest

RUNS = []

@pytest.mark.max_gpu_idle_us(10)
def test_idle(syncguard):
    RUNS.append(1)
    with syncguard.generation(tokens=1):
        pass
    assert len(RUNS) == 1
"""
    )
    result = pytester.runpytest_subprocess(
        "--syncguard", "--syncguard-require-gpu", "--syncguard-gap-ops", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*max_gpu_idle_us: not measured*"])
    assert "diagnostic rerun" not in result.stdout.str() and "no diagnosis" not in result.stdout.str()


MISUSES = """
import pytest
import torch


@pytest.mark.max_syncs_per_token(1)
def test_raises_after_forward_calls(syncguard):
    model = torch.nn.Linear(4, 4)
    with syncguard.generation(model=model):
        for _ in range(8):
            model(torch.ones(1, 4))
        raise RuntimeError("the loop's own error")


@pytest.mark.max_syncs_per_token(1)
def test_model_never_called(syncguard):
    with syncguard.generation(model=torch.nn.Linear(4, 4)):
        torch.ones(1).sum().item()


def test_tokens_not_an_int(syncguard):
    with syncguard.generation(tokens=2.5):
        pass


def test_negative_region_tokens(syncguard):
    with syncguard.generation() as region:
        region.tokens = -5


def test_repeat_zero(syncguard):
    syncguard.measure(lambda: None, tokens=1, repeat=0)


def test_step_outside_a_region(syncguard):
    syncguard.step()


def test_entered_twice(syncguard):
    region = syncguard.generation(tokens=1)
    with region:
        pass
    with region:
        pass
"""


def test_misuse_of_the_fixture_is_one_clean_line_at_the_tests_own_line(pytester: pytest.Pytester) -> None:
    """Misuse showed tracebacks through contextlib (and re-entering a region an AttributeError of contextlib's); a
    model never called read "region.tokens must be a positive int, got 0"; an exception inside a region after
    8 forward calls read "needs a token count". Each misuse is now one line naming the test's line, and a
    region that raised is judged on the tokens it counted."""
    pytester.makepyfile(test_uses=MISUSES)
    result = pytester.runpytest()
    result.assert_outcomes(failed=7)
    result.stdout.fnmatch_lines([
        "test_uses.py:16: test_uses.py::test_model_never_called: syncguard.generation(model=...): 0 forward "
        "calls of the model you passed (Linear) in the region: call that model in it, or pass tokens=",
        "test_uses.py:21: test_uses.py::test_tokens_not_an_int: syncguard.generation(): tokens must be a "
        "positive int, got 2.5",
        "test_uses.py:26: test_uses.py::test_negative_region_tokens: region.tokens: tokens must be a positive "
        "int, got -5",
        "test_uses.py:31: test_uses.py::test_repeat_zero: syncguard.measure(): repeat must be an int >= 1, got 0",
        "test_uses.py:35: test_uses.py::test_step_outside_a_region: syncguard.step() is called inside "
        "syncguard.generation() or syncguard.measure()",
        "test_uses.py:42: test_uses.py::test_entered_twice: a syncguard.generation() region is entered once: "
        "call syncguard.generation() again for another region",
    ])  # fmt: skip
    output = result.stdout.str()
    assert "contextlib" not in output and "AttributeError" not in output
    assert "needs a token count" not in output  # the raising region counted its 8 tokens
    assert "RuntimeError: the loop's own error" in output


def test_a_second_threads_region_is_refused_and_fails_the_test(pytester: pytest.Pytester) -> None:
    """Thread B opened a region while thread A's was open and ran 8 reads after A's closed: 2 syncs were judged
    against max_syncs(5), the test passed, and B's 8 were never judged. B's region is refused, and since B's
    exception may never reach the test, the test fails on it."""
    pytester.makepyfile(
        test_threads="""
import threading
import pytest
import torch


def loop(n):
    x = torch.ones(4)
    for _ in range(n):
        x = x * 1.0
        x.sum().item()


@pytest.mark.max_syncs(5)
def test_two_threads(syncguard):
    a_open = threading.Event()

    def a():
        with syncguard.generation(tokens=2):
            loop(2)
            a_open.set()
            b_thread.join(5)

    def b():
        a_open.wait(5)
        try:
            with syncguard.generation(tokens=8):
                loop(8)
        except Exception:
            pass  # the thread swallows it: the test must fail all the same

    b_thread = threading.Thread(target=b, name="B")
    a_thread = threading.Thread(target=a, name="A")
    b_thread.start(); a_thread.start(); a_thread.join(); b_thread.join()
"""
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*a region opened in thread B while another thread's region was open*"])


@pytest.mark.parametrize("workers", [[], ["-p", "xdist", "-n", "2"]], ids=["serial", "xdist"])
def test_a_baseline_update_that_cannot_write_never_reads_updated(pytester: pytest.Pytester, workers: list[str]) -> None:
    """The file cannot be written (here its lock cannot be taken; a full disk fails the same write): no row of its
    tests reads "updated" above the footer that says "NOT updated"."""
    from pytest_syncguard.files import lock_path

    pytester.makepyfile(READS + "\ndef test_a(syncguard):\n    reads(1)\n\ndef test_b(syncguard):\n    reads(2)\n")
    (pytester.path / "baselines").mkdir()
    lock = lock_path(pytester.path / "baselines" / "cpu.json")
    lock.mkdir()
    try:
        result = pytester.runpytest_subprocess("--syncguard", "--syncguard-update-baselines", *workers)
    finally:
        lock.rmdir()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    rows = [line for line in result.stdout.lines if "::test_" in line and " cpu " in line]
    assert len(rows) == 2 and all(" NOT updated " in row for row in rows), rows
    result.stdout.fnmatch_lines(["*baselines NOT updated: *cpu.json: cannot write the baseline file*"])
    assert not (pytester.path / "baselines" / "cpu.json").exists()
