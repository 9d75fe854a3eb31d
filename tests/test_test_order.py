"""A count is a property of the test: the strategy suite's counts are the same whatever ran before each test in
its process (the suite in order, in reverse order, one test under ``-k``, under pytest-xdist), and on CUDA the
allocator's counts of a region do not depend on what an earlier test left cached."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pytest_syncguard.analysis.memory import MemoryStats
from pytest_syncguard.document import file as results_file
from pytest_syncguard.metrics import metric
from tests import warm

ROOT = Path(__file__).resolve().parents[1]
#: A strategy test whose kept state (static cache, compiled step) earlier tests of the process could reuse: the
#: reversed run runs it first, as if alone; the split run after the static cache's tests.
ALONE = "test_speed[static_compiled]"


def _suites(tmp_path: Path, variants: dict[str, tuple[str, ...]]) -> dict[str, tuple[dict[str, dict[str, float]], str]]:
    """Run the strategy suite's loops under ``--syncguard`` once per variant (its pytest arguments), the variants at once,
    each in a process of its own (what torch.compile keeps cannot be unloaded between runs of one process; forked
    from the suite's warm server, tests/warm.py, which compiled nothing); per variant, each test's exact counts and
    what pytest printed."""
    # The counts come from each measure()'s first run: its timed runs are left out (--syncguard-repeat 0).
    # The speed tests: each strategy's loop, which its timeline test runs again under other budgets.
    suite = ["examples/test_strategies.py::test_speed", "examples/test_generation.py"]
    command = [sys.executable, "-m", "pytest", *suite, "--syncguard", "--syncguard-repeat", "0"]
    command += ["-p", "no:cacheprovider", "-q"]
    logs = {name: (tmp_path / f"{name}.log").open("w+") for name in variants}
    runs = {}
    for name, args in variants.items():
        run = [*command, "--syncguard-json", str(tmp_path / f"{name}.json"), *args]
        log = logs[name]
        started = warm.popen(run, cwd=ROOT, stdout=log, stderr=log)
        runs[name] = started or subprocess.Popen(run, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    found = {}
    for name, run in runs.items():
        code = run.wait(timeout=600)
        logs[name].seek(0)
        output = logs[name].read()
        logs[name].close()
        assert code == 0, f"{name}: exit {code}\n{output[-4000:]}"
        counts = {}
        for result in results_file.read(tmp_path / f"{name}.json"):
            values = result.metrics.values
            counts[result.nodeid] = {n: v for n, v in values.items() if (spec := metric(n)) and spec.counted}
        found[name] = counts, output
    return found


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU suite; on CUDA the device runs the suite itself")
def test_every_count_of_the_strategy_suite_is_the_same_in_any_order_and_split(tmp_path: Path) -> None:
    """The suite's loops (each strategy's speed test, the generation tests) reversed, with the test whose strategy
    keeps state between calls run first in its process (as if alone), and under pytest-xdist: every count the same
    in both (the forward order is the README's main job, compared with its baseline there)."""
    pytest.importorskip("xdist")
    reversed_order = ("-p", "devtools.reversed_order", "--run-first", ALONE, "-vv")
    found = _suites(tmp_path, {"reverse": reversed_order, "split": ("-n", "2")})
    (reverse, said), (split, _) = found["reverse"], found["split"]
    assert len(reverse) >= 8 and all(reverse.values()), reverse
    ran = [line.split()[0] for line in said.splitlines() if re.match(r"examples/\S+ (PASSED|SKIPPED)", line)]
    assert ran[0].endswith(ALONE) and set(reverse) <= set(ran), said[-4000:]
    assert split == reverse


LEFT_CACHED = """
import pytest
import torch


def test_leaves_a_cached_segment():
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    del block  # freed to the allocator's cache, still reserved


@pytest.mark.max_reserved_mb(1024)
def test_allocates(syncguard):
    with syncguard.generation(tokens=1):
        block = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
        block.fill_(1)
"""


@pytest.mark.gpu
def test_a_region_counts_its_own_mallocs_not_what_an_earlier_test_left_cached(pytester: pytest.Pytester) -> None:
    """Run after a test that left 256 MiB cached, the region's 64 MiB comes from a cudaMalloc of its own, as when
    it runs alone (without the plugin emptying the cache, the cached segment served it: 0 cudaMalloc, 256 MiB
    reserved)."""
    pytester.makepyfile(test_allocator=LEFT_CACHED)
    found = {}
    for name, args in {"after": (), "alone": ("-k", "test_allocates")}.items():
        out = pytester.path / f"{name}.json"
        run = pytester.runpytest_subprocess(
            "--syncguard", "-p", "no:cacheprovider", "--syncguard-json", str(out), *args
        )
        run.assert_outcomes(passed=2 if name == "after" else 1)
        (result,) = [r for r in results_file.read(out) if r.nodeid.endswith("test_allocates")]
        found[name] = {n: result.metrics[n] for n in ("device_mallocs", "device_frees", "reserved_mb")}
    assert found["after"] == found["alone"], found
    assert found["alone"]["device_mallocs"] == 1 and found["alone"]["reserved_mb"] == 64, found


def test_the_allocators_driver_calls_are_the_fewest_runs_and_every_other_count_the_largest() -> None:
    """Of a measure()'s runs, the allocator's cudaMalloc and cudaFree calls count as in the fewest run (the loop's
    steady state, whatever the cache held when the first measured run began), every other counter as in the
    largest; parts add up either way. A run that could not count (its cudaMalloc was retried) leaves the others'
    count of the allocator's calls, and no count where no run of a part counted."""
    from pytest_syncguard.analysis.counts import RegionCounts, total
    from pytest_syncguard.probes.memory import out_of_memory
    from pytest_syncguard.signals import COUNTED_RUNS, FEWEST

    assert {"device_mallocs", "device_frees"} == FEWEST

    def counted(parts: list[list[RegionCounts]], name: str) -> int | None:  # as a measurement hands the rules in
        return total(parts, name, fewest=name in FEWEST, counted_runs=name in COUNTED_RUNS)

    runs = [RegionCounts({"device_mallocs": n, "ops": 10 + n}) for n in (1, 0, 2)]
    retried = RegionCounts(unmeasured={"device_mallocs": out_of_memory(1)})
    assert counted([runs], "device_mallocs") == 0 and counted([runs], "ops") == 12
    assert counted([runs, runs[:1]], "device_mallocs") == 1 and counted([runs, runs[:1]], "ops") == 23
    assert counted([[retried, runs[0]]], "device_mallocs") == 1
    assert counted([[retried], runs], "device_mallocs") is None
    dropped = RegionCounts(unmeasured={"ops": "compile records dropped"})
    assert counted([[dropped, runs[0]]], "ops") is None


LOOPS = """
import pytest
import torch


def _allocate():
    block = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
    block.fill_(1)


def test_reserves_once(syncguard):
    syncguard.measure(_allocate, tokens=1, warmup=0, repeat=3)


def test_reserves_every_call(syncguard):
    def emptied():
        _allocate()
        torch.cuda.empty_cache()

    syncguard.measure(emptied, tokens=1, warmup=1, repeat=3)
"""


@pytest.mark.gpu
def test_a_loop_that_reserves_once_counts_no_malloc_and_one_that_reserves_every_call_counts_each(
    pytester: pytest.Pytester,
) -> None:
    """On the allocator itself: without a warm-up the first measured run reserves the loop's segment and the runs
    after it reuse it (0 cudaMalloc: the steady state); a loop that empties the cache every call reserves and frees
    its segment in every run, its fewest included (1 and 1)."""
    pytester.makepyfile(test_loops=LOOPS)
    out = pytester.path / "results.json"
    run = pytester.runpytest_subprocess("--syncguard", "-p", "no:cacheprovider", "--syncguard-json", str(out))
    run.assert_outcomes(passed=2)
    found = {
        r.nodeid.rsplit("::", 1)[1]: (r.metrics["device_mallocs"], r.metrics["device_frees"])
        for r in results_file.read(out)
    }
    assert found == {"test_reserves_once": (0, 0), "test_reserves_every_call": (1, 1)}, found


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_settling_the_allocator_where_cuda_was_never_used_starts_nothing() -> None:
    """A measured test on a machine without CUDA settles nothing, and initializes no CUDA to find that out."""
    from pytest_syncguard.probes.memory import settle_allocator

    assert not torch.cuda.is_initialized()
    settle_allocator()
    assert not torch.cuda.is_initialized()


@pytest.mark.gpu
def test_a_graph_kept_across_tests_replays_right_after_the_allocator_settles() -> None:
    """A CUDA graph a fixture keeps across tests, captured on a stream whose cuBLAS workspace was made before the
    capture (a warm-up there): the settle between tests drops that workspace and frees the cache, and memory
    allocated afterwards may take its place. The graph's replay must still compute what eager code computes, and
    leave that memory as written."""
    from pytest_syncguard.probes.memory import settle_allocator

    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    settle_allocator()
    before = torch.cuda.memory_allocated()
    with torch.cuda.stream(stream):
        torch.mm(a, a, out=out)  # makes the workspace of (handle, stream), outside any graph's pool
    torch.cuda.current_stream().wait_stream(stream)
    workspace = torch.cuda.memory_allocated() - before
    assert workspace > 0, "no cuBLAS workspace was made on the stream: this test would show nothing"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        torch.mm(a, a, out=out)
    captured = torch.cuda.memory_allocated()
    settle_allocator()
    assert torch.cuda.memory_allocated() == captured - workspace, "the settle kept the workspace"
    fillers = [torch.full((workspace,), 7, dtype=torch.uint8, device="cuda") for _ in range(4)]
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, a @ a)
    assert all(bool((f == 7).all()) for f in fillers), "the replay wrote into memory allocated after the settle"


def _stats(reserved_mib: int, retries: int) -> MemoryStats:
    mib = 1024 * 1024
    return MemoryStats(
        device=0, allocated_peak=reserved_mib * mib // 2, reserved_peak=reserved_mib * mib, inactive_split_peak=0,
        alloc_retries=retries, ooms=0, device_mallocs=1, device_frees=0, expandable_segments=False,
    )  # fmt: skip


def test_allocator_peaks_of_a_region_that_ran_out_of_gpu_memory_are_not_the_tests() -> None:
    """A region in which a cudaMalloc failed and was retried (the GPU shared with a worker that filled it) gives
    no reserved peak or fragmentation: the others' do, and with every region out of memory the metric is not
    measured rather than the neighbours' number."""
    from pytest_syncguard.measurement import Measurement

    reserved, fragmentation = metric("reserved_mb"), metric("fragmentation")
    assert reserved is not None and fragmentation is not None
    mixed = Measurement("cuda", 8, (), memory=(_stats(100, 0), _stats(300, 2)))
    assert reserved.runs(mixed) == [100.0] and fragmentation.runs(mixed) == [0.5]
    assert reserved.runs(Measurement("cuda", 8, (), memory=(_stats(300, 1),))) == []


def test_the_results_say_which_allocator_numbers_were_left_out_and_why() -> None:
    from pytest_syncguard.analysis.counts import RegionCounts
    from pytest_syncguard.capture import _out_of_memory_note
    from pytest_syncguard.measurement import Measurement
    from pytest_syncguard.probes.memory import out_of_memory

    counts = {1: RegionCounts(unmeasured=dict.fromkeys(("device_mallocs", "device_frees"), out_of_memory(3)))}
    both = Measurement("cuda", 8, (), memory=(_stats(100, 0), _stats(300, 3)), region_numbers=(1,),
                       region_counts=counts, count_parts=((1,),))  # fmt: skip
    assert _out_of_memory_note("t.py::test", both) == (
        "syncguard: t.py::test: device_mallocs and device_frees not measured; reserved_mb and fragmentation left out "
        f"of 1 region reading(s): {out_of_memory(3)}"
    )
    assert "(3 cudaMalloc retries after freeing the allocator's cache)" in out_of_memory(3)
    assert _out_of_memory_note("t.py::test", Measurement("cuda", 8, (), memory=(_stats(100, 0),))) is None


@pytest.mark.gpu
def test_a_region_whose_cudamalloc_was_retried_counts_no_mallocs() -> None:
    """The allocator runs out of memory inside the region (here under a memory fraction; on a shared GPU, another
    process's memory), frees its cached segment and retries: the region's cudaMalloc and cudaFree calls are not
    counted, and say why."""
    from pytest_syncguard.analysis.counts import RegionCounts
    from pytest_syncguard.probes.memory import driver_calls, settle_allocator

    total = torch.cuda.get_device_properties(0).total_memory
    settle_allocator()
    found: list[RegionCounts] = []
    torch.cuda.set_per_process_memory_fraction(0.1)
    try:
        cached = torch.empty(int(total * 0.06), dtype=torch.uint8, device="cuda")
        del cached  # its segment stays in the cache
        retries = torch.cuda.memory_stats()["num_alloc_retries"]
        with driver_calls(found):
            fits_without_the_cache = torch.empty(int(total * 0.07), dtype=torch.uint8, device="cuda")
        del fits_without_the_cache
        assert torch.cuda.memory_stats()["num_alloc_retries"] > retries, "the allocator did not retry"
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        settle_allocator()
    (counts,) = found
    assert counts.values == {}
    assert set(counts.unmeasured) == {"device_mallocs", "device_frees"}
    assert "memory ran out" in counts.unmeasured["device_mallocs"]
