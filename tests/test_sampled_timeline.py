"""The sampled timeline (``--syncguard-timeline=sampled``) without a GPU: the estimator on hand-made samples, the
plugin's verdicts over recorded H100 samples, the option, and the sampler's parameter structs against CUPTI's
headers (its agreement with CUPTI's records of the same runs: tests/test_sampled_steps.py).

tests/data/sampled/h100_*.json.gz: one run each of kv_cache and cuda_graph (GPT-2 124M, batch 32, 100 new tokens)
on an H100 80GB HBM3, sampled every microsecond (``gr__compute_cycles_active.sum``, ``gr__cycles_elapsed.max``)
while CUPTI recorded every kernel, memcpy and memset of the same run on the same GPU clock:
``python -m bench.bench_pm_sampling --pairs grc --agreement-interval-ns 1000 --agreement kv_cache,cuda_graph
--strategies "" --keep DIR``, then ``python devtools/trim_samples.py DIR/NAME.samples.json.gz OUT --ms 60`` (a 60 ms
window around each run's widest gap).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_syncguard.analysis import gaps, sampled
from pytest_syncguard.analysis.counts import RegionCounts
from pytest_syncguard.analysis.device_work import NO_COUNTING_RUN
from pytest_syncguard.budgets import GuardOptions, check_budgets
from pytest_syncguard.capture import CallCapture
from pytest_syncguard.document.budget import Budget
from pytest_syncguard.guard import SyncGuard
from pytest_syncguard.instruments import Sampled
from pytest_syncguard.measurement import Measurement
from pytest_syncguard.probes import pm_sampling
from pytest_syncguard.probes.pm_sampling import Samples
from pytest_syncguard.probes.sampler import ACTIVE_CYCLES, ELAPSED_CYCLES, SampledRegion
from pytest_syncguard.timeline_source import SAMPLED, TimelineSource

DATA = Path(__file__).parent / "data" / "sampled"
#: How much later than the samples show the engine active a sampled gap ends (µs): the front end's lead.
LEAD = sampled.KERNEL_LEAD_NS / 1e3


def test_idle_parts_of_partly_active_samples_join_their_idle_neighbours() -> None:
    # 1 us samples: busy, half busy, idle, quarter busy, busy; then alone between busy ones, a 0.6-busy sample.
    starts = [0, 1000, 2000, 3000, 4000, 5000, 6000]
    ends = [s + 1000 for s in starts]
    found = sampled.analyze(starts, ends, [1.0, 0.5, 0.0, 0.25, 1.0, 0.6, 1.0])
    # 0.5 us at the end of sample 1, sample 2, 0.75 us at the start of sample 3: one 2.25 us gap, which ends the
    # front end's lead later; 0.4 us alone is under a microsecond, even so: busy.
    assert len(found.gaps) == 1 and found.gaps[0] == pytest.approx((1.5, 2.25 + LEAD))
    assert found.busy_us == pytest.approx(7.0 - 2.25 - LEAD)
    assert found.span_us == 7.0
    # A partly active sample between two idle ones gives half its idle time to each: a short kernel inside it.
    both = sampled.analyze([0, 1000, 2000, 3000, 4000], [1000, 2000, 3000, 4000, 5000], [1.0, 0.0, 0.5, 0.0, 1.0])
    assert [g for gap in both.gaps for g in gap] == pytest.approx([1.0, 1.25 + LEAD, 2.75, 1.25 + LEAD])


def test_a_region_runs_from_its_first_active_sample_to_its_last_and_every_gap_counts() -> None:
    starts = list(range(0, 10_000, 1000))
    ends = [s + 1000 for s in starts]
    fractions = [0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    found = sampled.analyze(starts, ends, fractions, (500, 9500))
    assert (found.span_us, found.busy_us) == pytest.approx((7.0, 3.0 - 2 * LEAD))
    assert found.gaps_us == pytest.approx((1.0 + LEAD, 3.0 + LEAD))
    assert sampled.analyze(starts, ends, [0.0] * 10).span_us == 0.0
    timeline = found.timeline(top=1)
    assert timeline.gap_stat("max") == pytest.approx(3.0 + LEAD) and timeline.busy_fraction == pytest.approx(
        (3 - 2 * LEAD) / 7
    )
    # From the region's first active sample, which began at 2 us.
    (top,) = timeline.top_gaps
    assert (top.duration_us, top.start_us) == pytest.approx((3.0 + LEAD, 3.0)) and top.cause == sampled.IDLE
    assert timeline.origin_us == 2.0
    assert timeline.steps_from == sampled.SAMPLED_STEPS
    # The busy stretches between the gaps: the gaps lie between them, their busy time adds up.
    runs = [x for run in timeline.runs for x in run]
    assert runs == pytest.approx([0.0, 1.0, 1.0, 2.0 + LEAD, 3.0, 1.0 - LEAD, 6.0 + LEAD, 7.0, 1.0 - LEAD])
    # An idle stretch under a microsecond is no gap, as in a trace: the 0.5 us idle parts of partly active samples
    # between busy ones are busy time; the 3 us gap is the one gap.
    short = sampled.analyze(list(range(0, 9000, 1000)), list(range(1000, 10_000, 1000)),
                            [1.0, 0.5, 1.0, 0.5, 1.0, 0.0, 0.0, 0.0, 1.0])  # fmt: skip
    assert short.gaps_us == pytest.approx((3.0 + LEAD,)) and short.busy_us == pytest.approx(9.0 - 3.0 - LEAD)


def test_the_busy_of_a_sampled_timeline_is_the_sum_of_its_runs_and_every_sample_counts_once() -> None:
    starts = list(range(0, 12_000, 1000))
    ends = [s + 1000 for s in starts]
    fractions = [0.3, 1.0, 0.5, 0.01, 0.0, 0.25, 1.0, 0.6, 0.0, 0.015, 0.9, 1.0]
    found = sampled.analyze(starts, ends, fractions)
    # Busy is the span less the gaps (an idle stretch under a microsecond is busy), in every source.
    assert found.busy_us == pytest.approx(found.span_us - sum(found.gaps_us))
    assert sum(run.busy for run in found.runs) == pytest.approx(found.busy_us)
    assert len(found.runs) == len(found.gaps) + 1
    for (gap_start, length), before, after in zip(found.gaps, found.runs, found.runs[1:], strict=False):
        assert before.end == pytest.approx(gap_start) and after.start == pytest.approx(gap_start + length)
        assert before.busy == pytest.approx(before.end - before.start)


def _load(name: str) -> dict[str, Any]:
    with gzip.open(DATA / f"h100_{name}.json.gz", "rt") as source:
        data: dict[str, Any] = json.load(source)
    return data


def test_a_sampled_gap_in_which_a_counted_sync_returned_is_a_host_sync_with_its_call_site() -> None:
    """The trace's rule on the host's stamps: a sync that returned after the device went idle and before it
    resumed made the gap (the last such one is named); a gap with none is idle, and says what it cannot tell."""
    data = _load("kv_cache")
    fractions = sampled.active_fractions([v[0] for v in data["values"]], [v[1] for v in data["values"]])
    found = sampled.analyze(data["start_ns"], data["end_ns"], fractions)
    top = sorted(found.gaps, key=lambda g: -g[1])[:10]
    (widest_start, widest) = top[0]
    origin = found.origin_ns
    at = round((widest_start + 20) * 1e3) + origin  # returned 20 us into the widest gap

    def in_a_top_gap(time: float) -> bool:
        return any(start - sampled.CLOCK_SLACK_US <= time <= start + length for start, length in top)

    # Another of the largest gaps, and a sync that returned long before it began, in none of them.
    other, early = next((g, g[0] - 1.5 * sampled.CLOCK_SLACK_US) for g in top[1:]
                        if not in_a_top_gap(g[0] - 1.5 * sampled.CLOCK_SLACK_US))  # fmt: skip
    syncs = [
        (at - 1000, "scalar read at loop.py:3 in step"),
        (at, "scalar read at loop.py:9 in step"),
        (round(early * 1e3) + origin, "scalar read at loop.py:12 in step"),
    ]
    attributed = {g.start_us: g for g in found.timeline(syncs=syncs).top_gaps}
    first, second = attributed[widest_start], attributed[other[0]]
    assert (first.cause, first.duration_us) == (gaps.HOST_SYNC, widest)
    assert first.detail.startswith(f"scalar read at loop.py:9 in step; the device resumed {widest - 20:.0f} us after")
    # The third sync returned long before the second gap began: it did not make it.
    assert (second.cause, second.detail) == (sampled.IDLE, sampled.IDLE_DETAIL.format(why=sampled.NOT_LOGGED))
    assert "launches were not logged" in second.detail and "--syncguard-gap-ops" in second.detail


def _capture_of(name: str, *, overflow: bool = False) -> tuple[CallCapture, Measurement]:
    """The plugin's capture of one sampled region holding the recorded samples (as the sampler leaves them)."""
    data = _load(name)
    guard = SyncGuard("sampled", device="cuda")
    budgets = [Budget("max_gpu_idle_us", 1000.0), Budget("min_gpu_busy", 0.5), Budget("max_launches_per_token", 300)]
    source = TimelineSource(SAMPLED, "the test's")
    capture = CallCapture("sampled", guard, budgets, GuardOptions(), Sampled(source))
    samples = Samples.of_rows(data["metrics"], data["start_ns"], data["end_ns"], data["values"], overflow)
    window = (data["start_ns"][0], data["end_ns"][-1])
    capture.instrument.regions = {7: SampledRegion(samples, window)}
    measurement = Measurement(
        "cuda", 100, (), region_numbers=(7,), region_counts={7: RegionCounts()}, count_parts=((7,),)
    )
    return capture, measurement


def test_the_plugin_judges_a_sampled_region_and_says_what_it_did_not_count() -> None:
    capture, measurement = _capture_of("kv_cache")
    judged = capture.with_timelines(measurement)
    (timeline,) = judged.gpu_timelines
    checks, error = check_budgets("sampled", capture.budgets, judged, require_gpu=True)
    texts = [c.text for c in checks]
    print("\n".join(texts))
    assert error is None
    idle, busy, launches = checks
    assert idle.held is False and idle.value == timeline.gap_stat("max") > 6000
    assert "no steps" in idle.text
    assert busy.held is False and busy.value == pytest.approx(timeline.busy_fraction) and busy.value < 0.5
    assert launches.held is False and launches.value is None and NO_COUNTING_RUN in launches.text
    assert timeline.top_gaps[0].cause == sampled.IDLE and "--syncguard-gap-ops" in timeline.top_gaps[0].detail


def test_samples_lost_in_a_region_make_its_timeline_unreliable() -> None:
    capture, measurement = _capture_of("cuda_graph", overflow=True)
    judged = capture.with_timelines(measurement)
    assert judged.timelines == () and judged.unreliable_timeline is not None
    assert "lost samples of region #7" in judged.unreliable_timeline
    checks, _ = check_budgets("sampled", capture.budgets[:2], judged, require_gpu=False)
    assert all(c.held is False and "unreliable: the PM sampler lost samples" in c.text for c in checks)
    capture.instrument.problem = "the PM sampler could not run: insufficient privileges"
    assert capture.with_timelines(measurement).unreliable_timeline == capture.instrument.problem


PLAIN = """
import pytest

@pytest.mark.max_gpu_idle_us(100)
def test_loop(syncguard):
    with syncguard.generation(tokens=2):
        pass
"""


def test_the_option_is_checked_and_a_cpu_run_is_not_measured(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain=PLAIN)
    bad = pytester.runpytest("--syncguard-timeline=sampling")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--syncguard-timeline: invalid choice: 'sampling'*"])
    pytester.makeini("[pytest]\nsyncguard_timeline = sample\n")
    ini = pytester.runpytest()
    assert ini.ret == pytest.ExitCode.USAGE_ERROR
    ini.stderr.fnmatch_lines(["*ini syncguard_timeline = 'sample': must be one of auto, trace, sampled*"])
    pytester.makeini("[pytest]\n")
    ran = pytester.runpytest("--syncguard", "-p", "no:cacheprovider")  # the default, auto: nothing to sample here
    ran.assert_outcomes(skipped=1)
    ran.stdout.fnmatch_lines(["*test_loop  cpu*max_gpu_idle_us(max)<=100*NOT MEASURED*"])
    # Forcing the sampler where it cannot run (here: the sampler's own loader finds no libcupti) is a usage error
    # before any test runs, never a silent fallback to the trace.
    forced = pytester.runpytest("--syncguard", "--syncguard-timeline=sampled", "-p", "no:cacheprovider")
    assert forced.ret == pytest.ExitCode.USAGE_ERROR
    forced.stderr.fnmatch_lines(["*--syncguard-timeline=sampled: the PM sampler cannot run here: no libcupti*"])


def test_the_sampler_parameter_structs_have_the_sizes_of_cuptis_headers() -> None:
    """structSize of each struct, as CUPTI_PROFILER_STRUCT_SIZE computes it from cupti_pmsampling.h,
    cupti_profiler_host.h and cupti_target.h of CUPTI 13.0 (compiled and printed with g++)."""
    sizes = {
        "_SetConfig": 64, "_Enable": 32, "_Decode": 45, "_DataSize": 56, "_DataInit": 40, "_DataInfo": 56,
        "_SampleInfo": 64, "_HostInit": 48, "_Evaluate": 72, "_AddMetrics": 40, "_ConfigImage": 40,
        "_ChipName": 32, "_Plain": 16, "_Object": 24, "_ConfigSize": 32,
    }  # fmt: skip
    assert {name: getattr(pm_sampling, name)().structSize for name in sizes} == sizes


@pytest.mark.parametrize("name", ["kv_cache", "cuda_graph"])
def test_a_sampled_timeline_does_not_depend_on_where_its_clock_stands(name: str) -> None:
    """The samples' clock is the wall clock in ns (about 1.8e18, past a float's 2**53): the timeline of the recorded
    samples is the one of the same samples moved to 0, to the bit, so no boundary is rounded to 256 ns."""
    data = _load(name)
    fractions = sampled.active_fractions([v[0] for v in data["values"]], [v[1] for v in data["values"]])
    base = data["start_ns"][0]
    assert base > 2**60
    wall = sampled.analyze(data["start_ns"], data["end_ns"], fractions)
    moved = sampled.analyze([s - base for s in data["start_ns"]], [e - base for e in data["end_ns"]], fractions)
    assert (wall.busy_us, wall.span_us, wall.gaps, wall.runs) == (moved.busy_us, moved.span_us, moved.gaps, moved.runs)
    assert wall.origin_ns == base and moved.origin_ns == 0
    # Every stretch between two gaps has a length, and they follow each other in time.
    assert all(a.start < a.end <= b.start for a, b in zip(wall.runs, wall.runs[1:], strict=False))


# -- steps on the samples' clock ---------------------------------------------------------------------------------
#: The wall clock in ns, where the samples' timestamps stand (past a float's 2**53).
CLOCK = 1_764_000_000_000_000_000
#: One loop's device work (µs): step 0 (a warm-up step), then steps 1 to 3, the last ending inside a sample.
KERNELS = [(40.0, 60.0), (70.0, 90.0), (120.0, 140.0), (145.0, 160.5)]
#: When the host marked each step (µs), and when each kernel was launched (the trace's host side).
STEP_MARKS, LAUNCHES = [38.0, 65.0, 100.0, 142.0], [39.0, 66.0, 101.0, 143.0]
#: The anchor event (µs) and the marker kernel launched after it, ending at 25 µs.
ANCHOR, MARKER = 3.0, (5.0, 25.0)


def _samples_of(busy: list[tuple[float, float]], until_us: int = 171) -> tuple[list[int], list[int], list[float]]:
    """1 µs samples of the device doing ``busy`` (µs): each sample's active share."""
    starts = [CLOCK + i * 1000 for i in range(until_us)]
    fractions = [sum(max(0.0, min(b, i + 1) - max(a, i)) for a, b in busy) for i in range(until_us)]
    return starts, [s + 1000 for s in starts], fractions


def _events(step_marks: list[float]) -> sampled.StepEvents:
    """What the CUDA events give: each step's event completes when the host recorded it or, later, when the work
    queued before it had finished; times from the anchor."""
    done, completed = MARKER[1], []
    for mark in step_marks:
        before = [end for start, end in KERNELS if end <= mark or start < mark]
        completed.append(max([mark, done, *before]) - ANCHOR)
    return sampled.StepEvents(MARKER[1] - ANCHOR, tuple(completed), gaps.MARKED_STEPS)


def _trace_of_the_same_loop() -> gaps.Timeline:
    from pytest_syncguard.analysis import trace_file

    events: list[dict[str, Any]] = []
    for correlation, ((start, end), launch) in enumerate(zip(KERNELS, LAUNCHES, strict=True), 1):
        events.append({"ph": "X", "cat": "kernel", "name": f"k{correlation}", "pid": 0, "tid": 7, "ts": start,
                       "dur": end - start, "args": {"stream": 7, "correlation": correlation}})  # fmt: skip
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": launch, "dur": 0.5, "args": {"correlation": correlation}})  # fmt: skip
    for mark, following in zip(STEP_MARKS, [*STEP_MARKS[1:], 170.0], strict=True):
        events.append({"ph": "X", "cat": "user_annotation", "name": gaps.MARKED_STEP_ANNOTATION, "pid": 1,
                       "tid": 1, "ts": mark, "dur": following - mark})  # fmt: skip
    timeline = gaps.analyze(trace_file.from_events(events), warmup_steps=1)
    assert timeline is not None
    return timeline


def test_steps_placed_by_events_judge_the_same_gaps_steps_and_busy_time_as_a_trace_of_the_same_loop() -> None:
    """One definition for both sources: the same device work, steps marked by the host, and the first step left out
    as warm-up give a sampled timeline whose gaps, steps, busy time, span and step spans are the trace's."""
    starts, ends, fractions = _samples_of([MARKER, *KERNELS])
    window = (CLOCK + 1000, CLOCK + 171_000)  # the host's stamps around the region
    placed = sampled.place_steps(starts, ends, fractions, window, _events(STEP_MARKS))
    assert isinstance(placed, sampled.PlacedSteps)
    assert placed.begin_ns == CLOCK + 25_000  # the marker's end: its own work is never judged
    assert placed.steps_ns == tuple(CLOCK + round(us * 1000) for us in (38, 65, 100, 142))
    found = sampled.analyze(starts, ends, fractions, window, placed, warmup_steps=1)
    timeline, trace = found.timeline(), _trace_of_the_same_loop()
    assert (timeline.steps, timeline.warmup_steps, timeline.judged_steps) == (4, 1, 3) == (
        trace.steps, trace.warmup_steps, trace.judged_steps)  # fmt: skip
    # The samples' gaps end the front end's lead later than the kernels' records (KERNEL_LEAD_NS): ideal samples
    # of the records' kernels read each gap that much longer.
    assert timeline.gaps_us == pytest.approx(tuple(g + LEAD for g in trace.gaps_us)) and trace.gaps_us == (30.0, 5.0)
    assert timeline.busy_us == pytest.approx(trace.busy_us - 2 * LEAD) and trace.busy_us == 55.5
    assert timeline.span_us == trace.span_us == 90.5
    # Each gap belongs to the step whose first op ended it, as the trace gives it from the host's launches.
    # (pytest 9's approx takes no nested tuples: durations and steps apart.)
    assert [g.duration_us - LEAD for g in timeline.top_gaps] == pytest.approx([g.duration_us for g in trace.top_gaps])
    assert [g.step for g in timeline.top_gaps] == [g.step for g in trace.top_gaps]
    assert [g.step for g in timeline.top_gaps] == [2, 3]
    assert timeline.steps_from == gaps.MARKED_STEPS
    first = trace.step_spans[0].start  # the trace's own clock; the sampled one runs from the judged part's start
    # A step's span begins where its first busy stretch does: the front end's lead after the samples show it.
    assert [s.step for s in timeline.step_spans] == [s.step for s in trace.step_spans]
    assert [x for s in timeline.step_spans for x in (s.start, s.end)] == pytest.approx(
        [x for s in trace.step_spans for x in (s.start - first + (LEAD if s.start > first else 0), s.end - first)]
    )
    # Without warm-up, step 0 and the gap before step 1 are judged too; never the marker.
    every = sampled.analyze(starts, ends, fractions, window, placed).timeline()
    assert every.gaps_us == pytest.approx((10.0 + LEAD, 30.0 + LEAD, 5.0 + LEAD))
    # Every step a warm-up step: nothing is judged, as a trace judges nothing.
    assert sampled.analyze(starts, ends, fractions, window, placed, warmup_steps=4).span_us == 0.0


def test_a_region_without_steps_is_judged_whole_after_its_marker_and_a_marker_run_into_work_is_a_problem() -> None:
    starts, ends, fractions = _samples_of([MARKER, *KERNELS])
    window = (CLOCK, CLOCK + 171_000)
    placed = sampled.place_steps(starts, ends, fractions, window, sampled.StepEvents(MARKER[1] - ANCHOR))
    assert isinstance(placed, sampled.PlacedSteps) and placed.steps_ns == ()
    whole = sampled.analyze(starts, ends, fractions, window, placed, warmup_steps=2)
    assert whole.gaps_us == pytest.approx((10.0 + LEAD, 30.0 + LEAD, 5.0 + LEAD))
    assert whole.timeline().steps_from == sampled.SAMPLED_STEPS and whole.timeline().judged_steps == 0
    # The loop's first kernel right after the marker, with no idle sample between: the steps cannot be placed.
    joined, ends, fractions = _samples_of([MARKER, (25.0, 60.0), *KERNELS[1:]])
    problem = sampled.place_steps(joined, ends, fractions, window, _events(STEP_MARKS))
    assert isinstance(problem, str) and "ran into other device work (active for 55.0 us" in problem
    nothing = sampled.place_steps(joined, ends, [0.0] * len(joined), window, _events(STEP_MARKS))
    assert isinstance(nothing, str) and "not even the marker kernel" in nothing


def test_the_plugin_judges_the_steps_of_a_sampled_region_by_its_events() -> None:
    starts, ends, fractions = _samples_of([MARKER, *KERNELS])
    samples = Samples.of_rows((ACTIVE_CYCLES, ELAPSED_CYCLES), starts, ends, [(f * 1000, 1000.0) for f in fractions])
    guard = SyncGuard("sampled", device="cuda")
    instrument = Sampled(TimelineSource(SAMPLED, "the test's"))
    capture = CallCapture("sampled", guard, [Budget("max_gpu_idle_us", 20.0)], GuardOptions(warmup_steps=1), instrument)
    instrument.regions = {
        7: SampledRegion(samples, (CLOCK + 1000, CLOCK + 171_000), _events(STEP_MARKS)),
        8: SampledRegion(samples, (CLOCK + 1000, CLOCK + 171_000), sampled.StepEvents(5.0)),
    }
    measurement = Measurement("cuda", 3, (), region_numbers=(7,), region_counts={7: RegionCounts()},
                              count_parts=((7,),))  # fmt: skip
    judged = capture.with_timelines(measurement)
    (timeline,) = judged.gpu_timelines
    assert timeline.judged_steps == 3 and timeline.gaps_us == pytest.approx((30.0 + LEAD, 5.0 + LEAD))
    (check,) = check_budgets("sampled", capture.budgets, judged, require_gpu=True)[0]
    assert check.held is False and "3 steps judged after 1 warm-up; steps: marked" in check.text
    # Region 8's marker ran 20 us in the samples but ended 5 us after its anchor: its timeline is unreliable.
    broken = capture.with_timelines(replace(measurement, region_numbers=(8,)))
    assert broken.unreliable_timeline is not None and broken.unreliable_timeline.startswith("region #8: ")


def test_samples_are_held_as_one_object_each_to_the_garbage_collector() -> None:
    """A region's million samples as tuples made the next collection visit each one: on H100 hosts it took
    112-151 ms inside the next timed run, and became its widest gap. An array is one object to the collector,
    however many samples it holds."""
    import gc

    built = Samples.of_rows((ACTIVE_CYCLES, ELAPSED_CYCLES), [0, 1000, 2000], [1000, 2000, 3000],
                            [(500.0, 1000.0), (0.0, 1000.0), (1000.0, 1000.0)])  # fmt: skip
    for samples in (built, built.picked([0, 2])):
        for part in (samples.start_ns, samples.end_ns, *samples.columns):
            assert not any(isinstance(x, int | float | tuple) for x in gc.get_referents(part))
    assert list(built.picked([0, 2]).column(ACTIVE_CYCLES)) == [500.0, 1000.0]
    assert list(built.picked([0, 2]).end_ns) == [1000, 3000] and built.picked([0, 2]).completed == 2


WORKER_SOURCE = """
from pathlib import Path


def pytest_sessionfinish(session):
    # The workers' own id: an outer xdist run (the suite under -n) sets PYTEST_XDIST_WORKER for the controller too.
    worker = getattr(session.config, "workerinput", {}).get("workerid")
    if worker:
        source = session.config.pluginmanager.get_plugin("syncguard-session").timeline_source()
        Path(f"source-{worker}.txt").write_text(f"{source.name}: {source.why}")
"""


def test_xdist_workers_that_share_a_gpu_take_the_trace_and_say_why(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU's PM sampler serves one process at a time: workers sharing a GPU cannot all sample it, so their
    timelines come from the trace, with the reason (never a region that fails because another worker sampled)."""
    pytest.importorskip("xdist")
    pytester.makeconftest(WORKER_SOURCE)
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    result = pytester.runpytest_subprocess("-n", "2", "--syncguard", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    for worker in ("gw0", "gw1"):
        assert (pytester.path / f"source-{worker}.txt").read_text() == (
            "trace: the trace stands in: the PM sampler cannot run here: 2 xdist workers share 1 GPU(s), and a "
            "GPU's PM sampler serves one process at a time; docs/howto/ci-gpu-runner.md says what a runner needs"
        )
