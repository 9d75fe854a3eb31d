"""The ``syncguard`` fixture object and its measured regions."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, closing, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import torch

from .analysis.counts import RegionCounts, top_over, total
from .analysis.device_work import DeviceTime
from .analysis.gaps import MARKED_STEPS, Timeline
from .analysis.memory import MemoryStats
from .analysis.races import RaceEvent
from .analysis.sites import SyncEvent, SyncSite, budgeted_syncs, group_sites
from .probes import compiles, ops
from .probes.cuda_calls import CUDA_CALLS, CudaCallWatch
from .probes.memory import driver_calls, region_memory
from .probes.races import RACES
from .probes.sampler import SAMPLER
from .probes.sync_ops import CPU_VISIBLE_KINDS, SyncKind
from .probes.syncs import PROBE, SyncRecorder
from .probes.timeline import TIMELINE, MarkedSteps

#: The runs of a region under a sampled timeline (:attr:`GenerationRegion.timeline_run`).
SAMPLED_RUN, TRACED_RUN = "sampled", "traced"
#: Numbers the regions of a process, so that each can be found again in a profiler trace.
_REGION_NUMBERS = itertools.count()


class RegionTiming(NamedTuple):
    """How long one region took, and over how many tokens."""

    tokens: int | None
    seconds: float

    @property
    def tokens_per_second(self) -> float | None:
        return self.tokens / self.seconds if self.tokens and self.seconds > 0 else None


class SyncguardUsageError(Exception):
    """The fixture was used in a way that cannot be measured (e.g. a per-token budget with no tokens)."""


def invisible_kinds(on_device: bool) -> tuple[str, ...]:
    """The sync kinds a run cannot observe: on CPU, those that need a separate device."""
    if on_device:
        return ()
    return tuple(kind.value for kind in SyncKind if kind not in CPU_VISIBLE_KINDS)


@dataclass(frozen=True)
class Measurement:
    """What one region (or several, combined) measured: syncs, and when captured the GPU timeline, allocator
    numbers and wall time of each region."""

    device: str
    tokens: int | None
    events: tuple[SyncEvent, ...]
    region_numbers: tuple[int, ...] = ()
    """The regions' numbers, also their annotations in a profiler trace (``syncguard.region#N``)."""
    timelines: tuple[Timeline | None, ...] = ()
    """Per region: the GPU timeline of its judged steps (None: no GPU work); empty when not captured."""
    memory: tuple[MemoryStats, ...] = ()
    """Per region and device: the caching allocator's numbers; empty when not captured."""
    timings: tuple[RegionTiming, ...] = ()
    """Per region that finished normally: its tokens and wall time (on CUDA, between device syncs)."""
    unmeasured: str | None = None
    """Why none of its numbers can be trusted (a region on a device this machine lacks), if so."""
    region_counts: Mapping[int, RegionCounts] = field(default_factory=dict)
    """Per region number: its exact counters (operators, compilations, launches, ...)."""
    count_parts: tuple[tuple[int, ...], ...] = ()
    """The regions whose counters add up, each given as the runs of one part (a ``measure()``'s repeats), of
    which the largest counts (of the allocator's driver calls, the fewest: :data:`.analysis.counts.FEWEST`)."""
    unreliable_timeline: str | None = None
    """Why the captured GPU timeline cannot be trusted (lost events, ...): then it gives no number, only this."""
    races: tuple[RaceEvent, ...] = ()
    """Host accesses of memory whose non_blocking copy the host had not waited for (when races were checked)."""
    device_times: Mapping[int, DeviceTime] = field(default_factory=dict)
    """Per traced region number (a ``measure()``'s counting run, every region of a captured call): the device's
    own busy time in its judged steps, from the kernels' records (CUDA only)."""
    cuda_calls_uncounted: str | None = None
    """On CUDA: why the host-blocking CUDA calls made outside torch were not counted in a region (a profiler
    capture held CUPTI, no CUPTI), if so; its syncs are then torch's alone there."""

    def count(self, name: str) -> int | None:
        """A counter over the measurement's regions (None: not measured; see :mod:`.analysis.counts`)."""
        return total(self._count_runs(), name)

    def count_top(self, name: str) -> tuple[tuple[str, int], ...]:
        """The largest contributors to a counter: operators, kernels, recompile reasons, graph breaks."""
        return top_over(self._count_runs(), name)

    def uncounted(self, name: str) -> str | None:
        """Why the measurement has no value of a counter its probe was asked for (a region could not count it), if
        it has none."""
        if self.count(name) is not None:
            return None
        return next((c.unmeasured[name] for c in self.region_counts.values() if name in c.unmeasured), None)

    def _count_runs(self) -> list[list[RegionCounts]]:
        return [[self.region_counts[n] for n in runs if n in self.region_counts] for runs in self.count_parts]

    def per_token(self, name: str) -> float | None:
        value = self.count(name)
        return value / self.tokens if value is not None and self.tokens else None

    @property
    def regions(self) -> int:
        return len(self.region_numbers)

    @property
    def gpu_timelines(self) -> list[Timeline]:
        """The timelines of the regions that launched GPU work, in region order."""
        return [t for t in self.timelines if t is not None]

    @property
    def on_device(self) -> bool:
        return self.device != "cpu"

    @property
    def syncs(self) -> int:
        """Syncs that count against budgets."""
        return budgeted_syncs(self.events)

    @property
    def allowed_syncs(self) -> int:
        """Syncs made inside ``syncguard.allow()``."""
        return sum(e.syncs for e in self.events if e.allowed)

    @property
    def compile_syncs(self) -> int:
        """Syncs made by torch.compile's compiler while it compiled (not counted; outside ``allow()``)."""
        return sum(e.syncs for e in self.events if e.compiling and not e.allowed)

    @property
    def syncs_per_token(self) -> float | None:
        return self.syncs / self.tokens if self.tokens else None

    @property
    def invisible_kinds(self) -> tuple[str, ...]:
        return invisible_kinds(self.on_device)

    def sites(self, *, allowed: bool = False, compiling: bool = False) -> list[SyncSite]:
        """Counted syncs grouped by (kind, call site), most frequent first; ``allowed`` selects the intended ones,
        ``compiling`` those the compiler made."""
        if allowed:
            return group_sites(e for e in self.events if e.allowed)
        if compiling:
            return group_sites(e for e in self.events if e.compiling and not e.allowed)
        return group_sites(e for e in self.events if e.counted)

    def by_kind(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for event in self.events:
            if event.counted:
                totals[event.kind] = totals.get(event.kind, 0) + event.syncs
        return dict(sorted(totals.items()))

    @staticmethod
    def combine(measurements: list[Measurement]) -> Measurement:
        """All regions of a test as one: syncs and tokens add up (tokens unknown if any region lacks them)."""
        if len(measurements) == 1:
            return measurements[0]
        counts = [m.tokens for m in measurements]
        tokens = None if any(t is None for t in counts) else sum(t for t in counts if t is not None)
        events = tuple(e for m in measurements for e in m.events)
        return Measurement(
            measurements[-1].device,
            tokens,
            events,
            region_numbers=tuple(n for m in measurements for n in m.region_numbers),
            timelines=tuple(t for m in measurements for t in m.timelines),
            memory=tuple(s for m in measurements for s in m.memory),
            timings=tuple(t for m in measurements for t in m.timings),
            unmeasured=next((m.unmeasured for m in measurements if m.unmeasured), None),
            region_counts={n: c for m in measurements for n, c in m.region_counts.items()},
            count_parts=tuple(p for m in measurements for p in m.count_parts),
            unreliable_timeline=next((m.unreliable_timeline for m in measurements if m.unreliable_timeline), None),
            races=tuple(r for m in measurements for r in m.races),
            device_times={n: d for m in measurements for n, d in m.device_times.items()},
            cuda_calls_uncounted=next((m.cuda_calls_uncounted for m in measurements if m.cuda_calls_uncounted), None),
        )

    def device_us_per_token(self) -> list[float]:
        """The device's busy time per judged decode step of each traced region (per token where its steps were
        not seen), in region order."""
        found = []
        for _, busy in sorted(self.device_times.items()):
            steps = busy.judged_steps if busy.steps else self.tokens
            if steps:
                found.append(busy.busy_us / steps)
        return found


def _device_of(model: Any) -> str | None:
    for tensor in model.parameters():
        return str(tensor.device.type)
    return None


@dataclass
class GenerationRegion:
    """A measured region of a generation loop; set ``tokens`` inside it if it was not known up front.

    After the block it holds its measurement, the way ``pytest.raises(...) as excinfo`` holds the exception:
    ``syncs``, ``tokens`` (also when counted from ``model=``), ``syncs_per_token``, ``sites()``, ``by_kind()``.
    """

    tokens: int | None
    """Decode steps of the region: given to ``generation()``, set inside the block, or after it the model's forward
    calls (a positive int once the block has ended)."""
    device: str
    """Where the region runs: ``cpu``, ``cuda``."""
    model: torch.nn.Module | None = None
    """The model whose forward calls count the tokens and mark the decode steps, if one was passed."""
    measurement: Measurement | None = None
    """What the region measured, after its block."""
    forward_calls: int = 0
    """Forward calls of :attr:`model` in the region."""
    track_memory: bool = False
    count_ops: bool = True
    """Count operators (a dispatch-bound loop runs a few percent slower while they are counted)."""
    check_races: bool = False
    """Check host accesses of memory whose non_blocking copy the host has not waited for (CUDA)."""
    timeline_run: str = ""
    """Under a sampled timeline: :data:`SAMPLED_RUN` (a timed run, sampled) or :data:`TRACED_RUN` (a counting run,
    whose trace gives the exact device-work counts); empty for neither."""
    number: int = field(default_factory=lambda: next(_REGION_NUMBERS))
    _recorder: SyncRecorder = field(init=False, repr=False)
    _memory: list[MemoryStats] = field(default_factory=list, repr=False)
    _counts: list[RegionCounts] = field(default_factory=list, repr=False)
    _races: list[RaceEvent] = field(default_factory=list, repr=False)
    _open: ExitStack | None = field(default=None, repr=False)
    _steps: MarkedSteps = field(default_factory=MarkedSteps, repr=False)
    _cuda_calls: CudaCallWatch = field(default_factory=CudaCallWatch, repr=False)

    def __post_init__(self) -> None:
        self._recorder = SyncRecorder(on_device=self.device != "cpu")

    def _measured(self) -> Measurement:
        if self.measurement is None:
            raise SyncguardUsageError("a region's measurement is there after its `with` block, not inside it")
        return self.measurement

    @property
    def syncs(self) -> int:
        """Syncs of the region that count against budgets."""
        return self._measured().syncs

    @property
    def allowed_syncs(self) -> int:
        return self._measured().allowed_syncs

    @property
    def syncs_per_token(self) -> float | None:
        return self._measured().syncs_per_token

    def sites(self, *, allowed: bool = False) -> list[SyncSite]:
        """The region's syncs grouped by (kind, call site), most frequent first."""
        return self._measured().sites(allowed=allowed)

    def by_kind(self) -> dict[str, int]:
        return self._measured().by_kind()

    def count(self, name: str) -> int | None:
        """One of the region's exact counters (``ops``, ``recompiles``, ...; see :data:`.analysis.counts.COUNTERS`);
        None where it was not measured. Launches, copies and memsets come from the test's timeline after its call:
        they are in the test's results, not here."""
        return self._measured().count(name)

    def step(self) -> None:
        """Mark the start of a decode step. A loop that calls it at each step has its GPU timeline judged by these
        steps (the first ``warmup_steps`` left out) rather than by its model's forward calls or its CUDA graph
        replays; it costs nothing unless a timeline is being captured, or a CUDA event when it is sampled."""
        if self._open is None:
            raise SyncguardUsageError("region.step() is called inside the region's `with` block")
        self._steps.mark()
        SAMPLER.step(MARKED_STEPS)

    @property
    def marked_steps(self) -> int:
        """How many times the loop called :meth:`step`."""
        return self._steps.marks

    def _count_forward(self, module: torch.nn.Module, args: Any) -> None:
        self.forward_calls += 1

    def _timeline_run(self) -> AbstractContextManager[Any]:
        """What records this region's timeline on its own, outside its clock (a test's call is captured whole
        unless its timeline is sampled)."""
        if self.timeline_run == SAMPLED_RUN:
            return SAMPLER.region(self.number)
        if self.timeline_run == TRACED_RUN and not SAMPLER.sampling:
            return TIMELINE.region_capture()
        return nullcontext()

    @contextmanager
    def recording(self) -> Iterator[GenerationRegion]:
        with self._timeline_run(), self._recording() as region:
            yield region

    @contextmanager
    def _recording(self) -> Iterator[GenerationRegion]:
        PROBE.prepare()  # the first region of a process loads the native kernel before its clock starts
        seconds = None
        try:
            # CUPTI's subscriber is taken before the clock starts and given up after it stops.
            with CUDA_CALLS.held() if self._on_cuda else nullcontext():
                start = self._clock()
                with ExitStack() as stack:
                    self._open = stack
                    for probe in REGION_PROBES:
                        if probe.wanted(self):
                            stack.enter_context(probe.recording(self))
                    yield self
                seconds = self._clock() - start
        finally:
            # After every probe has closed: the allocator stats are read on their exit.
            self._open = None
            self.measurement = self._finish(seconds)

    @property
    def _on_cuda(self) -> bool:
        return self.device != "cpu" and torch.cuda.is_available()

    @contextmanager
    def _model_hooks(self) -> Iterator[None]:
        """The model's forward calls counted (its tokens, when the test names none), and under a trace or the
        sampler each forward call marked as a step."""
        assert self.model is not None
        handles = [self.model.register_forward_pre_hook(self._count_forward)]
        if TIMELINE.tracing:
            handles += TIMELINE.step_hooks(self.model)
        elif SAMPLER.sampling:
            handles.append(self.model.register_forward_pre_hook(SAMPLER.forward_step))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def abandon(self) -> None:
        """Close what the region opened (probe, hooks, trace annotation) although its block has not ended: a
        generator suspended inside it was never closed. Its block, if it ever ends, changes nothing."""
        stack, self._open = self._open, None
        if stack is not None:
            stack.close()

    def _clock(self) -> float:
        """Now, after the device has finished the work queued so far (a sync that no recorder sees)."""
        if self.device != "cpu" and torch.cuda.is_available():
            with PROBE.unobserved():
                torch.cuda.synchronize()
        return time.perf_counter()

    def _finish(self, seconds: float | None) -> Measurement:
        tokens = self.tokens
        if tokens is None and self.model is not None:
            tokens = self.forward_calls
        unmeasured = None
        if self.device != "cpu" and not torch.cuda.is_available():
            unmeasured = (
                f"the region computes on {self.device!r} (@pytest.mark.syncguard(device=...)) but CUDA is not "
                "available: its host tensors cannot stand for device tensors"
            )
        counts = RegionCounts()
        for found in self._counts:
            counts = counts.merged(found)
        return Measurement(
            self.device,
            tokens,
            tuple(self._recorder.events),
            region_numbers=(self.number,),
            memory=tuple(self._memory),
            timings=() if seconds is None else (RegionTiming(tokens, seconds),),
            unmeasured=unmeasured,
            region_counts={self.number: counts},
            count_parts=((self.number,),),
            races=tuple(self._races),
            cuda_calls_uncounted=self._cuda_calls.not_counted,
        )

    @contextmanager
    def _counting_cuda_calls(self) -> Iterator[None]:
        with CUDA_CALLS.counting() as watch:
            self._cuda_calls = watch
            yield


@dataclass(frozen=True)
class RegionProbe:
    """One probe of a measured region: whether the region wants it, and what records its part of the region's
    results around the region's block, into the region's own lists (sync events, counts, allocator numbers,
    races), which :meth:`GenerationRegion._finish` reads once all have closed."""

    name: str
    wanted: Callable[[GenerationRegion], bool]
    recording: Callable[[GenerationRegion], AbstractContextManager[object]]


def _always(region: GenerationRegion) -> bool:
    return True


#: Every probe of a region, outermost first: a probe does not see the work of those outside it, so the counters
#: are innermost (the other probes' own operators are not counted) and the race watch is inside the sync probe
#: (its copy kernel announces the copies), as is the CUDA-call probe (it counts into the sync probe's recorders).
#: The allocator's numbers are read on its exit, after those inside.
REGION_PROBES = (
    RegionProbe("timeline annotation", _always, lambda r: TIMELINE.region(r.number)),
    RegionProbe("marked steps", _always, lambda r: closing(r._steps)),
    RegionProbe("forward calls", lambda r: r.model is not None, lambda r: r._model_hooks()),
    RegionProbe("allocator", lambda r: r.track_memory and r._on_cuda, lambda r: region_memory(r._memory)),
    RegionProbe("syncs", _always, lambda r: PROBE.recording(r._recorder)),
    RegionProbe("CUDA calls", lambda r: r._on_cuda, lambda r: r._counting_cuda_calls()),
    RegionProbe("races", lambda r: r.check_races and r._on_cuda, lambda r: RACES.watching(r._races, r._counts)),
    RegionProbe("driver calls", lambda r: r._on_cuda, lambda r: driver_calls(r._counts)),
    RegionProbe("compiles", _always, lambda r: compiles.counting(r._counts)),
    RegionProbe("operators", lambda r: r.count_ops, lambda r: ops.counting(r._counts)),
)


def _validated_tokens(tokens: Any, where: str) -> int | None:
    if tokens is None:
        return None
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
        raise SyncguardUsageError(f"{where}: tokens must be a positive int, got {tokens!r}")
    return tokens


class _Once(AbstractContextManager[GenerationRegion]):
    """A region's context manager, entered once: entering it again is a usage error that says what to do (the
    generator beneath it cannot run twice)."""

    def __init__(self, manager: AbstractContextManager[GenerationRegion], nodeid: str) -> None:
        self._manager, self._nodeid, self._entered = manager, nodeid, False

    def __enter__(self) -> GenerationRegion:
        if self._entered:
            raise SyncguardUsageError(
                f"{self._nodeid}: a syncguard.generation() region is entered once: call syncguard.generation() "
                "again for another region"
            )
        self._entered = True
        return self._manager.__enter__()

    def __exit__(self, *exc: Any) -> bool | None:
        return self._manager.__exit__(*exc)


class SyncGuard:
    """The ``syncguard`` fixture: measured regions, intended syncs, and the measurements of this test."""

    def __init__(
        self,
        nodeid: str = "",
        device: str | None = None,
        warmup: int = 1,
        *,
        track_memory: bool = False,
        check_races: bool = False,
    ) -> None:
        self.nodeid = nodeid
        self._device = device
        self._warmup = warmup
        self.track_memory = track_memory
        self.check_races = check_races
        self.measurements: list[Measurement] = []
        """The measurements of the test's outermost regions: what its budgets judge."""
        self._open: list[GenerationRegion] = []
        self._thread: int | None = None
        """The thread whose regions are open."""
        self.misuse: str | None = None
        """A misuse the test's own code may not have seen (raised in another thread): the test fails on it."""
        self.timings_only = False
        """Its regions count no operators (--syncguard-timings-only: the counts were judged elsewhere)."""
        self.repeat: int | None = None
        """The timed runs of :meth:`measure` after its traced run, instead of its ``repeat`` (--syncguard-repeat)."""

    @property
    def last(self) -> Measurement | None:
        """The measurement of the last finished outermost region, for custom assertions."""
        return self.measurements[-1] if self.measurements else None

    def abandon_open_regions(self) -> int:
        """Close the regions still open after the test's call (see :meth:`GenerationRegion.abandon`); how many."""
        regions, self._open = self._open, []
        for region in reversed(regions):
            region.abandon()
        return len(regions)

    def default_device(self) -> str:
        if self._device is not None:
            return self._device
        return "cuda" if torch.cuda.is_available() else "cpu"

    def generation(
        self, tokens: int | None = None, model: torch.nn.Module | None = None
    ) -> AbstractContextManager[GenerationRegion]:
        """Measure a generation loop; tokens are given, set on the region later, or counted as ``model`` calls.

        A region inside another one is measured on its own (its object holds its numbers) and is part of the
        outer one: only outermost regions make the test's measurement, so nothing is counted twice. What it
        returns is entered once: a second region is a second ``generation()``.
        """
        return _Once(self._region(tokens, model, count_ops=not self.timings_only, timeline_run=SAMPLED_RUN),
                     self.nodeid)  # fmt: skip

    @contextmanager
    def _region(
        self, tokens: int | None, model: torch.nn.Module | None, *, count_ops: bool, timeline_run: str
    ) -> Iterator[GenerationRegion]:
        tokens = _validated_tokens(tokens, f"{self.nodeid}: syncguard.generation()")
        thread = threading.get_ident()
        if self._open and self._thread != thread:
            # Raised in that thread, where the test may never see it: the test fails on it too.
            self.misuse = self.misuse or (
                f"a region opened in thread {threading.current_thread().name} while another thread's region was "
                "open: a test's regions are measured from one thread (the probes count per process, so each would "
                "count the other's syncs); open them one after another, or from one thread"
            )
            raise SyncguardUsageError(f"{self.nodeid}: {self.misuse}")
        device = (_device_of(model) if model is not None else None) or self.default_device()
        region = GenerationRegion(
            tokens, device, model, track_memory=self.track_memory, count_ops=count_ops, check_races=self.check_races,
            timeline_run=timeline_run,
        )  # fmt: skip
        outermost = not self._open
        if outermost:
            self._thread = thread
        self._open.append(region)
        finished = False
        try:
            with region.recording():
                yield region
            finished = True
        finally:
            if region in self._open:
                self._open.remove(region)
            if not finished and outermost and region.measurement is not None:
                # The test's call raised in the region: its budgets are judged on what it measured (partial
                # numbers, never compared), with the tokens it counted, rather than on nothing.
                self.measurements.append(region.measurement)
        assert region.measurement is not None
        if region.tokens is None and model is not None and not region.measurement.tokens:
            raise SyncguardUsageError(
                f"{self.nodeid}: syncguard.generation(model=...): 0 forward calls of the model you passed "
                f"({type(model).__name__}) in the region: call that model in it, or pass tokens="
            )
        tokens = _validated_tokens(region.measurement.tokens, f"{self.nodeid}: region.tokens")
        region.measurement = replace(region.measurement, tokens=tokens)
        region.tokens = tokens
        if outermost:
            self.measurements.append(region.measurement)

    def measure(
        self,
        fn: Callable[[], Any],
        *,
        tokens: int | None = None,
        warmup: int | None = None,
        repeat: int = 3,
        model: torch.nn.Module | None = None,
    ) -> Measurement:
        """Run ``fn`` ``warmup`` times unmeasured, then ``repeat`` times measured; keep the worst run (the most
        syncs; of each counter, the largest count, or the fewest of the allocator's driver calls).

        With ``repeat`` >= 2 one more measured run comes first, the only one that counts operators: counting them
        slows a dispatch-bound loop by a few percent, so timings and GPU timelines (medians over runs) are the
        other ``repeat`` runs'. --syncguard-repeat N makes it that run and N timed runs (0: that run alone, whose
        trace gives the device time), whatever ``repeat`` says; under --syncguard-timings-only it counts no operators.

        Sync counts of a deterministic loop are the same in every run; keeping the largest makes a loop
        whose count varies fail on its worst run rather than pass on its best.
        """
        warmup = self._warmup if warmup is None else warmup
        if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
            raise SyncguardUsageError(f"{self.nodeid}: syncguard.measure(): repeat must be an int >= 1, got {repeat!r}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise SyncguardUsageError(f"{self.nodeid}: syncguard.measure(): warmup must be an int >= 0, got {warmup!r}")
        if self.repeat is not None:  # --syncguard-repeat: the traced run, then that many timed runs (maybe none)
            repeat, counting_run = self.repeat, True
        else:
            counting_run = repeat > 1
        for _ in range(warmup):
            fn()
        outermost = not self._open
        runs: list[Measurement] = []
        for run in range(repeat + counting_run):
            counting = counting_run and run == 0
            timeline_run = TRACED_RUN if counting else SAMPLED_RUN
            with self._region(tokens, model, count_ops=run == 0 and not self.timings_only,
                              timeline_run=timeline_run) as region:  # fmt: skip
                fn()
            assert region.measurement is not None
            runs.append(region.measurement)
            if outermost:
                self.measurements.pop()
        # The timeline and timing of every timed run are kept, the memory of every run: noisy metrics are judged
        # on their median.
        counted_calls = [m for m in runs if m.cuda_calls_uncounted is None]
        worst = max(counted_calls or runs, key=lambda m: m.syncs)
        timed = runs[counting_run:]
        worst = replace(
            worst,
            region_numbers=tuple(n for m in timed for n in m.region_numbers),
            memory=tuple(s for m in runs for s in m.memory),
            timings=tuple(t for m in timed for t in m.timings),
            # Counters: of the repeats, the largest count of each, the fewest of some (see analysis.counts.total).
            region_counts={n: c for m in runs for n, c in m.region_counts.items()},
            count_parts=(tuple(n for m in runs for n in m.region_numbers),),
            races=tuple(r for m in runs for r in m.races),
            # A counting run under a trace cannot count them (the trace holds CUPTI): the timed runs do.
            cuda_calls_uncounted=None if counted_calls else runs[0].cuda_calls_uncounted,
        )
        if outermost:
            self.measurements.append(worst)
        return worst

    def step(self) -> None:
        """Mark the start of a decode step in the innermost open region (see :meth:`GenerationRegion.step`): for a
        loop run by :meth:`measure`, whose region the loop does not hold."""
        if not self._open:
            raise SyncguardUsageError(
                f"{self.nodeid}: syncguard.step() is called inside syncguard.generation() or syncguard.measure()"
            )
        self._open[-1].step()

    @contextmanager
    def allow(self) -> Iterator[None]:
        """Syncs of this thread in this block are intended (e.g. decoding the final output): reported, not
        counted."""
        with PROBE.allowing():
            yield
