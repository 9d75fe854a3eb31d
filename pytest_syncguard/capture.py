"""Running one test's capture: its syncs (the test's regions, else the whole call), and the GPU timeline and
allocator numbers when its budgets need them and it runs on CUDA; afterwards the measurement, its budget
checks, its baseline comparison and the files of a failing test. The diagnostic reruns of a failing test (every
host operator recorded, or the allocator history) are here too: what they record would slow the judged run.

torch.profiler does not nest, so the timeline is recorded over the whole call with the regions annotated, and
found again per region in the trace.
"""

from __future__ import annotations

import gzip
import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from .analysis import gaps, sampled, snapshot, trace_file
from .analysis.counts import RegionCounts
from .analysis.device_work import NO_COUNTING_RUN, DeviceTime, device_work, uncounted, unreliable_counts
from .analysis.gaps import Timeline, TimelineSummary
from .analysis.reliability import sentinel_problem
from .analysis.snapshot import AllocationSite
from .baselines import BaselineError, BaselineStore
from .budgets import Budget, GuardOptions, check_budgets, with_default_checks
from .environment import host_id, slug_for
from .guard import GenerationRegion, Measurement, SyncGuard
from .probes.memory import allocation_history, out_of_memory
from .probes.sampler import ACTIVE_CYCLES, ELAPSED_CYCLES, MAX_SAMPLES, SAMPLER, SampledRegion
from .probes.timeline import TIMELINE
from .report import perfetto
from .result import MeasuredTest
from .timeline_source import SAMPLED, TRACE, TimelineSource


def artifact_stem(nodeid: str) -> str:
    """A file name for a test: its node id with everything but letters, digits, '.', '-' and '_' replaced."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", nodeid).strip("_")[:180] or "test"


def _out_of_memory_note(nodeid: str, measurement: Measurement) -> str | None:
    """Which allocator numbers of the test are not its own because the GPU's memory ran out in a region."""
    why = measurement.uncounted("device_mallocs")
    retried = [stats.alloc_retries for stats in measurement.memory if stats.alloc_retries]
    if why is None and not retried:
        return None
    # The driver calls are the fewest run's, of the runs that counted them (analysis.counts.FEWEST).
    left = "reserved_mb and fragmentation" if why else "reserved_mb, fragmentation, device_mallocs and device_frees"
    left_out = [
        *(["device_mallocs and device_frees not measured"] if why is not None else []),
        *([f"{left} left out of {len(retried)} region reading(s)"] if retried else []),
    ]
    return f"syncguard: {nodeid}: {'; '.join(left_out)}: {why or out_of_memory(sum(retried))}"


def _python_kernel_note() -> str | None:
    """What the native extension's absence cost the measurement (every counter it feeds), why it is absent and
    the fix, unless the user switched it off."""
    from .probes.native import FEEDS, FIX, NATIVE

    why = NATIVE.unavailable
    if why is None or why.startswith("switched off"):
        return None
    return f"syncguard: the native kernels {why}: {FEEDS}. Fix: {FIX}"


def outcome_of(raised: BaseException) -> str:
    """What pytest makes of a call that raised: skipped (pytest.skip, xfail's skip), else failed."""
    import pytest

    return "skipped" if isinstance(raised, pytest.skip.Exception) else "failed"


def close_left_open(guard: SyncGuard) -> str | None:
    """Close what a test's call left open (a region or ``allow()`` block whose generator was never closed), so
    that none of it counts the next test's syncs; what it was, in words (None: nothing)."""
    from .probes.races import RACES
    from .probes.syncs import PROBE

    regions = guard.abandon_open_regions()
    recorders, allowances = PROBE.left_open()
    RACES.reset()
    PROBE.reset()
    what = []
    if regions or recorders:
        what.append(f"{regions or recorders} measured region(s) of syncguard.generation()/measure()")
    if allowances:
        what.append(f"{allowances} syncguard.allow() block(s)")
    if not what:
        return None
    return (
        f"the test left {' and '.join(what)} open after its call (a generator suspended inside one and never "
        "closed?): its measurement is incomplete; syncguard closed them so that the next test is measured alone"
    )


@dataclass
class CallCapture:
    """The capture of one test's call: its guard's regions, else the whole call, and the timeline and allocator
    recordings its budgets need."""

    nodeid: str
    guard: SyncGuard
    budgets: Sequence[Budget]
    options: GuardOptions
    timeline: bool
    memory: bool
    source: TimelineSource | None = None
    """Where the test's GPU timelines come from and why (None: it has none on CUDA)."""
    device_time: bool = False
    """On CUDA: trace each ``measure()``'s counting run (the whole call when its timeline is captured) for the
    device's own time per token and the exact device-work counts; the timed runs are not traced."""
    host_ops: bool = False
    """Record every host operator in the timeline (a diagnostic run: slows the host)."""
    history: bool = False
    """Record the allocator history with Python stacks (a diagnostic run: slows every allocation)."""
    trace_files: list[Path] = field(default_factory=list)
    sampled_regions: dict[int, SampledRegion] = field(default_factory=dict)
    sampler_problem: str | None = None
    sync_stamps: list[tuple[int, str]] = field(default_factory=list)
    """The counted syncs of the sampled runs: (ns on the host's wall clock, the samples' clock; call site)."""
    snapshots: list[Path] = field(default_factory=list)
    judged: Measurement | None = None
    """The measurement the test's budgets judged, with its timelines."""
    whole_call: GenerationRegion | None = None
    misuse: str | None = None
    """Why the measurement of the call cannot be trusted (it left a region open, a marker came late), in words."""

    @classmethod
    def of(
        cls,
        nodeid: str,
        guard: SyncGuard,
        budgets: Sequence[Budget],
        options: GuardOptions,
        *,
        default_checks: bool = False,
        sampled: bool = False,
        source: Callable[[], TimelineSource] | None = None,
    ) -> CallCapture:
        """The capture a test's budgets need; ``default_checks`` (--syncguard) adds the checks that are on by
        default (:func:`.budgets.with_default_checks`). A timeline on CUDA comes from ``source()`` (the run's
        choice, asked only then), else from the sampler if ``sampled``, else from the trace."""
        device = guard.default_device()
        cuda = device != "cpu" and torch.cuda.is_available()
        if default_checks:
            budgets = with_default_checks(tuple(budgets), cuda)
        signals = {b.signal for b in budgets}
        timeline, memory = cuda and "timeline" in signals, cuda and "memory" in signals
        chosen = None
        if timeline:
            chosen = source() if source is not None else TimelineSource(SAMPLED if sampled else TRACE, "the caller's")
        return cls(nodeid, guard, budgets, options, timeline, memory, source=chosen, device_time=cuda)

    @property
    def sampled(self) -> bool:
        """The timed runs' timeline is sampled with the PM sampler instead of the whole call being captured; a
        counting run's trace still gives the exact device-work counts."""
        return self.source is not None and self.source.sampled

    @property
    def races(self) -> bool:
        """Whether its budgets check races (the guard's regions check them when it says so)."""
        return any(b.signal == "races" for b in self.budgets)

    @contextmanager
    def recording(self) -> Iterator[CallCapture]:
        self.whole_call = GenerationRegion(
            None, self.guard.default_device(), track_memory=self.memory, check_races=self.races
        )
        try:
            with ExitStack() as stack:
                if self.timeline and self.sampled:
                    self.sampled_regions = stack.enter_context(SAMPLER.arming())
                    stack.callback(self._note_sampler)
                    self.sync_stamps = stack.enter_context(TIMELINE.stamping())
                    self.trace_files = stack.enter_context(TIMELINE.per_region())
                elif self.timeline:
                    self.trace_files = stack.enter_context(TIMELINE.capturing(host_ops=self.host_ops))
                elif self.device_time:
                    self.trace_files = stack.enter_context(TIMELINE.per_region())
                if self.memory and self.history:
                    self.snapshots = stack.enter_context(allocation_history())
                stack.enter_context(self.whole_call.recording())
                yield self
        finally:
            self.misuse = close_left_open(self.guard)

    def _note_sampler(self) -> None:
        self.sampler_problem = SAMPLER.problem

    def result(
        self,
        *,
        raised: BaseException | None,
        require_gpu: bool,
        store: BaselineStore | None,
        artifacts: Path | None,
        notes: Sequence[str] = (),
        timelines: perfetto.TimelineFiles | None = None,
    ) -> MeasuredTest | None:
        """The test's result after its call (None when nothing was measured): budgets checked, compared with its
        baseline (``store``) unless the call ``raised`` (its numbers are partial), allocation sites of a failure,
        its recordings kept in ``artifacts`` when it failed (removed otherwise), and its judged timelines written
        as a Perfetto file where ``timelines`` says so."""
        result = None
        try:
            result = self._result(require_gpu, None if raised else store, notes)
            if result is not None and raised is not None:
                result = replace(result, outcome=outcome_of(raised))
        finally:
            kept, problem = self.keep(artifacts, raised is not None or (result is not None and result.failed))
        if result is None:
            return None
        if timelines is not None and (timelines.every or result.broke("timeline")):
            written, trouble = self.keep_timelines(result, timelines.directory())
            kept, problem = [*written, *kept], problem or trouble
        return replace(result, artifacts=tuple(kept), notes=(*result.notes, *([problem] if problem else [])))

    def keep_timelines(self, result: MeasuredTest, directory: Path) -> tuple[list[str], str | None]:
        """Write the judged timelines of the test as a Perfetto file in ``directory``: its path (none without a
        timeline), and why it could not be written."""
        judged = self.judged.timelines if self.judged is not None else ()
        shown = result.timeline.region if result.timeline is not None else None
        regions = [perfetto.Region(i + 1, t, i + 1 == shown) for i, t in enumerate(t for t in judged if t)]
        if not regions:
            return [], None
        source = "sampled" if self.sampled else "trace"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            target = directory / f"{artifact_stem(self.nodeid)}{perfetto.SUFFIX}"
            return [str(perfetto.write(target, self.nodeid, source, regions))], None
        except (OSError, ValueError) as exc:
            return [], f"syncguard: {self.nodeid}: could not write its timeline file: {exc}"

    def _result(self, require_gpu: bool, store: BaselineStore | None, notes: Sequence[str]) -> MeasuredTest | None:
        whole = [self.whole_call.measurement] if self.whole_call and self.whole_call.measurement else []
        chosen = self.guard.measurements or whole
        if not chosen:
            return None
        measurement = Measurement.combine(chosen)
        error = None
        try:
            measurement = self.with_timelines(measurement)
        except Exception as exc:  # a trace the analysis cannot read is reported, not swallowed
            error = f"{self.nodeid}: GPU timeline analysis failed: {exc}"
        self.judged = measurement
        checks, usage_error = check_budgets(self.nodeid, self.budgets, measurement, require_gpu=require_gpu)
        if self.misuse is not None:
            error = error or f"{self.nodeid}: {self.misuse}"
        slug = slug_for(measurement.device)
        result = MeasuredTest.of(self.nodeid, measurement, checks, error or usage_error, slug, host_id(slug))
        found = [note for note in (_out_of_memory_note(self.nodeid, measurement), _python_kernel_note()) if note]
        result = replace(result, notes=(*notes, *found), timeline_source=self.source)
        # A measurement whose numbers mean nothing (a CUDA region on a machine without CUDA) is not compared.
        if store is not None and self.options.baseline and result.error is None and not measurement.unmeasured:
            try:
                comparison = store.compare(
                    self.nodeid, result.device, result.metrics, self.options.tolerance, result.details()
                )
                result = replace(result, comparison=comparison)
            except BaselineError as exc:
                result = replace(result, error=f"{self.nodeid}: {exc}")
        return result

    def with_timelines(self, measurement: Measurement) -> Measurement:
        """The measurement with, from the recorded traces, the device time and device work of each traced region
        and the GPU timeline of each judged one (from its samples under a sampled timeline); or, when a trace
        cannot be trusted, with the reason instead of their numbers."""
        if self.timeline and not self.sampled:
            return self._with_captured_call(measurement)
        measurement = self._with_traced_runs(measurement)
        return self._with_sampled_timelines(measurement) if self.timeline else measurement

    def _with_captured_call(self, measurement: Measurement) -> Measurement:
        """Everything from the trace of the whole call: every region's device work and device time, and the
        timeline of each timed one."""
        if not self.trace_files:
            return measurement
        trace = trace_file.load(self.trace_files[0])
        windows = gaps.regions(trace)
        traced = [n for n in _all_regions(measurement) if n in windows]
        found = {n: gaps.analyze(trace, window=windows[n], warmup_steps=self.options.warmup_steps) for n in traced}
        timelines = tuple(found.get(n) for n in measurement.region_numbers)
        problem = sentinel_problem(trace) or next((t.unreliable for t in timelines if t and t.unreliable), None)
        counts = dict(measurement.region_counts)
        for n in traced:
            work = device_work(trace, windows[n]) if problem is None else unreliable_counts(problem)
            counts[n] = counts.get(n, RegionCounts()).merged(work)
        if problem is not None:
            return replace(measurement, timelines=(), region_counts=counts, unreliable_timeline=problem)
        return replace(measurement, timelines=timelines, region_counts=counts, device_times=_device_times(found))

    def _with_traced_runs(self, measurement: Measurement) -> Measurement:
        """The device work and device time of each region traced on its own (a counting run). Under a sampled
        timeline, a ``measure()`` or region with no traced run counts no device work, and says why."""
        counts = dict(measurement.region_counts)
        found: dict[int, Timeline | None] = {}
        for path in self.trace_files:
            trace = trace_file.load(path)
            problem = sentinel_problem(trace)
            for n, window in gaps.regions(trace).items():
                work = device_work(trace, window) if problem is None else unreliable_counts(problem)
                counts[n] = counts.get(n, RegionCounts()).merged(work)
                timeline = gaps.analyze(trace, window=window, warmup_steps=self.options.warmup_steps)
                found[n] = timeline if problem is None and (timeline is None or timeline.unreliable is None) else None
        if self.timeline:
            for part in measurement.count_parts:
                if found.keys().isdisjoint(part):
                    for n in part:
                        counts[n] = counts.get(n, RegionCounts()).merged(uncounted(NO_COUNTING_RUN))
        return replace(measurement, region_counts=counts, device_times=_device_times(found))

    def _with_sampled_timelines(self, measurement: Measurement) -> Measurement:
        """The timed regions' timelines from their samples."""
        timelines: list[Timeline | None] = []
        unreliable = self.sampler_problem
        for n in measurement.region_numbers:
            region = self.sampled_regions.get(n)
            if region is None:
                timelines.append(None)
                continue
            samples = region.samples
            if samples.overflow:
                unreliable = unreliable or (
                    f"the PM sampler lost samples of region #{n} (its buffer filled, or the region outlasted "
                    f"{MAX_SAMPLES} samples)"
                )
            judged = judge_sampled_region(region, self.options.warmup_steps, self.sync_stamps)
            if judged.problem is not None:
                unreliable = unreliable or f"region #{n}: {judged.problem}"
                continue
            timelines.append(judged.timeline)
        if unreliable is not None:
            return replace(measurement, timelines=(), unreliable_timeline=unreliable)
        return replace(measurement, timelines=tuple(timelines))

    def allocation_sites(self) -> tuple[AllocationSite, ...]:
        """The largest allocation sites of the recorded allocator history (empty when none was recorded)."""
        from .probes.call_sites import is_internal_file

        return tuple(
            site for path in self.snapshots for site in snapshot.allocation_sites(snapshot.load(path), is_internal_file)
        )

    def keep(self, directory: Path | None, failed: bool) -> tuple[list[str], str | None]:
        """Move the recordings of a failing test to ``directory`` (trace gzipped); remove them otherwise.
        Returns the paths kept, and why some could not be kept (the test's own verdict is never replaced)."""
        kept: list[str] = []
        problem = None
        try:
            if failed and directory is not None and (self.trace_files or self.snapshots):
                directory.mkdir(parents=True, exist_ok=True)
                stem = artifact_stem(self.nodeid)
                for path in self.trace_files:
                    target = directory / f"{stem}.trace.json.gz"
                    with path.open("rb") as source, gzip.open(target, "wb", compresslevel=6) as sink:
                        shutil.copyfileobj(source, sink)
                    kept.append(str(target))
                for path in self.snapshots:
                    target = directory / f"{stem}.memory.pickle"
                    shutil.copyfile(path, target)
                    kept.append(str(target))
        except OSError as exc:
            problem = f"syncguard: {self.nodeid}: could not keep its recordings in --syncguard-artifacts: {exc}"
        finally:
            for path in [*self.trace_files, *self.snapshots]:
                path.unlink(missing_ok=True)
        return kept, problem


@dataclass(frozen=True)
class SampledJudgement:
    """One sampled region as the plugin judges it: its timeline (None: no device work in its judged part), why its
    steps could not be placed, and where they were placed."""

    timeline: Timeline | None
    problem: str | None = None
    steps: sampled.PlacedSteps | None = None


def judge_sampled_region(
    region: SampledRegion, warmup_steps: int, syncs: Sequence[tuple[int, str]] = ()
) -> SampledJudgement:
    """The timeline of a sampled region's judged steps, its steps placed by its events, with the counted ``syncs``
    (ns on the samples' clock, call site) that the host made in its judged part, as a trace keeps them."""
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
    return SampledJudgement(timeline.timeline(syncs=syncs, window=judged) if timeline.span_us > 0 else None,
                            steps=placed)  # fmt: skip


def _all_regions(measurement: Measurement) -> list[int]:
    """The numbers of every region of a measurement: its timed ones and the counting runs of its parts."""
    numbers = dict.fromkeys(measurement.region_numbers)
    numbers.update(dict.fromkeys(n for part in measurement.count_parts for n in part))
    return list(numbers)


def _device_times(timelines: dict[int, Timeline | None]) -> dict[int, DeviceTime]:
    """The device time of each traced region that launched device work."""
    return {n: DeviceTime(t.busy_us, t.judged_steps, t.steps) for n, t in timelines.items() if t is not None}


@contextmanager
def _rerun(capture: CallCapture, rerun: Callable[[], object]) -> Iterator[CallCapture]:
    """Run a test's call again (``rerun``) under ``capture`` and yield it. The guard's own measurements are set
    aside for the rerun and restored, and the capture's files are removed, on every exit path."""
    guard = capture.guard
    saved, guard.measurements = guard.measurements, []
    try:
        with capture.recording():
            rerun()
        yield capture
    finally:
        guard.measurements = saved
        capture.keep(None, failed=False)


def diagnose_gaps(nodeid: str, guard: SyncGuard, options: GuardOptions, rerun: Callable[[], object]) -> TimelineSummary:
    """Run a test's call again (``rerun``) with every host operator recorded: its widest region's timeline, whose
    launch-bound gaps list the operators between launches. Nothing of it is judged: the recording slows the
    host. The guard's own measurements are kept; a problem raises :class:`DiagnosisError`."""
    diagnostic = CallCapture(nodeid, guard, (), options, timeline=True, memory=False, host_ops=True)
    with _rerun(diagnostic, rerun) as capture:
        whole = capture.whole_call.measurement if capture.whole_call else None
        measured = guard.measurements or ([whole] if whole else [])
        if not measured:
            raise DiagnosisError("the rerun measured nothing")
        measurement = capture.with_timelines(Measurement.combine(measured))
    if measurement.unreliable_timeline is not None:
        raise DiagnosisError(f"its timeline is unreliable: {measurement.unreliable_timeline}")
    timelines = measurement.gpu_timelines
    if not timelines:
        raise DiagnosisError("the rerun launched no GPU work")
    widest = max(range(len(timelines)), key=lambda i: timelines[i].gap_stat("max"))
    return timelines[widest].summary(region=widest + 1)


def diagnose_allocations(
    nodeid: str, guard: SyncGuard, options: GuardOptions, rerun: Callable[[], object], artifacts: Path | None
) -> tuple[tuple[AllocationSite, ...], list[str], str | None]:
    """Run a test's call again (``rerun``) with the allocator history recorded: the sites of its largest
    allocations, the snapshot's path once kept in ``artifacts``, and why it could not be. The judged run records
    no history: its Python stacks cost host time at every allocation (bench/bench_timeline_capture.py). The
    guard's own measurements are kept."""
    diagnostic = CallCapture(nodeid, guard, (), options, timeline=False, memory=True, history=True)
    with _rerun(diagnostic, rerun) as capture:
        return (capture.allocation_sites(), *capture.keep(artifacts, failed=True))


class DiagnosisError(Exception):
    """Why a diagnostic rerun gave nothing to show."""
