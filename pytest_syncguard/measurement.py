"""What a test's measured regions measured (:class:`Measurement`): the one value the probes fill, the instruments
complete with timelines and device time, and the budgets, metrics and results read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from .analysis.counts import RegionCounts, top_over, total
from .analysis.device_work import DeviceTime
from .analysis.gaps import Timeline
from .analysis.memory import MemoryStats
from .analysis.races import RaceEvent
from .analysis.sites import SyncEvent, SyncSite, budgeted_syncs, group_sites
from .probes.sync_ops import CPU_VISIBLE_KINDS, SyncKind
from .signals import COUNTED_RUNS, FEWEST
from .signals import PARTS as SIGNAL_PARTS
from .signals.base import Part, Runs, chained, first_reason, known_sum, last, one_part, united


class RegionTiming(NamedTuple):
    """How long one region took, and over how many tokens."""

    tokens: int | None
    seconds: float

    @property
    def tokens_per_second(self) -> float | None:
        return self.tokens / self.seconds if self.tokens and self.seconds > 0 else None


def invisible_kinds(on_device: bool) -> tuple[str, ...]:
    """The sync kinds a run cannot observe: on CPU, those that need a separate device."""
    if on_device:
        return ()
    return tuple(kind.value for kind in SyncKind if kind not in CPU_VISIBLE_KINDS)


#: The parts of a measurement that belong to no one signal: where and over how many tokens it ran, its regions,
#: and the exact counters, which every region keeps alike (a counter's own rule picks its run,
#: :func:`.analysis.counts.total`).
CORE: tuple[Part, ...] = (
    Part("device", last),
    Part("tokens", known_sum),
    Part("region_numbers", chained, Runs.TIMED),
    Part("unmeasured", first_reason),
    Part("region_counts", united, Runs.EVERY),
    Part("count_parts", chained, Runs.EVERY, of_runs=one_part),
)
#: Every field of a measurement, each once: the core's, then the signals' own.
PARTS: tuple[Part, ...] = (*CORE, *SIGNAL_PARTS)


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
    which the largest counts (of the allocator's driver calls, the fewest: :data:`.signals.FEWEST`)."""
    unreliable_timeline: str | None = None
    """Why the captured GPU timeline cannot be trusted (lost events, ...): then it gives no number, only this."""
    device_times: Mapping[int, DeviceTime] = field(default_factory=dict)
    """Per traced region number (a ``measure()``'s counting run, every region of a captured call): the device's
    own busy time in its judged steps, from the kernels' records (CUDA only)."""
    cuda_calls_uncounted: str | None = None
    """On CUDA: why the host-blocking CUDA calls made outside torch were not counted in a region (a profiler
    capture held CUPTI, no CUPTI), if so; its syncs are then torch's alone there."""
    parts: Mapping[str, Any] = field(default_factory=dict)
    """The parts signals keep as their own (:attr:`.signals.base.Part.empty`), by name."""

    @classmethod
    def made(cls, values: Mapping[str, Any]) -> Measurement:
        """A measurement of these parts' values (by field name): the signals' own go into :attr:`parts`."""
        own = {name: value for name, value in values.items() if name not in _FIELDS}
        return cls(**{name: value for name, value in values.items() if name in _FIELDS}, parts=own)

    def part(self, name: str) -> Any:
        """A part of the measurement by its name: a field, or a signal's own part (empty where no region filled it)."""
        if name in _FIELDS:
            return getattr(self, name)
        return self.parts[name] if name in self.parts else _OWN[name]()

    @property
    def races(self) -> tuple[RaceEvent, ...]:
        """Host accesses of memory whose non_blocking copy the host had not waited for (when races were checked):
        the races signal's own part, kept under this name for the fixture's users."""
        return tuple(self.part("races"))

    def count(self, name: str) -> int | None:
        """A counter over the measurement's regions (None: not measured; see :mod:`.analysis.counts`)."""
        return total(self._count_runs(), name, fewest=name in FEWEST, counted_runs=name in COUNTED_RUNS)

    def count_top(self, name: str) -> tuple[tuple[str, int], ...]:
        """The largest contributors to a counter: operators, kernels, recompile reasons, graph breaks."""
        return top_over(self._count_runs(), name, fewest=name in FEWEST)

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
    def combine(measurements: Sequence[Measurement]) -> Measurement:
        """All regions of a test as one, each part merged as its signal says (:data:`PARTS`): syncs and tokens
        add up (tokens unknown if any region lacks them)."""
        if len(measurements) == 1:
            return measurements[0]
        return Measurement.made({p.field: p.regions([m.part(p.field) for m in measurements]) for p in PARTS})

    @staticmethod
    def of_runs(runs: Sequence[Measurement], *, counting_run: bool) -> Measurement:
        """A ``measure()``'s runs as one (the first its counting run, if it had one), each part taken from the runs
        its signal says (:class:`.signals.base.Runs`): the counts and syncs of its worst run, the timings and
        timelines of its timed runs, the allocator's numbers of every run."""
        counted_calls = [m for m in runs if m.cuda_calls_uncounted is None]
        chosen = {
            Runs.WORST: [max(counted_calls or runs, key=lambda m: m.syncs)],
            Runs.EVERY: list(runs),
            Runs.TIMED: list(runs[counting_run:]),
        }
        merged: dict[str, Any] = {}
        for part in PARTS:
            values = [m.part(part.field) for m in chosen[part.runs]]
            merged[part.field] = (part.of_runs or part.regions)(values)
        return Measurement.made(merged)

    def device_us_per_token(self) -> list[float]:
        """The device's busy time per judged decode step of each traced region (per token where its steps were
        not seen), in region order."""
        found = []
        for _, busy in sorted(self.device_times.items()):
            steps = busy.judged_steps if busy.steps else self.tokens
            if steps:
                found.append(busy.busy_us / steps)
        return found


#: The measurement's own fields; the other parts are signals' own (:attr:`Measurement.parts`).
_FIELDS = frozenset(f.name for f in fields(Measurement)) - {"parts"}
#: Each signal's own part, and what it is where no region filled it.
_OWN = {part.field: part.empty for part in PARTS if part.empty is not None}
_unknown = [part.field for part in PARTS if part.empty is None and part.field not in _FIELDS]
assert not _unknown, f"parts with neither a field of Measurement nor an empty value: {_unknown}"
