"""The instruments that record a test's GPU timelines, behind one interface (:class:`Instrument`).

The session chooses the timeline source once, with its reason (:mod:`.timeline_source`); each test's call gets a
fresh instrument of that source (:func:`for_call`), which holds what it records. The guard's regions ask the
active one what records each run (:func:`active`); the capture asks it for the measurement's timelines. Nothing
else branches on the source:

- :class:`Sampled`: CUPTI's PM sampler over each timed run, which adds nothing to a launch; each ``measure()``'s
  counting run traced alone, for the device time and the exact device-work counts.
- :class:`Traced`: the test's whole call captured with CUPTI's kernel records, regions annotated and found again
  in the trace.
- :class:`CountingRuns`: no timeline, a test on CUDA without a timeline budget: its counting runs traced alone.
- :class:`Instrument` itself records nothing (CPU).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .analysis import gaps, sampled, trace_file
from .analysis.counts import RegionCounts
from .analysis.device_work import NO_COUNTING_RUN, DeviceTime, device_work, uncounted, unreliable_counts
from .analysis.gaps import MARKED_STEPS, Timeline
from .analysis.reliability import sentinel_problem
from .probes import children
from .probes.cuda_calls import CUDA_CALLS, LaunchLog
from .probes.graph_nodes import CENSUS
from .probes.sampler import ACTIVE_CYCLES, ELAPSED_CYCLES, MAX_SAMPLES, SAMPLER, SampledRegion
from .probes.timeline import TIMELINE
from .signals import SIGNALS
from .timeline_source import SAMPLED, TRACE, TimelineSource

if TYPE_CHECKING:
    import torch

    from .measurement import Measurement

#: What a region runs as (:attr:`.guard.GenerationRegion.run`): a timed run, a ``measure()``'s counting run, or a
#: test's whole call (measured when it opens no region of its own; nothing records its timeline on its own).
TIMED_RUN, COUNTING_RUN, WHOLE_CALL = "timed", "counting", "call"


@dataclass
class Instrument:
    """Records no timeline: the interface, and what a call on the CPU gets."""

    source: TimelineSource | None = None
    """The timeline source it is, and why the session chose it (None: it records no timeline)."""
    trace_files: list[Path] = field(default_factory=list)
    """The traces it recorded (the capture keeps a failing test's, and removes them)."""
    outside: dict[int, str] = field(default_factory=dict)
    """Why a trace of a region misses part of its GPU work, by region number: child processes of the test ran in it
    (a trace records the test's process alone)."""

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Around a test's call: arm what records, and make this the instrument the regions ask."""
        global _ACTIVE
        outer, _ACTIVE = _ACTIVE, self
        try:
            with ExitStack() as stack:
                self._arm(stack)
                yield
        finally:
            _ACTIVE = outer

    def _arm(self, stack: ExitStack) -> None:
        """Enter what records over the whole call."""

    def run(self, number: int, kind: str) -> AbstractContextManager[Any]:
        """What records region ``number``'s timeline on its own (``kind``: :data:`TIMED_RUN`, :data:`COUNTING_RUN`
        or :data:`WHOLE_CALL`), entered outside the region's clock."""
        return nullcontext()

    def ended(self, number: int, window: tuple[int, int]) -> None:
        """Region ``number`` ran over ``window`` (wall-clock ns): whether the test's children ran in it too."""
        if ran := children.ran_in(window):
            self.outside[number] = f"{TRACE_SEES_ONE_PROCESS}: {', '.join(ran)}"

    def step_hooks(self, model: torch.nn.Module) -> list[Any]:
        """Hooks that mark each forward call of ``model`` as a decode step in what records now; their handles."""
        return TIMELINE.step_hooks(model) if TIMELINE.tracing else []

    def mark_step(self) -> None:
        """The loop marked a decode step (``region.step()``); a trace annotates it itself."""

    def timelines(self, measurement: Measurement, warmup_steps: int) -> Measurement:
        """The measurement with what this instrument recorded: device time and device work of its traced regions,
        the timeline of each judged one; or, where a recording cannot be trusted, the reason instead."""
        return measurement


@dataclass
class CountingRuns(Instrument):
    """No timeline: each ``measure()``'s counting run traced alone, for the device time and device-work counts."""

    def _arm(self, stack: ExitStack) -> None:
        self.trace_files = stack.enter_context(TIMELINE.per_region())

    def run(self, number: int, kind: str) -> AbstractContextManager[Any]:
        return TIMELINE.region_capture() if kind == COUNTING_RUN else nullcontext()

    def timelines(self, measurement: Measurement, warmup_steps: int) -> Measurement:
        return _with_traced_runs(self.trace_files, measurement, warmup_steps, self.outside, timed_timelines=False)


@dataclass
class Sampled(CountingRuns):
    """The PM sampler over each timed run; the counting runs traced alone, as :class:`CountingRuns`'s."""

    regions: dict[int, SampledRegion] = field(default_factory=dict)
    """The sampled regions, by number."""
    problem: str | None = None
    """Why the sampler could not run in the call, if it could not."""
    sync_stamps: list[tuple[int, str]] = field(default_factory=list)
    """The counted syncs of the sampled runs: (ns on the host's wall clock, the samples' clock; call site)."""
    launch_logs: dict[int, LaunchLog] = field(default_factory=dict)
    """When each sampled run's launch calls returned, by region number."""

    def _arm(self, stack: ExitStack) -> None:
        self.regions = stack.enter_context(SAMPLER.arming())
        stack.callback(self._note_problem)
        self.sync_stamps = stack.enter_context(TIMELINE.stamping())
        super()._arm(stack)

    def _note_problem(self) -> None:
        self.problem = SAMPLER.problem

    def run(self, number: int, kind: str) -> AbstractContextManager[Any]:
        if kind == TIMED_RUN:
            return self._sampled(number)
        return nullcontext() if SAMPLER.sampling else super().run(number, kind)  # no trace inside a sampled run

    @contextmanager
    def _sampled(self, number: int) -> Iterator[None]:
        """A timed run sampled, its launch calls logged (from before the sampler's marker kernel)."""
        with CUDA_CALLS.logging_launches() as log, SAMPLER.region(number):
            yield
        log.graph_nodes = CENSUS.of_launched(graph for _, graph in log.graph_launches)
        self.launch_logs[number] = log

    def step_hooks(self, model: torch.nn.Module) -> list[Any]:
        if SAMPLER.sampling:
            return [model.register_forward_pre_hook(SAMPLER.forward_step)]
        return super().step_hooks(model)

    def mark_step(self) -> None:
        SAMPLER.step(MARKED_STEPS)

    def timelines(self, measurement: Measurement, warmup_steps: int) -> Measurement:
        measurement = _with_traced_runs(self.trace_files, measurement, warmup_steps, self.outside, timed_timelines=True)
        timelines: list[Timeline | None] = []
        unreliable = self.problem
        for n in measurement.region_numbers:
            region = self.regions.get(n)
            if region is None:
                timelines.append(None)
                continue
            if region.samples.overflow:
                unreliable = unreliable or (
                    f"the PM sampler lost samples of region #{n} (its buffer filled, or the region outlasted "
                    f"{MAX_SAMPLES} samples)"
                )
            judged = judge_sampled_region(region, warmup_steps, self.sync_stamps, self.launch_logs.get(n))
            if judged.problem is not None:
                unreliable = unreliable or f"region #{n}: {judged.problem}"
                continue
            timelines.append(judged.timeline)
        if unreliable is not None:
            return replace(measurement, timelines=(), unreliable_timeline=unreliable)
        return replace(measurement, timelines=tuple(timelines))


@dataclass
class Traced(Instrument):
    """The test's whole call captured with CUPTI's kernel records (``host_ops``: every host operator too, for a
    diagnostic run whose timings are not judged)."""

    host_ops: bool = False

    def _arm(self, stack: ExitStack) -> None:
        self.trace_files = stack.enter_context(TIMELINE.capturing(host_ops=self.host_ops))

    def timelines(self, measurement: Measurement, warmup_steps: int) -> Measurement:
        """Every region's device work and device time, and the timeline of each timed one, from the one trace."""
        if not self.trace_files:
            return measurement
        trace = trace_file.load(self.trace_files[0])
        windows = gaps.regions(trace)
        traced = [n for n in _all_regions(measurement) if n in windows]
        found = {n: gaps.analyze(trace, window=windows[n], warmup_steps=warmup_steps) for n in traced}
        timelines = tuple(found.get(n) for n in measurement.region_numbers)
        problem = sentinel_problem(trace) or next((t.unreliable for t in timelines if t and t.unreliable), None)
        problem = problem or next((self.outside[n] for n in traced if n in self.outside), None)
        counts = dict(measurement.region_counts)
        for n in traced:
            _add_work(counts, n, trace, windows[n], problem)
        if problem is not None:
            return replace(measurement, timelines=(), region_counts=counts, unreliable_timeline=problem)
        return replace(measurement, timelines=timelines, region_counts=counts, device_times=_device_times(found))


#: Why a trace's reading of a region in which the test's child processes ran is not its GPU work.
TRACE_SEES_ONE_PROCESS = (
    "a trace records the GPU work of the test's process alone, and child processes of the test ran in the region "
    "(their kernels would read as idle time; the sampled default samples the whole device)"
)

#: The instrument of each timeline source, by its name.
TIMELINE_INSTRUMENTS: dict[str, type[Instrument]] = {SAMPLED: Sampled, TRACE: Traced}


def for_call(source: TimelineSource | None, *, cuda: bool) -> Instrument:
    """A fresh instrument for one test's call: of the session's timeline ``source`` where the test's budgets need
    a timeline on CUDA, else one that traces counting runs for the device time (CUDA), else none."""
    if source is not None:
        return TIMELINE_INSTRUMENTS[source.name](source)
    return CountingRuns() if cuda else Instrument()


_ACTIVE = Instrument()


def active() -> Instrument:
    """The instrument of the call being recorded (one that records nothing outside a call)."""
    return _ACTIVE


def _with_traced_runs(
    files: Sequence[Path],
    measurement: Measurement,
    warmup_steps: int,
    outside: Mapping[int, str],
    *,
    timed_timelines: bool,
) -> Measurement:
    """The device work and device time of each region traced on its own (a counting run); none, and why, for a
    region in which part of the work ran outside the trace (``outside``: child processes). Where the timed runs'
    timelines are wanted (``timed_timelines``), a ``measure()`` or region with no traced run counts no device
    work, and says why."""
    counts = dict(measurement.region_counts)
    found: dict[int, Timeline | None] = {}
    traced = {read.part: dict(measurement.part(read.part)) for signal in SIGNALS for read in signal.traced}
    for path in files:
        trace = trace_file.load(path)
        unreliable = sentinel_problem(trace)
        for n, window in gaps.regions(trace).items():
            problem = unreliable or outside.get(n)
            _add_work(counts, n, trace, window, problem)
            if problem is None:  # each signal's own reading of the region
                for read in (read for signal in SIGNALS for read in signal.traced):
                    traced[read.part][n] = read.read(trace, window)
            timeline = gaps.analyze(trace, window=window, warmup_steps=warmup_steps)
            found[n] = timeline if problem is None and (timeline is None or timeline.unreliable is None) else None
    if timed_timelines:
        for part in measurement.count_parts:
            if found.keys().isdisjoint(part):
                for n in part:
                    counts[n] = counts.get(n, RegionCounts()).merged(uncounted(NO_COUNTING_RUN))
    parts = {**measurement.parts, **traced}
    return replace(measurement, region_counts=counts, device_times=_device_times(found), parts=parts)


@dataclass(frozen=True)
class SampledJudgement:
    """One sampled region as the plugin judges it: its timeline (None: no device work in its judged part), why its
    steps could not be placed, and where they were placed."""

    timeline: Timeline | None
    problem: str | None = None
    steps: sampled.PlacedSteps | None = None


def judge_sampled_region(
    region: SampledRegion,
    warmup_steps: int,
    syncs: Sequence[tuple[int, str]] = (),
    launches: LaunchLog | None = None,
) -> SampledJudgement:
    """The timeline of a sampled region's judged steps, its steps placed by its events, with the counted ``syncs``
    (ns on the samples' clock, call site) that the host made in its judged part, as a trace keeps them, and its
    gaps attributed with its ``launches`` where they were logged."""
    samples = region.samples
    fractions = sampled.active_fractions(samples.column(ACTIVE_CYCLES), samples.column(ELAPSED_CYCLES))
    placed, judged = None, region.window
    if region.events is not None:
        found = sampled.place_steps(
            samples.start_ns, samples.end_ns, fractions, region.window, region.events, samples.interval_ns
        )
        if isinstance(found, str):
            return SampledJudgement(None, found)
        placed, judged = found, (found.judged_from(warmup_steps), region.window[1])
    timeline = sampled.analyze(samples.start_ns, samples.end_ns, fractions, region.window, placed, warmup_steps)
    on_samples: sampled.LaunchesOnSamples | str = sampled.NOT_LOGGED
    if launches is not None:
        on_samples = launches.not_logged or (
            sampled.launches_on_samples(
                launches.returned_ns, placed, region.window[0], launches.graphs(), launches.entered_ns
            )
            if placed is not None
            else "the region's steps, which place its launches, could not be placed"
        )
    judged_timeline = timeline.timeline(syncs=syncs, window=judged, launches=on_samples) if timeline.span_us else None
    return SampledJudgement(judged_timeline, steps=placed)


def _add_work(
    counts: dict[int, RegionCounts],
    number: int,
    trace: trace_file.Trace,
    window: tuple[float, float],
    problem: str | None,
) -> None:
    """Region ``number``'s device work in ``window`` of its trace joins its counts; where the trace cannot be trusted
    (``problem``), the reason it has none does."""
    work = device_work(trace, window) if problem is None else unreliable_counts(problem)
    counts[number] = counts.get(number, RegionCounts()).merged(work)


def _all_regions(measurement: Measurement) -> list[int]:
    """The numbers of every region of a measurement: its timed ones and the counting runs of its parts."""
    numbers = dict.fromkeys(measurement.region_numbers)
    numbers.update(dict.fromkeys(n for part in measurement.count_parts for n in part))
    return list(numbers)


def _device_times(timelines: dict[int, Timeline | None]) -> dict[int, DeviceTime]:
    """The device time of each traced region that launched device work."""
    return {n: DeviceTime(t.busy_us, t.judged_steps, t.steps) for n, t in timelines.items() if t is not None}
