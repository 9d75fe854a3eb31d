"""On CUDA: the graph census reads what a captured graph holds, node type by node type, as the trace of its replay
shows it (the profiler's kernel, memcpy and memset records); the launch log names the graph each launch replayed,
as torch names its executable graph."""

from __future__ import annotations

import ctypes
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pytest_syncguard.analysis import trace_file
from pytest_syncguard.probes.cuda_calls import CUDA_CALLS
from pytest_syncguard.probes.graph_nodes import CENSUS, GraphCensus
from pytest_syncguard.probes.timeline import cupti_detached_afterwards

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.fixture
def census() -> Iterator[GraphCensus]:
    undo = CENSUS.watch()
    try:
        yield CENSUS
    finally:
        undo()


def _captured() -> torch.cuda.CUDAGraph:
    """A graph of two kernels, a device-to-device copy and a driver memset (what cuBLASLt does to a workspace)."""
    driver = ctypes.CDLL("libcuda.so.1")
    driver.cuMemsetD8Async.argtypes = (ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t, ctypes.c_void_p)
    a = torch.ones(1 << 20, device="cuda")
    b, flags = torch.empty_like(a), torch.empty(4096, dtype=torch.uint8, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        a.mul_(2)
        b.copy_(a)
        stream = torch.cuda.current_stream().cuda_stream
        assert driver.cuMemsetD8Async(flags.data_ptr(), 0, flags.numel(), stream) == 0
        b.add_(1)
    graph.buffers = (a, b, flags)  # type: ignore[attr-defined]  # kept alive with the graph
    return graph


def test_the_census_reads_a_graph_as_the_trace_of_its_replay_shows_it(census: GraphCensus, tmp_path: Path) -> None:
    graph = _captured()
    handle = graph.raw_cuda_graph_exec()
    nodes = census.of_launched([handle]).get(handle)
    assert nodes is not None, census.problem
    torch.cuda.synchronize()
    with (
        cupti_detached_afterwards(),
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile,
    ):
        graph.replay()
        torch.cuda.synchronize()
    profile.export_chrome_trace(str(tmp_path / "replay.json"))
    kinds = Counter(op.category for op in trace_file.load(tmp_path / "replay.json").gpu_ops)
    print(nodes, dict(kinds))
    # The memset runs as a memset; the device-to-device copy node runs as a kernel (on an H200, driver of CUDA 13).
    assert nodes.memsets == kinds["gpu_memset"] == 1
    assert nodes.kernels + nodes.copies == kinds["kernel"] + kinds["gpu_memcpy"] == 3
    assert (nodes.kernels, nodes.copies, nodes.others) == (2, 1, 0)


def test_the_launch_log_names_the_graph_each_launch_replayed(census: GraphCensus) -> None:
    first, second = _captured(), _captured()
    step = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    with CUDA_CALLS.logging_launches() as log:
        first.replay()
        step.add_(1)
        second.replay()
        first.replay()
        torch.cuda.synchronize()
    assert log.not_logged is None and log.lost == 0, log.not_logged
    assert all(e <= r for e, r in zip(log.entered_ns, log.returned_ns, strict=True))
    handles = first.raw_cuda_graph_exec(), second.raw_cuda_graph_exec()
    assert [graph for _, graph in log.graph_launches] == [handles[0], handles[1], handles[0]]
    assert len(log.returned_ns) == 4  # three graph launches and the kernel of add_
    assert [ns for ns, _ in log.graph_launches] == [log.returned_ns[i] for i in (0, 2, 3)]
    log.graph_nodes = census.of_launched(graph for _, graph in log.graph_launches)
    assert all(nodes is not None and nodes.memsets == 1 for _, nodes in log.graphs())


def test_the_launch_log_stamps_asynchronous_copies_and_the_transfers_still_count() -> None:
    # A device-to-device copy runs on the SMs and ends a gap the samples see: its call is a launch. A copy to
    # pageable host memory is a transfer the CUDA-call probe counts from the same callback, passed on to it.
    source = torch.ones(1 << 20, device="cuda")
    copy, host = torch.empty_like(source), torch.empty(source.shape, dtype=source.dtype)
    torch.cuda.synchronize()
    with CUDA_CALLS.counting() as watch, CUDA_CALLS.logging_launches() as log:
        copy.copy_(source)
        host.copy_(copy)
    assert log.not_logged is None and watch.not_counted is None, (log.not_logged, watch.not_counted)
    assert len(log.returned_ns) == 2 and not log.graph_launches
    assert [(t.direction, t.size) for t in watch.transfers] == [("d2h", source.nbytes)]
