"""The sampled timeline with its steps, as a test takes it, against CUPTI's records of the same run on an H100,
both under the one definition of the timeline (:mod:`pytest_syncguard.analysis.gaps`): the GPU is idle when no
kernel (or device-to-device copy) runs; host copies and memsets do not end an idle stretch; a stretch under a
microsecond is busy.

tests/data/sampled_steps/h100_*.json.gz: one run of each strategy of the suite (GPT-2 124M, batch 32, prompt 16,
100 new tokens) on an H100 80GB HBM3 (GPU-89b33f43, torch 2.11.0+cu130, driver 580.159.04; cuda_graph and
static_compiled on GPU-ae29c551), its samples as decoded; h200_*.json.gz the same on an H200 (GPU-d49841cd, the
first of three runs in bench/results/h200_sampled_agreement.txt), its samples compacted as the probe keeps them
(runs of wholly active or idle samples merged). Each sampled by the plugin's probe (its marker kernel and a CUDA event per step:
forward calls, or for cuda_graph and static_compiled one before the first graph replay and one after each) while
CUPTI recorded every kernel, memcpy and memset on the same GPU clock, each labelled with its
kind (a memcpy's copy kind tells a device-to-device copy): ``python -m bench.bench_sampled_timeline --keep DIR
--keep-ms 30`` (``--keep-ms 3000 --repeat 3`` for the H200), then ``python -m devtools.trim_sampled_steps
DIR/NAME.json.gz OUT --ms 30``: the region's start (its
marker) and the first 30 ms of its judged part.

Each is analysed here as the plugin analyses a sampled region (:func:`~pytest_syncguard.instruments.judge_sampled_region`,
2 warm-up steps) and compared with the records that start in the judged part, merged by the trace analysis's own
rule (:func:`bench.bench_pm_sampling.truth`): the agreement the default timeline source must hold, on every strategy.
"""

from __future__ import annotations

import bisect
from pathlib import Path

import pytest

from bench.bench_pm_sampling import truth
from bench.bench_sampled_timeline import read_kept
from pytest_syncguard.analysis import gaps
from pytest_syncguard.instruments import judge_sampled_region

DATA = Path(__file__).parent / "data" / "sampled_steps"
STRATEGIES = ("no_cache", "kv_cache", "static_cache", "static_compiled", "stream_pingpong", "cuda_graph", "hf_generate")
GPUS = ("h100", "h200")
WARMUP = 2
#: How far before the end of the kernels queued ahead of it a step's event may read (µs): 18.2 us on static_compiled
#: in an earlier H100 run; here two of no_cache's three events in the window read 46.6 and 60.8 us early (not
#: explained: each event is timed from the marker's end, which the samples place to a microsecond).
EVENT_SLACK_US = 65.0


class Run:
    """One kept run: the plugin's timeline of it, and the records that start in its judged part."""

    def __init__(self, name: str) -> None:
        self.name = name
        region, ops = read_kept(DATA / f"{name}.json.gz")
        judged = judge_sampled_region(region, WARMUP)
        assert judged.timeline is not None and judged.steps is not None, judged.problem
        self.timeline, self.steps_ns = judged.timeline, judged.steps.steps_ns
        begin = judged.steps.judged_from(WARMUP)
        self.ops = sorted(op for op in ops if begin <= op[0] <= region.window[1])
        self.busy_us, self.gaps_us = truth(self.ops)


@pytest.fixture(scope="module", params=[f"{gpu}_{name}" for gpu in GPUS for name in STRATEGIES])
def run(request: pytest.FixtureRequest) -> Run:
    return Run(request.param)


def test_steps_come_from_the_events_with_the_warm_up_left_out(run: Run) -> None:
    graph = run.timeline.steps_from == gaps.GRAPH_STEPS
    # 100 forward calls (prefill and 99 decode steps), or 99 graph replays (the first token comes from the prefill).
    assert (run.timeline.steps, run.timeline.warmup_steps) == ((99, 2) if graph else (100, 2))
    assert run.timeline.steps_from == (gaps.GRAPH_STEPS if graph else gaps.FORWARD_STEPS)
    # Each step's event lies where the records divide the device's kernels: after the last one that started before
    # it ended, before the next one started; to within EVENT_SLACK_US.
    spans = run.timeline.step_spans
    assert spans[0].step == WARMUP and len(spans) >= 2
    kernels = [op for op in run.ops if op[2] in ("kernel", "dtod")]
    starts = [a for a, _, _ in kernels]
    placed = 0
    for event in run.steps_ns:
        index = bisect.bisect_left(starts, event)
        if not 0 < index < len(kernels):
            continue
        ended, following = max(b for _, b, _ in kernels[:index]), kernels[index][0]
        assert ended - EVENT_SLACK_US * 1e3 <= event <= following, (event - ended, following - event)
        placed += 1
    assert placed >= 1


def test_the_records_hold_work_that_is_no_kernel(run: Run) -> None:
    """Host copies or memsets are in every strategy's records, and the definition leaves them out: the data tests
    that rule, not only the kernels."""
    labels = {label for _, _, label in run.ops}
    assert "kernel" in labels and labels & {"memset", "copy"}, labels


def test_busy_time_agrees_with_the_records_within_3_percent(run: Run) -> None:
    """H100: -0.5% (static_compiled) to +1.6% (static_cache) here; H200: +0.3% to +1.4%."""
    assert run.timeline.busy_us == pytest.approx(run.busy_us, rel=0.03)


def test_p99_and_widest_gap_agree_with_the_records_within_10_percent_or_2_us(run: Run) -> None:
    """p99 within 4% (H100 static_compiled 2826.4 / 2718.6 us; the others within 2%), the widest gap within 0.5 us,
    on every strategy of both GPUs."""
    for stat in ("p99", "max"):
        expected = gaps.gap_stat(run.gaps_us, stat)
        assert run.timeline.gap_stat(stat) == pytest.approx(expected, rel=0.10, abs=2.0), stat


def test_both_count_the_same_gaps_within_10_percent(run: Run) -> None:
    """664 / 688 on the H100's no_cache (the farthest), 896 / 899 on stream_pingpong. Read as µs since 1970, the
    records gave 741 gaps on no_cache: a float rounds those times to a quarter of a microsecond, and no_cache's
    gaps cluster at the microsecond (test_the_records_are_read_to_the_nanosecond_on_the_wall_clock)."""
    assert len(run.timeline.gaps_us) == pytest.approx(len(run.gaps_us), rel=0.10)


def test_the_records_are_read_to_the_nanosecond_on_the_wall_clock() -> None:
    """The records stand on the host's wall clock (ns since 1970): read as µs there, a float rounds each time to a
    quarter of a microsecond, and gaps of 0.93-1.3 µs (an H100's or H200's time from one queued kernel to the
    next) fell on either side of the microsecond by that rounding alone."""
    clock = 1_795_632_309_104_187_531
    records = [(clock, clock + 5_000, "kernel"), (clock + 5_930, clock + 9_000, "kernel"),
               (clock + 10_100, clock + 12_000, "kernel")]  # fmt: skip
    busy, found = truth(records)
    assert found == pytest.approx([1.1])  # 0.93 us is busy, 1.1 us a gap: to the nanosecond
    assert busy == pytest.approx(12.0 - 1.1)
