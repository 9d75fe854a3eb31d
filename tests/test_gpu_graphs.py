"""The CUDA-graph health signal on a GPU, against torch's own counts: the graphs a CUDA graph tree recorded (its
graph id counter), the captures a test made itself, and inductor's cudagraph_skips counter; and a planted change
to a compiled loop (a new input length, a CPU tensor input) failing its budget with torch's reason and the line."""

from __future__ import annotations

import copy
import itertools

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

from pytest_syncguard import SyncGuard  # noqa: E402


def _tree_graphs() -> int:
    """How many graphs the CUDA graph tree of device 0 has numbered so far (its id counter, read unconsumed)."""
    from torch._inductor.cudagraph_trees import get_container

    manager = get_container(0).tree_manager
    return 0 if manager is None else next(copy.copy(manager.graph_counter))


def _skips() -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


@pytest.fixture
def step() -> object:
    """A compiled decode-like step under CUDA graph trees, fresh per test."""
    torch._dynamo.reset()
    layer = torch.nn.Linear(64, 64, device="cuda")

    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(layer(x)) * 2

    yield torch.compile(forward, mode="reduce-overhead")
    torch._dynamo.reset()


def test_a_capture_in_a_region_is_a_recording_named_by_its_line() -> None:
    x = torch.ones(8, device="cuda")
    graph = torch.cuda.CUDAGraph()
    guard = SyncGuard("t", device="cuda")
    with guard.generation(tokens=1), torch.cuda.graph(graph):
        x.mul_(2)
    line = test_a_capture_in_a_region_is_a_recording_named_by_its_line.__code__.co_firstlineno + 4
    measurement = guard.measurements[0]
    assert measurement.count("graph_recordings") == 1 and measurement.count("graph_skips") == 0
    ((label, count),) = measurement.count_top("graph_recordings")
    assert count == 1 and label == (
        "a CUDA graph captured (torch.cuda.graph or CUDAGraph.capture_begin) at "
        f"test_gpu_graphs.py:{line} in test_a_capture_in_a_region_is_a_recording_named_by_its_line"
    )


def test_a_compiled_step_replays_its_graph_records_none_and_skips_none(step: object) -> None:
    x = torch.randn(4, 64, device="cuda")
    for _ in range(3):  # warm-up, recording, first replay
        step(x)  # type: ignore[operator]
    graphs, skips = _tree_graphs(), _skips()
    guard = SyncGuard("t", device="cuda")
    with guard.generation(tokens=10):
        for _ in range(10):
            step(x)  # type: ignore[operator]
    measurement = guard.measurements[0]
    assert (measurement.count("graph_recordings"), measurement.count("graph_skips")) == (0, 0)
    assert (_tree_graphs() - graphs, _skips() - skips) == (0, 0)


def test_a_new_input_length_re_records_as_often_as_the_tree_numbers_graphs(step: object) -> None:
    for _ in range(3):
        step(torch.randn(4, 64, device="cuda"))  # type: ignore[operator]
    graphs = _tree_graphs()
    guard = SyncGuard("t", device="cuda")
    with guard.generation(tokens=12):
        for length in itertools.islice(itertools.count(5), 6):
            x = torch.randn(length, 64, device="cuda")
            step(x)  # type: ignore[operator]
            step(x)  # type: ignore[operator]
    measurement = guard.measurements[0]
    recorded = measurement.count("graph_recordings")
    assert recorded == _tree_graphs() - graphs > 0
    labels = dict(measurement.count_top("graph_recordings"))
    assert all("torch.compile's CUDA graph trees" in label and "test_gpu_graphs.py:" in label for label in labels)
    print(f"\n{recorded} recordings:", *labels, sep="\n  ")


def test_a_step_that_mutates_its_input_falls_back_to_eager_and_the_budget_names_why_and_where(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_planted="""
import pytest, torch

@pytest.mark.no_graph_skips
@pytest.mark.max_graph_recordings(0)
def test_loop(syncguard):
    torch._dynamo.reset()
    layer = torch.nn.Linear(64, 64, device="cuda")
    def forward(x, position):
        position.add_(0)  # planted: the step writes into its input
        return layer(x)

    step = torch.compile(forward, mode="reduce-overhead")
    x, position = torch.randn(4, 64, device="cuda"), torch.zeros(1, device="cuda")
    for _ in range(3):  # warm-up: torch decides here
        step(x, position)
    with syncguard.generation(tokens=4):
        for _ in range(4):
            step(x, position)
"""
    )
    result = pytester.runpytest("--syncguard", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    print(text)
    assert (
        "no_graph_skips: measured 4 calls of compiled graphs that ran without their CUDA graphs (torch skipped "
        "them; 0 skips decided in the region)"
    ) in text
    result.stdout.fnmatch_lines(["*4 x *without a CUDA graph*mutat* at test_planted.py:* in *forward*"])
