"""What a signal unit is made of (pure data, no torch): its exact counters (:class:`CounterSpec`), its budget markers
(:class:`BudgetKind`) and the signal itself (:class:`Signal`), which says what a test's capture must record for
it and where it can be measured."""

from __future__ import annotations

import enum
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..analysis.gaps import Timeline
from ..analysis.memory import MemoryStats
from ..analysis.trace_file import Trace

MIB = 1024 * 1024


class Timing(Protocol):
    """One region's wall time (:class:`..measurement.RegionTiming`)."""

    @property
    def seconds(self) -> float: ...
    @property
    def tokens_per_second(self) -> float | None: ...


class Limit(Protocol):
    """What a budget's sentence reads of the budget (:class:`..budgets.Budget`)."""

    @property
    def marker(self) -> str: ...
    @property
    def limit(self) -> float: ...
    @property
    def stat(self) -> str: ...


class Measured(Protocol):
    """What a signal reads of a measurement (:class:`..measurement.Measurement`) to say what it measured."""

    @property
    def tokens(self) -> int | None: ...
    @property
    def syncs(self) -> int: ...
    @property
    def timelines(self) -> Sequence[Timeline | None]: ...
    @property
    def gpu_timelines(self) -> list[Timeline]: ...
    @property
    def memory(self) -> Sequence[MemoryStats]: ...
    @property
    def timings(self) -> Sequence[Timing]: ...
    def count(self, name: str) -> int | None: ...
    def per_token(self, name: str) -> float | None: ...
    def device_us_per_token(self) -> list[float]: ...
    def part(self, name: str) -> Any: ...


#: A budget's sentence: the arithmetic of a check in words, from the value it read, the measurement and the index
#: of the run nearest that value (the example the sentence quotes).
Sentence = Callable[[Limit, float, Measured, int], str]


class Section(enum.Enum):
    """What a failure of a signal's budget shows after its sentence (:func:`..render.terminal.failure_text`)."""

    SITES = "the sync sites, most frequent first"
    TIMELINE = "the GPU timeline's source, statistics and largest gaps"
    ALLOCATOR = "the allocator's numbers per region and the largest allocation sites"


@dataclass(frozen=True)
class Metric:
    """One metric, described once: how it is read from a measurement's runs, aggregated, compared and shown."""

    name: str
    unit: str
    counted: bool
    """A deterministic count: any increase is a regression."""
    higher_is_better: bool
    floor: float
    """Noisy metrics: changes smaller than this (in ``unit``) are never reported, whatever the tolerance."""
    runs: Callable[[Measured], list[float]]
    """Its value in each measured run of a measurement (empty when not measured)."""
    quiet_when_zero: bool = False
    """Counted metrics only: left out of a test's metrics when 0 and no budget reads it; absent compares as 0."""
    host: bool = False
    """Depends on the host that launches the work: not judged against a baseline recorded on another runner."""
    tolerance: float | None = None
    """Device-side metrics: the relative change within which they are unchanged, unless a test or the run sets
    one, or (with :attr:`min_tolerance`) the baseline's recordings calibrate one."""
    min_tolerance: float | None = None
    """Device-side metrics whose baseline keeps a history of recordings: the least tolerance their spread may
    calibrate (:func:`..judge.comparison.calibrated_tolerance`), what moves between hosts of one GPU model
    (docs/explanation/gate.md)."""
    aggregate: Callable[[Sequence[float]], float] = statistics.median
    """How a test's runs make its value, for its budget, the summary, the JSON results and the baseline alike: the
    median of a noisy metric, the worst run of memory (a budget must hold in every run), the largest count."""
    ab_min_effect: float | None = None
    """The smallest relative change ``syncguard ab`` calls a regression or improvement of it, unless
    ``--min-effect`` says; None: :data:`..gate.ab.plan.DEFAULT_MIN_EFFECT`."""
    description: str = ""
    """What it is, in a few words (the reference's metric table)."""
    column: str | None = None
    """Of the exact counters: the summary's column for it; None: in the JSON results only."""

    def format(self, value: float) -> str:
        if self.counted and float(value).is_integer():
            return f"{int(value)}"
        text = f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
        return f"{text} {self.unit}" if self.unit else text


def worst(runs: Sequence[float]) -> float:
    """Of a lower-is-better metric, the worst run; of a count, the largest (a count that varies fails on its
    worst run rather than passing on its best)."""
    return max(runs)


@dataclass(frozen=True)
class CounterSpec:
    """One exact counter, described once: what it counts, and how the plugin shows and explains it (its metrics,
    its summary column, its budget and the explanation of a regression are made from this). The signal whose
    probe counts it lists it (:attr:`Signal.counters`)."""

    name: str
    description: str
    quiet_when_zero: bool = False
    """Left out of a test's metrics when 0 and no budget reads it (torch.compile's counters: a loop that does
    not compile has none); an absent value compares as 0 against a baseline."""
    per_token: bool = False
    """Also given per token (decode step), as ``<name>_per_token``: the unit its budget uses."""
    column: str | None = None
    """The summary's column for it (its per-token value where it has one); None: in the JSON results only."""
    items: str | None = None
    """What its largest contributors are, where a region keeps them (operators, kernels, reasons)."""
    explained_by: str | None = None
    """The counter whose contributors explain a change of this one (the copies behind the bytes copied)."""
    unit: str = ""
    budget: str | None = None
    """The marker that limits it (``@pytest.mark.<budget>(limit)``; per token where it is given so): the budget,
    its documentation and its failure sentence are made from this entry."""
    sentence: Sentence | None = None
    """Its budget's sentence, where it says more than the count (None: the count and its description)."""
    of_runs: str = "largest"
    """Which of a ``measure()``'s runs gives its count: ``largest`` (a count that varies fails on its worst run) or
    ``fewest`` (:data:`.FEWEST`)."""
    counted_runs: bool = False
    """A run that could not count it is left out where another run of the ``measure()`` did (:data:`.COUNTED_RUNS`:
    a traced counting run, whose trace holds the CUDA API's callbacks); else it makes the count unknown."""


@dataclass(frozen=True)
class BudgetKind:
    """One budget marker, described once: its signature (the marker function), the signal it needs, the metric
    it reads (whose rule aggregates its runs, as for the summary and the baseline), its bounds and direction, and
    its sentence."""

    marker: str
    signature: Callable[..., None]
    signal: str
    metric: Callable[[str], str]
    """The name of the metric it reads, given the budget's ``stat``."""
    sentence: Sentence
    limit_argument: str | None = "limit"
    """The marker's argument that is the limit (None: the limit is 0, e.g. ``no_async_races``)."""
    upper: bool = True
    """True: the value may not exceed the limit; False: it may not fall below it."""
    fraction: bool = False
    """The limit is a fraction in [0, 1]."""
    needs_tokens: bool = False
    unmeasured: str = ""
    """Why there is no value when the signal was captured but the metric has no run."""
    counter: str | None = None
    """The exact counter it reads (:data:`.COUNTERS`), whose probe may say why it has none."""
    stat: str | None = None
    """The argument that picks the statistic the metric reads (``max_gpu_idle_us``'s ``stat``), if it has one."""


def chained(values: Sequence[tuple[Any, ...]]) -> tuple[Any, ...]:
    """Per-region items, one after another in region order."""
    return tuple(item for value in values for item in value)


def united(values: Sequence[Mapping[int, Any]]) -> dict[int, Any]:
    """Items keyed by region number, all regions' together."""
    return {number: item for value in values for number, item in value.items()}


def first_reason(values: Sequence[str | None]) -> str | None:
    """Why a number is missing: the first region's reason that has one."""
    return next((value for value in values if value), None)


def last(values: Sequence[Any]) -> Any:
    return values[-1]


def known_sum(values: Sequence[int | None]) -> int | None:
    """A sum that is unknown where any part of it is."""
    return None if any(value is None for value in values) else sum(v for v in values if v is not None)


def one_part(values: Sequence[tuple[tuple[int, ...], ...]]) -> tuple[tuple[int, ...], ...]:
    """Regions whose counters make one count of its runs (:attr:`..measurement.Measurement.count_parts`)."""
    return (tuple(number for parts in values for part in parts for number in part),)


class Runs(enum.Enum):
    """Which of a ``measure()``'s runs give a part of its measurement."""

    WORST = "the run with the most syncs (of those whose CUDA calls were counted)"
    EVERY = "every run, the counting run too"
    TIMED = "the timed runs (all runs where there is no counting run)"


@dataclass(frozen=True)
class Part:
    """One field of a measurement (:class:`..measurement.Measurement`) and how it merges: across a test's regions
    (:meth:`..measurement.Measurement.combine`), and across a ``measure()``'s runs
    (:meth:`..measurement.Measurement.of_runs`), whose chosen runs merge by ``of_runs`` (by ``regions`` unless
    said)."""

    field: str
    regions: Callable[[Sequence[Any]], Any]
    runs: Runs = Runs.WORST
    of_runs: Callable[[Sequence[Any]], Any] | None = None
    empty: Callable[[], Any] | None = None
    """None: a field of the measurement's own; else the part is its signal's own, kept in the measurement's
    :attr:`..measurement.Measurement.parts` (``empty()`` where no region filled it): a new signal declares its parts
    here and nowhere else."""


@dataclass(frozen=True)
class Traced:
    """What a signal reads of each traced region (a counting run's profiler trace, host and device): the part it
    fills (one of its own, a mapping by region number) and how it reads a region of the trace (its window, us)."""

    part: str
    read: Callable[[Trace, tuple[float, float]], Any]


@dataclass(frozen=True)
class Kept:
    """What a signal keeps of a test in its results (a record of its own, for the report), and how the report joins
    the records of the ranks of a launch into one (:func:`..document.launch.join`)."""

    record: Any
    """The record's type (a frozen dataclass the codec reads and writes)."""
    of: Callable[[Measured], Any]
    """The record of a measurement (None: nothing to keep)."""
    problem: Callable[[Any], str | None] = lambda record: None
    """What makes a record read from a file one no measurement can have (None: nothing)."""
    joined: Any = None
    """The type of the ranks' records joined (None: the signal does not join them)."""
    join: Callable[[Mapping[int, Any]], tuple[Any, Mapping[str, float]]] | None = None
    """The ranks' records (by rank) joined, None where there is nothing to join, and the metrics it adds to the
    joined test."""
    joined_problem: Callable[[Any], str | None] = lambda joined: None
    """What makes a joined record read from a file one no launch can have (None: nothing)."""


@dataclass(frozen=True)
class Signal:
    """One signal, as a unit: its exact counters, its budgets (those of its counters are made from them), where it
    can be measured, whether its numbers vary from run to run, what a test's capture records for it, and its parts
    of a measurement. Its region probes are the torch side's (:data:`..guard.REGION_PROBES`), each naming it."""

    name: str
    counters: tuple[CounterSpec, ...] = ()
    metrics: tuple[Metric, ...] = ()
    """Its metrics besides its counters' (which :data:`..metrics.METRICS` makes from them)."""
    kinds: tuple[BudgetKind, ...] = ()
    """Its budgets besides those its counters' :attr:`CounterSpec.budget` make (a marker without a limit, a budget on
    a noisy metric)."""
    cuda: bool = False
    """Its numbers are measured on CUDA only: a budget on a CPU run is "not measured"."""
    needs_text: str = ""
    """What its counters' budgets need, for their documentation (" Needs CUDA.")."""
    timed: bool = False
    """Its metrics vary from run to run (judged on medians, and A/B): the only budgets a timings-only run
    (--syncguard-timings-only) checks; the others are counts, judged once in a run that counts."""
    on_demand: bool = False
    """What records for it (the call's timeline instrument, its region probes marked ``on_demand``) runs only for a
    test with one of its budgets: it costs the loop time or perturbs it."""
    probes: str = ""
    """Its region probes' module of :mod:`pytest_syncguard.probes`, whose ``REGION_PROBES`` the guard runs beside
    its own ("": the guard's own list has them)."""
    shows: frozenset[Section] = frozenset()
    """What a failure of one of its budgets shows (its counters' largest contributors are shown for any counter)."""
    unmeasured: Callable[[Measured], str | None] | None = None
    """Why a measurement has none of its numbers, beyond the device it ran on (None: it has them)."""
    parts: tuple[Part, ...] = ()
    """The fields of a measurement its probes fill (beyond the exact counters, which every region keeps alike), and
    how each merges across regions and runs."""
    traced: tuple[Traced, ...] = ()
    """What it reads of each traced region into its parts (:func:`..instruments.with_traced_runs`)."""
    kept: Kept | None = None
    """What a test's results keep of it, beyond its metrics and budgets."""


def named(name: str) -> Callable[[str], str]:
    """A budget kind's metric that is one metric whatever the ``stat``."""
    return lambda stat: name


def counter_kind(signal: Signal, spec: CounterSpec) -> BudgetKind:
    """The budget of a counter with a marker (:attr:`CounterSpec.budget`): ``marker(limit)`` on the count, or on
    the count per token where the counter is given so."""
    assert spec.budget is not None, spec
    over = " divided by tokens" if spec.per_token else " in the region"

    def marker(limit: float) -> None:
        pass

    marker.__name__ = marker.__qualname__ = spec.budget
    marker.__doc__ = f"Fail when {spec.description}{over} exceed ``limit``.{signal.needs_text}"
    metric = f"{spec.name}_per_token" if spec.per_token else spec.name
    sentence = spec.sentence or _counted(spec)
    return BudgetKind(
        spec.budget, marker, signal.name, named(metric), sentence, needs_tokens=spec.per_token, counter=spec.name
    )


def _counted(spec: CounterSpec) -> Sentence:
    """The sentence of a counter's budget that has no sentence of its own."""

    def sentence(budget: Limit, value: float, m: Measured, example: int) -> str:
        if spec.per_token:
            return (
                f"{budget.marker}: limit {budget.limit:g} per token, measured {value:.1f}: {m.count(spec.name)} "
                f"{spec.description} over {m.tokens} tokens"
            )
        return f"{budget.marker}: limit {budget.limit:g}, measured {value:g} {spec.description}"

    return sentence
