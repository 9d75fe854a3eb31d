"""The GPU timeline analysis on real H100 traces (tests/data, see tests/data/README.md) and on hand-built
traces for the edge cases; the ``syncguard trace`` command; the allocator arithmetic."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_syncguard.analysis import gaps, trace_file
from pytest_syncguard.analysis.memory import MemoryStats, expandable_segments_on, region_stats
from pytest_syncguard.codec import decode, encode

DATA = Path(__file__).parent / "data"


def real(name: str) -> tuple[trace_file.Trace, gaps.Timeline]:
    trace = trace_file.load(DATA / f"{name}.trace.json.gz")
    (window,) = gaps.regions(trace).values()
    timeline = gaps.analyze(trace, window=window, warmup_steps=2)
    assert timeline is not None
    return trace, timeline


def test_real_host_read_loop_gaps_are_host_syncs_at_the_item_line() -> None:
    _, timeline = real("item_loop")
    assert (timeline.steps, timeline.warmup_steps, timeline.judged_steps) == (12, 2, 10)
    assert timeline.gap_stat("max") > 50
    top = timeline.top_gaps[0]
    assert top.cause == gaps.HOST_SYNC and top.step is not None and top.step >= 2
    assert "cudaStreamSynchronize at scalar read at" in top.detail and "capture_traces.py:83 in loop" in top.detail
    # Every step makes one host read: the largest gap of every judged step is that sync.
    causes = [g.cause for g in timeline.top_gaps[:5]]
    assert causes.count(gaps.HOST_SYNC) >= 4


def test_real_cuda_graph_loop_is_busy_without_large_gaps() -> None:
    _, timeline = real("graph_loop")
    assert timeline.gap_stat("max") < 10
    assert timeline.busy_fraction > 0.9
    assert all(g.cause != gaps.HOST_SYNC for g in timeline.top_gaps)


def test_warmup_steps_leave_out_early_ops() -> None:
    trace = trace_file.load(DATA / "item_loop.trace.json.gz")
    (window,) = gaps.regions(trace).values()
    everything = gaps.analyze(trace, window=window, warmup_steps=0)
    judged = gaps.analyze(trace, window=window, warmup_steps=2)
    assert everything is not None and judged is not None
    assert everything.gpu_ops > judged.gpu_ops
    assert gaps.analyze(trace, window=window, warmup_steps=50) is None  # every step is warm-up


# -- hand-built traces ----------------------------------------------------------------------------------
def kernel(
    start: float, end: float, stream: int = 7, correlation: int | None = None, cat: str = "kernel", name: str = ""
) -> dict[str, Any]:
    args: dict[str, Any] = {"stream": stream}
    if correlation is not None:
        args["correlation"] = correlation
    return {
        "ph": "X",
        "cat": cat,
        "name": name or f"{cat}@{start}",
        "pid": 0,
        "tid": stream,
        "ts": start,
        "dur": end - start,
        "args": args,
    }


def runtime(name: str, start: float, end: float, correlation: int | None = None, tid: int = 1) -> dict[str, Any]:
    args = {} if correlation is None else {"correlation": correlation}
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": name,
        "pid": 1,
        "tid": tid,
        "ts": start,
        "dur": end - start,
        "args": args,
    }


def op(name: str, start: float, end: float, tid: int = 1, cat: str = "cpu_op") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": start, "dur": end - start}


def analyze(events: list[dict[str, Any]], **kwargs: Any) -> gaps.Timeline:
    timeline = gaps.analyze(trace_file.from_events(events), **kwargs)
    assert timeline is not None
    return timeline


def test_overlapping_streams_are_merged_and_viewed_per_stream() -> None:
    timeline = analyze(
        [kernel(0, 10, stream=7), kernel(5, 20, stream=8), kernel(30, 40, stream=7), kernel(35, 50, stream=8)]
    )
    assert timeline.gaps_us == (10.0,)
    assert timeline.busy_us == 40 and timeline.span_us == 50
    assert timeline.busy_fraction == pytest.approx(0.8)
    views = {s.stream: s for s in timeline.streams}
    assert views[7].max_gap_us == 20 and views[8].max_gap_us == 15


def test_only_kernels_and_device_copies_end_an_idle_stretch() -> None:
    """One definition in every source: host copies and memsets (copy engines) leave the GPU idle; a device-to-device
    copy, which the runtime runs as a kernel, keeps it busy."""
    timeline = analyze(
        [kernel(0, 10), kernel(10, 25, cat="gpu_memcpy"), kernel(27, 30, cat="gpu_memset"), kernel(40, 50)]
    )
    assert timeline.gaps_us == (30.0,)
    assert timeline.busy_us == 20 and timeline.span_us == 50
    device_copy = kernel(12, 25, cat="gpu_memcpy", name="Memcpy DtoD (Device -> Device)")
    timeline = analyze([kernel(0, 10), device_copy, kernel(40, 50)])
    assert timeline.gaps_us == (2.0, 15.0) and timeline.busy_us == 33


def test_an_idle_stretch_under_a_microsecond_is_busy() -> None:
    """A CUDA graph's kernels follow each other closer than the sampler resolves: no gap, busy time, in every source."""
    timeline = analyze([kernel(0, 10), kernel(10.9, 20), kernel(21.0, 30)])
    assert timeline.gaps_us == (1.0,)
    assert timeline.busy_us == pytest.approx(29.0)


def test_a_region_of_copies_alone_has_no_timeline() -> None:
    assert (
        gaps.analyze(trace_file.from_events([kernel(0, 10, cat="gpu_memcpy"), kernel(20, 30, cat="gpu_memset")]))
        is None
    )


def test_region_without_gpu_work_is_none() -> None:
    trace = trace_file.from_events([op("aten::add", 0, 10), runtime("cudaGetDevice", 1, 2)])
    assert gaps.analyze(trace) is None
    trace = trace_file.from_events([kernel(0, 10, correlation=1), runtime("cudaLaunchKernel", 0, 1, correlation=1)])
    assert gaps.analyze(trace, window=(100.0, 200.0)) is None  # launched outside the window


def test_gap_causes_host_sync_launch_bound_and_other() -> None:
    events = [
        # host sync: kernel 1 ends at 10; the sync returns at 11; the next launch at 15 -> kernel 2 at 20
        kernel(0, 10, correlation=1), runtime("cudaLaunchKernel", -5, -4, correlation=1),
        op("aten::_local_scalar_dense", 2, 12), op("syncguard.sync scalar read at loop.py:7 in decode", 2, 12, cat="user_annotation"),
        runtime("cudaStreamSynchronize", 3, 11),
        kernel(20, 30, correlation=2), runtime("cudaLaunchKernel", 15, 16, correlation=2),
        # launch-bound: the host spends 40..58 in operators before launching at 58
        op("aten::cat", 40, 50), op("aten::argmax", 51, 55), runtime("cudaLaunchKernel", 58, 59, correlation=3),
        kernel(60, 70, correlation=3),
        # other: launched at 61 (before the device went idle at 70) yet started at 90
        runtime("cudaLaunchKernel", 61, 62, correlation=4), kernel(90, 95, correlation=4),
    ]  # fmt: skip
    timeline = analyze(events)
    by_start = {g.start_us: g for g in timeline.top_gaps}
    assert by_start[10].cause == gaps.HOST_SYNC and "loop.py:7 in decode" in by_start[10].detail
    assert by_start[30].cause == gaps.LAUNCH_BOUND and "aten::cat" in by_start[30].detail
    assert "aten::argmax" in by_start[30].detail
    assert by_start[70].cause == gaps.OTHER
    assert [g.duration_us for g in timeline.top_gaps] == [30, 20, 10]


def test_gap_causes_copy_wait_and_collective_wait_and_every_gap_summed_by_its_cause() -> None:
    events = [
        kernel(0, 10, correlation=1), runtime("cudaLaunchKernel", -5, -4, correlation=1),
        # copy wait: a host-to-device copy on the kernel's stream runs 10..30; the kernel, launched at 5, starts at 31
        kernel(10, 30, cat="gpu_memcpy", name="Memcpy HtoD (Pageable -> Device)", correlation=2),
        runtime("cudaMemcpyAsync", 4, 5, correlation=2),
        runtime("cudaLaunchKernel", 6, 7, correlation=3), kernel(31, 40, correlation=3),
        # collective wait: the host is inside gloo's all-reduce from 41 to 70 and launches at 72
        op("c10d::allreduce_", 41, 70), op("gloo:all_reduce", 42, 69, cat="user_annotation"),
        runtime("cudaLaunchKernel", 72, 73, correlation=4), kernel(75, 80, correlation=4),
        # an NCCL kernel launched at 76, before the device went idle at 80, that starts at 95
        runtime("cudaLaunchKernel", 76, 77, correlation=5),
        kernel(95, 99, correlation=5, name="ncclDevKernel_AllReduce_Sum_f32_RING_LL"),
    ]  # fmt: skip
    timeline = analyze(events)
    by_start = {g.start_us: g for g in timeline.top_gaps}
    assert by_start[10].cause == gaps.COPY_WAIT and "Memcpy HtoD" in by_start[10].detail
    assert by_start[40].cause == gaps.COLLECTIVE_WAIT and "gloo:all_reduce" in by_start[40].detail
    assert by_start[80].cause == gaps.COLLECTIVE_WAIT
    assert {k: v for k, v in timeline.idle_us.items() if v} == {gaps.COPY_WAIT: 21.0, gaps.COLLECTIVE_WAIT: 50.0}


@pytest.mark.parametrize("name", ["item_loop", "capture_marked_steps"])
def test_a_real_host_read_loops_idle_time_is_nineteen_twentieths_attributed(name: str) -> None:
    """A decode loop that reads the device every step (real H100 traces): its idle time is the host's syncs and its
    launching, each gap's as attributed one by one; what is left (another stream, an event) is under a twentieth."""
    _, timeline = real(name)
    idle = timeline.idle_us
    assert sum(idle.values()) == pytest.approx(sum(timeline.gaps_us))
    assert idle[gaps.HOST_SYNC] > 0 and idle[gaps.LAUNCH_BOUND] > 0
    assert idle[gaps.HOST_SYNC] + idle[gaps.LAUNCH_BOUND] >= 0.95 * sum(idle.values())
    for gap in timeline.top_gaps:  # the largest, one by one, as they are summed
        assert gap.cause in idle and idle[gap.cause] >= gap.duration_us


def test_gap_statistics() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert gaps.gap_stat(values, "max") == 10
    assert gaps.gap_stat(values, "p50") == 3
    assert gaps.gap_stat(values, "p99") == pytest.approx(4 + 6 * 0.96)
    assert gaps.gap_stat(values, "mean") == 4
    assert gaps.gap_stat([], "p99") == 0
    for bad in ("p0", "p101", "q99", "", "P99"):
        with pytest.raises(ValueError, match="stat must be"):
            gaps.parse_stat(bad)


def test_trace_of_another_tool_version_still_reads(tmp_path: Path) -> None:
    # An older Chrome-trace layout: a bare list, string thread ids, no args, plus events of unknown kinds.
    events = [
        {"ph": "X", "cat": "Kernel", "name": "k", "ts": 0, "dur": 5},  # unknown category: ignored
        {"ph": "X", "cat": "kernel", "name": "a", "pid": 0, "tid": "stream 7", "ts": 0, "dur": 5},
        {"ph": "X", "cat": "kernel", "name": "b", "pid": 0, "tid": "stream 7", "ts": 9, "dur": 1, "args": None},
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 3},
        "not an event",
    ]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(events))
    timeline = gaps.analyze(trace_file.load(path))
    assert timeline is not None and timeline.gaps_us == (4.0,) and timeline.gpu_ops == 2
    assert timeline.top_gaps[0].cause == gaps.OTHER


def test_truncated_and_malformed_files_name_the_file(tmp_path: Path) -> None:
    whole = gzip.decompress((DATA / "graph_loop.trace.json.gz").read_bytes())
    cases = {
        "truncated.json": whole[: len(whole) // 2],
        "truncated.json.gz": gzip.compress(whole)[:500],
        "object.json": b'{"traceEvents": 3}',
        "empty.json": b"",
    }
    for name, content in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(trace_file.TraceError, match=name.replace(".", r"\.")):
            trace_file.load(path)
    with pytest.raises(trace_file.TraceError, match=r"missing\.json"):
        trace_file.load(tmp_path / "missing.json")


def syncguard_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_syncguard.gate.cli", *args], capture_output=True, text=True)


def test_trace_command_prints_the_analysis_and_json() -> None:
    path = str(DATA / "item_loop.trace.json.gz")
    text = syncguard_cli("trace", path, "--warmup-steps", "2")
    assert text.returncode == 0, text.stderr
    assert "largest gaps" in text.stdout and "host sync" in text.stdout and "capture_traces.py:83" in text.stdout
    data = json.loads(syncguard_cli("trace", path, "--json", "--warmup-steps", "2").stdout)
    _, timeline = real("item_loop")
    assert data["timeline"]["max_gap_us"] == pytest.approx(timeline.gap_stat("max"), abs=1e-3)
    assert data["timeline"]["judged_steps"] == 10


def test_trace_command_on_a_bad_file_exits_2_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{")
    result = syncguard_cli("trace", str(path))
    assert result.returncode == 2 and "broken.json" in result.stderr and "not a JSON trace" in result.stderr


# -- allocator arithmetic -------------------------------------------------------------------------------
def test_region_stats_arithmetic() -> None:
    before = {"num_alloc_retries": 1, "num_ooms": 0, "num_device_alloc": 10, "num_device_free": 4}
    after = {
        "allocated_bytes.all.peak": 300, "reserved_bytes.all.peak": 1200, "inactive_split_bytes.all.peak": 50,
        "num_alloc_retries": 3, "num_ooms": 0, "num_device_alloc": 16, "num_device_free": 9,
    }  # fmt: skip
    stats = region_stats(0, before, after, expandable_segments=False)
    assert stats.fragmentation == pytest.approx(0.75)
    assert (stats.alloc_retries, stats.device_mallocs, stats.device_frees) == (2, 6, 5)
    assert decode(MemoryStats, encode(stats)) == stats
    assert region_stats(0, {}, {}, expandable_segments=True).fragmentation == 0.0


def test_expandable_segments_setting() -> None:
    assert expandable_segments_on("expandable_segments:True")
    assert expandable_segments_on("max_split_size_mb:128, expandable_segments:true")
    assert not expandable_segments_on("expandable_segments:False")
    assert not expandable_segments_on("")


def test_the_device_works_counters_are_the_timeline_signals() -> None:
    """The analysis names the counters it gives a region; the timeline signal declares them: one list, held equal
    here (the analysis reads no catalogue above it)."""
    from pytest_syncguard.analysis.device_work import COUNTED_HERE, ITEMIZED_HERE
    from pytest_syncguard.signals.timeline import SIGNAL

    assert set(COUNTED_HERE) == {spec.name for spec in SIGNAL.counters}
    assert set(ITEMIZED_HERE) == {spec.name for spec in SIGNAL.counters if spec.items and spec.name != "launches"}
