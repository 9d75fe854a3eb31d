"""The ``syncguard`` fixture object and its measured regions."""

from __future__ import annotations

import importlib
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, closing, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from . import instruments
from .analysis.counts import RegionCounts
from .analysis.sites import SyncEvent, SyncSite
from .instruments import COUNTING_RUN, TIMED_RUN
from .measurement import Measurement, RegionTiming
from .probes import children, collectives, compiles, graphs, ops
from .probes.cuda_calls import CUDA_CALLS, CudaCallWatch, transfer_counts
from .probes.memory import driver_calls, region_memory
from .probes.region import Region, RegionProbe
from .probes.syncs import PROBE, SyncRecorder
from .probes.timeline import TIMELINE, MarkedSteps
from .signals import SIGNALS

#: Numbers the regions of a process, so that each can be found again in a profiler trace.
_REGION_NUMBERS = itertools.count()


class SyncguardUsageError(Exception):
    """The fixture was used in a way that cannot be measured (e.g. a per-token budget with no tokens)."""


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
    needs: frozenset[str] = frozenset()
    """The signals whose budgets the test has that record on demand (:attr:`.signals.base.Signal.on_demand`: the
    allocator's numbers, the race watch), asked once for the test; a probe marked on demand runs where its signal
    is among them (:attr:`.probes.region.RegionProbe.on_demand`)."""
    count_ops: bool = True
    """Count operators (a dispatch-bound loop runs a few percent slower while they are counted)."""
    run: str = TIMED_RUN
    """What it runs as: :data:`.instruments.TIMED_RUN` or :data:`.instruments.COUNTING_RUN` (a ``measure()``'s
    counting run, whose trace gives the device time and the exact device-work counts)."""
    number: int = field(default_factory=lambda: next(_REGION_NUMBERS))
    _recorder: SyncRecorder = field(init=False, repr=False)
    _counts: list[RegionCounts] = field(default_factory=list, repr=False)
    _states: dict[str, Any] = field(default_factory=lambda: {p.name: p.state() for p in REGION_PROBES}, repr=False)
    """Each probe's own state in this region (:attr:`.probes.region.RegionProbe.state`)."""
    _collectives: list[str] = field(default_factory=list, repr=False)
    _open: ExitStack | None = field(default=None, repr=False)
    _steps: MarkedSteps = field(default_factory=MarkedSteps, repr=False)
    _cuda_calls: CudaCallWatch = field(default_factory=CudaCallWatch, repr=False)
    _window_ns: list[int] = field(default_factory=list, repr=False)
    """The region's wall-clock window (ns): its children's syncs inside it are its own (:mod:`.probes.children`)."""

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
        """One of the region's exact counters (``ops``, ``recompiles``, ...; see :data:`.signals.COUNTERS`);
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
        instruments.active().mark_step()

    @property
    def marked_steps(self) -> int:
        """How many times the loop called :meth:`step`."""
        return self._steps.marks

    def _count_forward(self, module: torch.nn.Module, args: Any) -> None:
        self.forward_calls += 1

    @contextmanager
    def recording(self) -> Iterator[GenerationRegion]:
        # What records this run's timeline on its own (the call's instrument) is entered outside its clock.
        with instruments.active().run(self.number, self.run), self._recording() as region:
            yield region

    @contextmanager
    def _recording(self) -> Iterator[GenerationRegion]:
        PROBE.prepare()  # the first region of a process loads the native kernel before its clock starts
        seconds = None
        try:
            # CUPTI's subscriber is taken before the clock starts and given up after it stops.
            with CUDA_CALLS.held() if self.on_cuda else nullcontext():
                start = self._clock()
                self._window_ns = [time.time_ns()]
                with ExitStack() as stack:
                    self._open = stack
                    for probe in REGION_PROBES:
                        if (not probe.on_demand or probe.signal in self.needs) and probe.wanted(self):
                            stack.enter_context(probe.recording(self, self._states[probe.name]))
                    yield self
                seconds = self._clock() - start
                self._window_ns.append(time.time_ns())
                instruments.active().ended(self.number, (self._window_ns[0], self._window_ns[1]))
        finally:
            # After every probe has closed: the allocator stats are read on their exit.
            self._open = None
            self.measurement = self._finish(seconds)

    @property
    def on_cuda(self) -> bool:
        return self.device != "cpu" and torch.cuda.is_available()

    def children_syncs(self) -> tuple[SyncEvent, ...]:
        """The syncs the test's child processes made inside the region (each labelled with its process)."""
        return children.syncs_in((self._window_ns[0], self._window_ns[1])) if len(self._window_ns) == 2 else ()

    @property
    def counting(self) -> bool:
        """A ``measure()``'s counting run (traced, its operators and collectives counted by Python kernels)."""
        return self.run == COUNTING_RUN

    @property
    def collective_calls(self) -> list[str]:
        """The region's collectives so far, ``op at site`` in call order (what the collectives' part keeps)."""
        return self._collectives

    @property
    def counts(self) -> list[RegionCounts]:
        """The exact counts of the region's counters, each probe's appended (merged when it ends)."""
        return self._counts

    @contextmanager
    def _model_hooks(self) -> Iterator[None]:
        """The model's forward calls counted (its tokens, when the test names none), and each marked as a step in
        what records the timeline now (:meth:`.instruments.Instrument.step_hooks`)."""
        assert self.model is not None
        handles = [self.model.register_forward_pre_hook(self._count_forward)]
        handles += instruments.active().step_hooks(self.model)
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
        filled = {  # first: a probe may count what it read once the clock stopped (the flight recorder's)
            name: value
            for probe in REGION_PROBES
            if probe.fills
            for name, value in probe.fills(self, self._states[probe.name]).items()
        }
        counts = RegionCounts()
        for found in self._counts:
            counts = counts.merged(found)
        return Measurement.made(
            dict(
                device=self.device,
                tokens=tokens,
                region_numbers=(self.number,),
                timings=() if seconds is None else (RegionTiming(tokens, seconds),),
                unmeasured=unmeasured,
                region_counts={self.number: counts},
                count_parts=((self.number,),),
                **filled,
            )
        )

    @contextmanager
    def _counting_cuda_calls(self) -> Iterator[None]:
        with CUDA_CALLS.counting() as watch:
            self._cuda_calls = watch
            yield

    @contextmanager
    def _counting_transfers(self) -> Iterator[None]:
        """The memcpy calls between host and device that the CUDA-call probe's watch (around this) saw in the block,
        with those the test's child processes made in it, into the region's counts
        (:func:`.probes.cuda_calls.transfer_counts`)."""
        yield
        ours, theirs = self._cuda_calls, children.copies_in((self._window_ns[0], time.time_ns()))
        joined = CudaCallWatch(
            ours.not_counted or next(iter(theirs.not_counted), None),
            [*ours.transfers, *theirs.transfers],
            ours.not_read + Counter(theirs.not_read),
        )
        self._counts.append(transfer_counts(joined))


def _always(region: GenerationRegion) -> bool:
    return True


def _on_cuda(region: GenerationRegion) -> bool:
    return region.on_cuda


#: The guard's own probes of a region, outermost first: a probe does not see the work of those outside it, so the
#: counters are innermost (the other probes' own operators are not counted), the CUDA-call probe is inside the sync
#: probe (it counts into the sync probe's recorders), and inside that the transfers, which its watch saw.
#: The allocator's numbers are read on its exit, after those inside. The wall time is the region's own clock.
_OWN_PROBES = (
    RegionProbe("timeline annotation", "timeline", 10, _always, lambda r, _: TIMELINE.region(r.number)),
    RegionProbe("marked steps", "timeline", 20, _always, lambda r, _: closing(r._steps)),
    RegionProbe("forward calls", None, 30, lambda r: r.model is not None, lambda r, _: r._model_hooks()),
    RegionProbe(
        "allocator",
        "memory",
        40,
        _on_cuda,
        lambda r, found: region_memory(found),
        lambda r, found: {"memory": tuple(found)},
        state=list,
        on_demand=True,
    ),
    RegionProbe(
        "syncs",
        "syncs",
        50,
        _always,
        lambda r, _: PROBE.recording(r._recorder),
        lambda r, _: {"events": (*r._recorder.events, *r.children_syncs())},
    ),
    RegionProbe(
        "CUDA calls",
        "syncs",
        60,
        _on_cuda,
        lambda r, _: r._counting_cuda_calls(),
        lambda r, _: {"cuda_calls_uncounted": r._cuda_calls.not_counted},
    ),
    RegionProbe("transfers", "transfers", 70, _on_cuda, lambda r, _: r._counting_transfers()),
    RegionProbe("driver calls", "memory", 80, _on_cuda, lambda r, _: driver_calls(r.counts)),
    RegionProbe("compiles", "compiles", 90, _always, lambda r, _: compiles.counting(r.counts, r._window_ns[0])),
    RegionProbe("CUDA graphs", "graphs", 100, _always, lambda r, _: graphs.counting(r.counts)),
    RegionProbe("operators", "ops", 110, lambda r: r.count_ops, lambda r, _: ops.counting(r.counts, r._window_ns[0])),
    # Like the operators, only in a counting run: its Python kernel costs a collective tens of microseconds. Where
    # torch's flight recorder gives a region's collectives, they are counted from it (probes/collectives.py).
    RegionProbe(
        "collectives",
        "collectives",
        120,
        lambda r: r.count_ops and not collectives.records_collectives(r),
        lambda r, _: collectives.counting(r.counts, r._collectives),
        lambda r, _: collectives.filled(r.number, r.tokens or r.forward_calls or None, r._collectives),
    ),
)


#: The guard's region is what a unit's probes read (mypy holds it to the protocol).
_A_REGION: type[Region] = GenerationRegion


def _units_probes() -> tuple[RegionProbe, ...]:
    """The region probes signal units keep in their own probes module (:attr:`.signals.base.Signal.probes`)."""
    modules = [importlib.import_module(f"{__package__}.probes.{s.probes}") for s in SIGNALS if s.probes]
    return tuple(probe for module in modules for probe in module.REGION_PROBES)


#: Every probe of a region, outermost first (:attr:`.probes.region.RegionProbe.depth`).
REGION_PROBES: tuple[RegionProbe, ...] = tuple(sorted((*_OWN_PROBES, *_units_probes()), key=lambda probe: probe.depth))


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
        needs: frozenset[str] = frozenset(),
    ) -> None:
        self.nodeid = nodeid
        self._device = device
        self._warmup = warmup
        self.needs = needs
        """What the test's budgets need its regions to record (:attr:`GenerationRegion.needs`)."""
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
        self.warm = False
        """What the test's warm-up makes (a compiled step, recorded graphs, caches) is kept from a call of it before
        (syncguard ab's later rounds call the test again with its fixtures set up): :meth:`measure` warms up no
        more."""

    def again(self) -> None:
        """Ready for another call of the same test with its fixtures still set up (syncguard ab's later rounds):
        its measurements and misuse forgotten, warm (:attr:`warm`)."""
        if self._open:
            raise SyncguardUsageError(f"{self.nodeid}: called again with {len(self._open)} region(s) still open")
        self.measurements.clear()
        self.misuse, self.warm = None, True

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
        return _Once(self._region(tokens, model, count_ops=not self.timings_only, run=TIMED_RUN), self.nodeid)

    @contextmanager
    def _region(
        self, tokens: int | None, model: torch.nn.Module | None, *, count_ops: bool, run: str
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
            tokens,
            device,
            model,
            needs=self.needs,
            count_ops=count_ops,
            run=run,
        )
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
        A test called again with its fixtures set up (:meth:`again`) warms up no more.

        Sync counts of a deterministic loop are the same in every run; keeping the largest makes a loop
        whose count varies fail on its worst run rather than pass on its best.
        """
        if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
            raise SyncguardUsageError(f"{self.nodeid}: syncguard.measure(): repeat must be an int >= 1, got {repeat!r}")
        if warmup is not None and (isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0):
            raise SyncguardUsageError(f"{self.nodeid}: syncguard.measure(): warmup must be an int >= 0, got {warmup!r}")
        warmup = 0 if self.warm else self._warmup if warmup is None else warmup
        if self.repeat is not None:  # --syncguard-repeat: the traced run, then that many timed runs (maybe none)
            repeat, counting_run = self.repeat, True
        else:
            counting_run = repeat > 1
        for _ in range(warmup):
            fn()
        outermost = not self._open
        runs: list[Measurement] = []
        for run in range(repeat + counting_run):
            kind = COUNTING_RUN if counting_run and run == 0 else TIMED_RUN
            with self._region(tokens, model, count_ops=run == 0 and not self.timings_only, run=kind) as region:
                fn()
            assert region.measurement is not None
            runs.append(region.measurement)
            if outermost:
                self.measurements.pop()
        # The timeline and timing of every timed run are kept, the memory of every run: noisy metrics are judged
        # on their median. Counters: of the repeats, the largest count of each, the fewest of some.
        worst = Measurement.of_runs(runs, counting_run=counting_run)
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
