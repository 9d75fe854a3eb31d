"""The PM sampler's samples decoded in bulk: the native loop (probes/native/samples.cpp) against the Python one, and
a region's samples compacted (runs of wholly active or idle samples merged) against the samples as decoded.

Compaction must not move the timeline: tests/data/sampled_steps holds real runs of the suite's seven strategies on
an H100 (its README says how they were made), each judged here from every sample and from its compacted rows.
On CUDA, the native loop and the Python loop decode one real region's counter data to the same arrays."""

from __future__ import annotations

import ctypes
import time
from array import array
from dataclasses import replace
from pathlib import Path

import pytest

from bench.bench_sampled_timeline import read_kept
from pytest_syncguard.analysis.sampled import IDLE_BELOW
from pytest_syncguard.instruments import judge_sampled_region
from pytest_syncguard.probes import cupti, pm_sampling
from pytest_syncguard.probes.native import NATIVE
from pytest_syncguard.probes.sampler import ACTIVE_CYCLES, ELAPSED_CYCLES

DATA = Path(__file__).parent / "data" / "sampled_steps"
STRATEGIES = ("no_cache", "kv_cache", "static_cache", "static_compiled", "stream_pingpong", "cuda_graph", "hf_generate")


def _native() -> object:
    module = NATIVE.load()
    if module is None:
        pytest.skip(f"the native extension {NATIVE.unavailable}")
    return module


@pytest.fixture(params=[False, True], ids=["python", "native"])
def native(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Compaction by the Python loop, or by the native one."""
    if request.param:
        _native()
    else:
        monkeypatch.setattr(pm_sampling, "_native", lambda: None)
    return bool(request.param)


@pytest.mark.parametrize("name", STRATEGIES)
def test_a_compacted_region_judges_the_same_timeline(name: str, native: bool) -> None:
    region, _ = read_kept(DATA / f"h100_{name}.json.gz")
    compacted = region.samples.compacted(ACTIVE_CYCLES, ELAPSED_CYCLES, IDLE_BELOW)
    assert len(compacted.start_ns) < len(region.samples.start_ns) / 5  # 6.5x (no_cache) to 65x (static_compiled)
    whole = judge_sampled_region(region, 2)
    rows = judge_sampled_region(replace(region, samples=compacted), 2)
    assert whole.timeline is not None and rows.timeline is not None
    assert rows.steps == whole.steps
    assert rows.timeline.gaps_us == pytest.approx(whole.timeline.gaps_us, abs=1e-6)
    assert rows.timeline.busy_us == pytest.approx(whole.timeline.busy_us, rel=1e-9)
    assert rows.timeline.span_us == whole.timeline.span_us
    assert rows.timeline.top_gaps == whole.timeline.top_gaps
    assert rows.timeline.step_spans == whole.timeline.step_spans


def _samples(rows: list[tuple[int, int, float, float]]) -> pm_sampling.Samples:
    return pm_sampling.Samples.of_rows(
        (ACTIVE_CYCLES, ELAPSED_CYCLES), [r[0] for r in rows], [r[1] for r in rows], [r[2:] for r in rows]
    )


def test_compaction_merges_only_touching_runs_of_one_kind(native: bool) -> None:
    rows = [
        (0, 10, 10.0, 10.0), (10, 20, 12.0, 10.0),  # wholly active, touching: one row with their cycles added
        (20, 30, 5.0, 10.0),  # partly active: kept
        (30, 40, 0.1, 10.0), (40, 50, 0.0, 10.0),  # idle: merged
        (55, 60, 0.0, 5.0),  # idle but not touching the row before: kept apart
        (60, 70, 3.0, 0.0), (70, 80, 0.0, 0.0),  # no cycles elapsed: never merged
        (80, 90, 10.0, 10.0),
    ]  # fmt: skip
    compacted = _samples(rows).compacted(ACTIVE_CYCLES, ELAPSED_CYCLES, IDLE_BELOW)
    assert list(zip(compacted.start_ns, compacted.end_ns, *compacted.columns, strict=True)) == [
        (0, 20, 22.0, 20.0), (20, 30, 5.0, 10.0), (30, 50, 0.1, 20.0), (55, 60, 0.0, 5.0), (60, 70, 3.0, 0.0),
        (70, 80, 0.0, 0.0), (80, 90, 10.0, 10.0),
    ]  # fmt: skip
    assert compacted.completed == len(rows)


def test_native_and_python_compaction_agree_on_a_real_region() -> None:
    module = _native()
    region, _ = read_kept(DATA / "h100_kv_cache.json.gz")
    samples = region.samples
    buffers = [array("q", samples.start_ns), array("q", samples.end_ns)]
    buffers += [array("d", samples.column(ACTIVE_CYCLES)), array("d", samples.column(ELAPSED_CYCLES))]
    copies = [array(b.typecode, b) for b in buffers]
    kept = module.pm_compact(*(b.buffer_info()[0] for b in buffers), len(buffers[0]), IDLE_BELOW)  # type: ignore[attr-defined]
    assert kept == pm_sampling._compact(*copies, IDLE_BELOW)  # type: ignore[arg-type]
    assert [b[:kept] for b in buffers] == [c[:kept] for c in copies]


# CUPTI's two per-sample calls, as C functions over the same parameter structs (pm_sampling's ctypes layouts): the
# native loop's contract (offsets, threads, the failing call) without a GPU. The GPU test below runs the real ones.
_CALL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


@_CALL
def _sample_info(address: int) -> int:
    params = pm_sampling._SampleInfo.from_address(address)
    index = params.sampleIndex
    params.startTimestamp, params.endTimestamp = 1_000 * index + 7, 1_000 * index + 999
    return 0


def _evaluate(fail_at: int) -> object:
    @_CALL
    def evaluate(address: int) -> int:
        params = pm_sampling._Evaluate.from_address(address)
        if params.rangeIndex == fail_at:
            return 27
        params.pMetricValues[0], params.pMetricValues[1] = float(params.rangeIndex), 0.5 * params.pHostObject
        return 0

    return evaluate


@pytest.mark.parametrize("threads", [1, 3])
def test_the_native_loop_fills_every_sample_from_the_structs_it_is_given(threads: int) -> None:
    module = _native()
    count = 1_001
    evaluate = _evaluate(fail_at=-1)
    sample = pm_sampling._SampleInfo()
    values = [(ctypes.c_double * 2)() for _ in range(threads)]
    evaluations = [pm_sampling._Evaluate(pHostObject=2 * (t + 1), pMetricValues=v) for t, v in enumerate(values)]
    starts, ends = array("q", [0]) * count, array("q", [0]) * count
    columns = [array("d", [0.0]) * count for _ in range(2)]
    address = lambda b: b.buffer_info()[0]  # noqa: E731
    outcome = module.pm_decode(  # type: ignore[attr-defined]
        ctypes.cast(_sample_info, ctypes.c_void_p).value, ctypes.cast(evaluate, ctypes.c_void_p).value,
        ctypes.addressof(sample), pm_sampling._SampleInfo.sampleIndex.offset,
        pm_sampling._SampleInfo.startTimestamp.offset, pm_sampling._SampleInfo.endTimestamp.offset,
        [ctypes.addressof(e) for e in evaluations], pm_sampling._Evaluate.rangeIndex.offset,
        [ctypes.addressof(v) for v in values], 2, count, address(starts), address(ends), [address(c) for c in columns],
    )  # fmt: skip
    assert outcome == (0, "", count)
    assert list(starts) == [1_000 * i + 7 for i in range(count)]
    assert list(ends) == [1_000 * i + 999 for i in range(count)]
    assert list(columns[0]) == [float(i) for i in range(count)]
    # Each thread evaluated a contiguous share with its own host object.
    chunk = -(-count // threads)
    assert list(columns[1]) == [float(i // chunk + 1) for i in range(count)]


def test_the_native_loop_names_the_call_and_the_sample_that_failed() -> None:
    module = _native()
    evaluate = _evaluate(fail_at=5)
    sample, values = pm_sampling._SampleInfo(), (ctypes.c_double * 2)()
    evaluation = pm_sampling._Evaluate(pHostObject=2, pMetricValues=values)
    buffers = [array("q", [0]) * 10, array("q", [0]) * 10, array("d", [0.0]) * 10, array("d", [0.0]) * 10]
    outcome = module.pm_decode(  # type: ignore[attr-defined]
        ctypes.cast(_sample_info, ctypes.c_void_p).value, ctypes.cast(evaluate, ctypes.c_void_p).value,
        ctypes.addressof(sample), pm_sampling._SampleInfo.sampleIndex.offset,
        pm_sampling._SampleInfo.startTimestamp.offset, pm_sampling._SampleInfo.endTimestamp.offset,
        [ctypes.addressof(evaluation)], pm_sampling._Evaluate.rangeIndex.offset, [ctypes.addressof(values)], 2, 10,
        *(b.buffer_info()[0] for b in buffers[:2]), [b.buffer_info()[0] for b in buffers[2:]],
    )  # fmt: skip
    assert outcome == (27, "cuptiProfilerHostEvaluateToGpuValues", 5)


@pytest.mark.gpu
def test_native_and_python_loops_decode_a_real_region_alike() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    _native()
    from pytest_syncguard.probes.sampler import _enabled_sampler

    try:
        sampler = _enabled_sampler()
    except cupti.CuptiError as exc:
        pytest.skip(f"the PM sampler cannot run here: {exc}")
    try:
        x = torch.ones(2048, 2048, device="cuda")
        sampler.start()
        for _ in range(1000):  # about 50k samples: four threads evaluate them
            x = torch.tanh(x @ x)
        torch.cuda.synchronize()
        sampler.stop()
        data = sampler.counter_data(100_000)
        assert data.completed > 1_000
        python = sampler.evaluate(data, data.completed, native=False)
        for threads in (1, 4):
            native = sampler.evaluate(data, data.completed, native=True, threads=threads)
            assert sampler.decoded_natively
            assert native[2] == python[2]  # every value
            # CUPTI puts a sample's timestamps on the host's clock as it reads them: the same to a microsecond, but
            # for a stray one (an H100 read one sample 4 s apart in one of two reads of 1.7 million).
            for ours, theirs in zip(native[:2], python[:2], strict=True):
                apart = sum(1 for a, b in zip(ours, theirs, strict=True) if abs(a - b) >= 1_000)
                assert apart <= len(ours) // 1000, apart
    finally:
        sampler.disable()


def test_a_regions_image_is_sized_to_its_span_with_room_to_spare() -> None:
    from pytest_syncguard.probes.sampler import INTERVAL_NS, MAX_SAMPLES, samples_for

    second = 1_000_000_000
    assert samples_for((0, second)) >= second // INTERVAL_NS * 1.05  # the samples a second holds, and a margin
    assert samples_for((5, 5)) > 0
    assert samples_for((0, 10 * second)) == MAX_SAMPLES  # a longer region is cut short and said so (overflow)


@pytest.mark.gpu
def test_a_reused_image_decodes_the_next_region_as_a_fresh_one_would() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from pytest_syncguard.probes.sampler import _enabled_sampler, samples_for

    try:
        sampler = _enabled_sampler()
    except cupti.CuptiError as exc:
        pytest.skip(f"the PM sampler cannot run here: {exc}")
    assert sampler.metrics == (ACTIVE_CYCLES, ELAPSED_CYCLES)
    x = torch.ones(2048, 2048, device="cuda")
    busy = []
    try:
        for steps in (300, 100):  # the second region is shorter: it fits in the first one's image
            start = time.time_ns()
            sampler.start()
            for _ in range(steps):
                x = torch.tanh(x @ x)
            torch.cuda.synchronize()
            time.sleep(0.02)  # an idle stretch after the work
            sampler.stop()
            data = sampler.counter_data(samples_for((start, time.time_ns())))  # sized as the plugin sizes it
            assert data.size <= len(data.image) and not data.overflow
            _, _, (active, _elapsed) = sampler.evaluate(data, data.completed)  # the timeline's metrics, in order
            busy.append(sum(active) / steps)  # the active cycles of a step: the same work in either image
            assert any(a == 0 for a in active[-1000:])  # the idle stretch reads idle
        assert sampler._image is data.image
    finally:
        sampler.disable()
    assert abs(busy[0] - busy[1]) < 0.1 * busy[0], busy
