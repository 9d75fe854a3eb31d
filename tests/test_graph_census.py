"""The graph census's switch on torch (``CUDAGraph.capture_end`` wrapped): on from a process's first measured test on
a machine with a CUDA driver, off again when the session ends, and held while any watcher holds it. What it reads
is tested on CUDA (tests/test_gpu_graph_nodes.py)."""

from __future__ import annotations

import pytest
import torch

from pytest_syncguard import environment
from pytest_syncguard.probes.graph_nodes import GraphCensus


def test_the_switch_is_held_while_any_watcher_holds_it() -> None:
    original = torch.cuda.CUDAGraph.capture_end
    census = GraphCensus()
    first, second = census.watch(), census.watch()
    assert torch.cuda.CUDAGraph.capture_end is not original
    first()
    first()  # stopping twice stops once
    assert torch.cuda.CUDAGraph.capture_end is not original
    second()
    assert torch.cuda.CUDAGraph.capture_end is original


def test_the_plugin_reads_captures_from_the_first_measured_test_to_the_session_end(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(environment, "has_cuda_driver", lambda: True)  # as on a GPU runner
    original = torch.cuda.CUDAGraph.capture_end
    pytester.makepyfile(
        test_census="""
        import torch

        def test_unmeasured():
            assert torch.cuda.CUDAGraph.capture_end.__name__ == "capture_end"

        def test_measured(syncguard):
            assert torch.cuda.CUDAGraph.capture_end.__name__ == "read_then_end"

        def test_after(syncguard):
            assert torch.cuda.CUDAGraph.capture_end.__name__ == "read_then_end"
        """
    )
    result = pytester.runpytest_inprocess("--syncguard", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    assert torch.cuda.CUDAGraph.capture_end is original
