"""The CUDA-graph health signal on the CPU: its counts are 0 where nothing records a graph, its budgets are "not
measured" there as the other CUDA budgets are, and a skip inductor reports (through its own function, the one its
compiler calls) is counted from inductor's counter and named by its message and call site. The device side (real
captures, a compiled loop that re-records or skips) is tests/test_gpu_graphs.py."""

from __future__ import annotations

import logging

import pytest
import torch

from pytest_syncguard import SyncGuard
from pytest_syncguard.budgets import check_budgets
from pytest_syncguard.document.budget import Budget
from pytest_syncguard.probes.graphs import SKIP_LOG
from pytest_syncguard.signals import BY_NAME, COUNTERS, KINDS


def test_a_region_that_records_no_graph_counts_zero_and_its_budgets_are_not_measured_on_cpu() -> None:
    guard = SyncGuard("t", device="cpu")
    with guard.generation(tokens=4):
        for _ in range(4):
            torch.ones(8).add_(1)
    measurement = guard.measurements[0]
    assert (measurement.count("graph_recordings"), measurement.count("graph_skips")) == (0, 0)
    budgets = [Budget("max_graph_recordings", 0.0), Budget("no_graph_skips", 0.0)]
    checks, error = check_budgets("t", budgets, measurement, require_gpu=False)
    assert error is None
    assert [(c.held, c.text) for c in checks] == [
        (None, "max_graph_recordings: not measured: needs CUDA; ran on cpu"),
        (None, "no_graph_skips: not measured: needs CUDA; ran on cpu"),
    ]


def test_a_skip_is_inductors_count_named_by_its_message_and_the_call_site() -> None:
    from torch._dynamo.utils import counters
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    before = counters["inductor"]["cudagraph_skips"]
    guard = SyncGuard("t", device="cpu")
    with guard.generation(tokens=1):
        log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to cpu device (arg1_1)")  # the call site
        counters["inductor"]["cudagraph_skips"] += 1  # inductor's count of a graph with no CUDA input: no message
    line = test_a_skip_is_inductors_count_named_by_its_message_and_the_call_site.__code__.co_firstlineno + 7
    measurement = guard.measurements[0]
    assert measurement.count("graph_skips") == counters["inductor"]["cudagraph_skips"] - before == 2
    assert dict(measurement.count_top("graph_skips")) == {
        f"skipping cudagraphs due to cpu device (arg1_1) at test_graphs.py:{line} in {'test_a_skip_is_inductors_'}"
        "count_named_by_its_message_and_the_call_site": 1,
        "skipped without a message (inductor's cudagraph_skips counter)": 1,
    }
    log = logging.getLogger(SKIP_LOG)
    assert not [h for h in log.handlers if type(h).__name__ == "_SkipMessages"], "the region left its handler"


def test_the_graph_signal_is_one_unit_of_the_catalogue() -> None:
    signal = BY_NAME["graphs"]
    assert [spec.name for spec in signal.counters] == ["graph_recordings", "graph_skips", "eager_graph_calls"]
    assert all(COUNTERS[spec.name] is spec for spec in signal.counters)
    assert (KINDS["max_graph_recordings"].signal, KINDS["no_graph_skips"].signal) == ("graphs", "graphs")
    assert KINDS["no_graph_skips"].limit_argument is None and signal.cuda


def test_graph_budgets_are_markers(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
import pytest, torch

@pytest.mark.max_graph_recordings(0)
@pytest.mark.no_graph_skips
def test_loop(syncguard):
    with syncguard.generation(tokens=2):
        torch.ones(2).add_(1)
"""
    )
    result = pytester.runpytest("--syncguard", "-rA")
    result.assert_outcomes(skipped=1)  # both budgets need CUDA
    result.stdout.fnmatch_lines(["*no budget measured on cpu: max_graph_recordings: not measured: needs CUDA*"])


def test_the_ci_side_and_the_signal_catalogue_import_no_torch() -> None:
    """What runs on a CI machine without a GPU (the report, the A/B, the comment, baselines, the results document)
    and the signals it reads never load torch (docs/architecture.md)."""
    import subprocess
    import sys

    modules = (
        "gate.cli", "render.markdown", "render.junit", "render.terminal", "gate.ab.plan", "judge.baselines",
        "gate.forge.github", "document.file", "document.measured", "document.ab",
        "signals", "budgets", "result", "metrics",
    )  # fmt: skip
    code = "import sys\n" + "".join(f"import pytest_syncguard.{m}\n" for m in modules) + "print('torch' in sys.modules)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "False", found.stderr
