"""Running one test's capture: its syncs (the test's regions, else the whole call), and the GPU timeline (by the
session's instrument, :mod:`.instruments`) and allocator numbers when its budgets need them and it runs on CUDA;
afterwards the measurement, its budget checks, its baseline comparison and the files of a failing test. The
diagnostic reruns of a failing test (every host operator recorded, or the allocator history) are here too: what
they record would slow the judged run.
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

from . import instruments
from .analysis import snapshot
from .analysis.gaps import TimelineSummary
from .analysis.snapshot import AllocationSite
from .budgets import GuardOptions, check_budgets, with_default_checks
from .document.budget import Budget
from .document.measured import MeasuredTest
from .environment import host_id, slug_for
from .guard import GenerationRegion, SyncGuard
from .instruments import WHOLE_CALL, Instrument, Traced
from .judge.baselines import BaselineError, BaselineStore
from .measurement import Measurement
from .probes.memory import allocation_history, out_of_memory
from .render import perfetto
from .result import measured_test
from .signals import needs
from .timeline_source import TRACE, TimelineSource


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
    """The capture of one test's call: its guard's regions, else the whole call, with the instrument that records
    its GPU timelines and the allocator recordings its budgets need."""

    nodeid: str
    guard: SyncGuard
    budgets: Sequence[Budget]
    options: GuardOptions
    instrument: Instrument = field(default_factory=Instrument)
    """What records the call's GPU timelines and device time (:mod:`.instruments`)."""
    memory: bool = False
    history: bool = False
    """Record the allocator history with Python stacks (a diagnostic run: slows every allocation)."""
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
        source: Callable[[], TimelineSource] | None = None,
    ) -> CallCapture:
        """The capture a test's budgets need; ``default_checks`` (--syncguard) adds the checks that are on by
        default (:func:`.budgets.with_default_checks`). A timeline on CUDA comes from ``source()`` (the session's
        choice, asked only then; None: the trace)."""
        device = guard.default_device()
        cuda = device != "cpu" and torch.cuda.is_available()
        if default_checks:
            budgets = with_default_checks(tuple(budgets), cuda)
        needed = needs(b.kind.signal for b in budgets)
        chosen = None
        if cuda and "timeline" in needed:
            chosen = source() if source is not None else TimelineSource(TRACE, "the caller's")
        instrument = instruments.for_call(chosen, cuda=cuda)
        return cls(nodeid, guard, budgets, options, instrument, memory=cuda and "memory" in needed)

    @property
    def source(self) -> TimelineSource | None:
        """Where the test's GPU timelines come from and why (None: it has none)."""
        return self.instrument.source

    @property
    def needs(self) -> frozenset[str]:
        """What its budgets need the test's regions to record, asked once (the allocator's numbers too where it
        tracks memory: a diagnostic rerun)."""
        return needs(b.kind.signal for b in self.budgets) | ({"memory"} if self.memory else frozenset())

    @contextmanager
    def recording(self) -> Iterator[CallCapture]:
        self.whole_call = GenerationRegion(None, self.guard.default_device(), needs=self.needs, run=WHOLE_CALL)
        try:
            with ExitStack() as stack:
                stack.enter_context(self.instrument.recording())
                if self.memory and self.history:
                    self.snapshots = stack.enter_context(allocation_history())
                stack.enter_context(self.whole_call.recording())
                yield self
        finally:
            self.misuse = close_left_open(self.guard)

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
            result = self._result(require_gpu, None if raised else store, notes, complete=raised is None)
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
        if not regions or self.source is None:
            return [], None
        try:
            directory.mkdir(parents=True, exist_ok=True)
            target = directory / f"{artifact_stem(self.nodeid)}{perfetto.SUFFIX}"
            return [str(perfetto.write(target, self.nodeid, self.source.name, regions))], None
        except (OSError, ValueError) as exc:
            return [], f"syncguard: {self.nodeid}: could not write its timeline file: {exc}"

    def _result(
        self, require_gpu: bool, store: BaselineStore | None, notes: Sequence[str], complete: bool = True
    ) -> MeasuredTest | None:
        """The result of what was measured; a call that raised (``complete`` False: skipped, failed) never got to
        give its regions their token counts, so a budget that needs one is no usage error there."""
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
        usage_error = usage_error if complete else None
        result = measured_test(self.nodeid, measurement, checks, error or usage_error, slug, host_id(slug))
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
        """The measurement with what the call's instrument recorded (:meth:`.instruments.Instrument.timelines`)."""
        return self.instrument.timelines(measurement, self.options.warmup_steps)

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
            if failed and directory is not None and (self.instrument.trace_files or self.snapshots):
                directory.mkdir(parents=True, exist_ok=True)
                stem = artifact_stem(self.nodeid)
                for path in self.instrument.trace_files:
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
            for path in [*self.instrument.trace_files, *self.snapshots]:
                path.unlink(missing_ok=True)
        return kept, problem


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
    instrument = Traced(TimelineSource(TRACE, "--syncguard-gap-ops's diagnostic rerun"), host_ops=True)
    diagnostic = CallCapture(nodeid, guard, (), options, instrument)
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
    diagnostic = CallCapture(nodeid, guard, (), options, memory=True, history=True)
    with _rerun(diagnostic, rerun) as capture:
        return (capture.allocation_sites(), *capture.keep(artifacts, failed=True))


class DiagnosisError(Exception):
    """Why a diagnostic rerun gave nothing to show."""
