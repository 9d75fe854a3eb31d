"""Budget markers: each kind described once (:data:`KINDS`), parsed and validated into frozen budgets, and
checked against a measurement."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .analysis.counts import COUNTERS, CounterSpec
from .analysis.gaps import parse_stat, steps_note
from .metrics import MIB, Metric, gap_metric_name, metric

if TYPE_CHECKING:
    import pytest

    from .measurement import Measurement


class BudgetError(Exception):
    """A budget marker or option that cannot be used; the message names the test and the marker."""


# The marker functions below are never called for their result: their signatures are the markers' API,
# used to bind the marker's arguments, and their docstrings are what `pytest --markers` shows.
def max_syncs_per_token(limit: float) -> None:
    """Fail when host-device syncs divided by tokens (decode steps) exceed ``limit``."""


def max_syncs(limit: float) -> None:
    """Fail when the total of host-device syncs in the region (or the whole test) exceeds ``limit``."""


def max_gpu_idle_us(limit: float, *, stat: str = "max") -> None:
    """Fail when the GPU's idle gaps in the region (all streams merged, steady state) exceed ``limit`` us;
    ``stat`` is "max", "mean" or a percentile such as "p99". Needs CUDA."""


def min_gpu_busy(fraction: float) -> None:
    """Fail when GPU busy time over the region's GPU span (steady state) is below ``fraction``. Needs CUDA."""


def max_fragmentation(limit: float) -> None:
    """Fail when 1 - allocated_peak / reserved_peak of the CUDA caching allocator in the region exceeds
    ``limit`` (peaks reset at entry). Needs CUDA."""


def max_reserved_mb(limit: float) -> None:
    """Fail when the CUDA caching allocator's reserved peak in the region exceeds ``limit`` MiB. Needs CUDA."""


def no_async_races() -> None:
    """Fail when the host reads or writes memory whose non_blocking copy it has not waited for (a race: the
    value read may be stale). Checked by default in measured regions on CUDA under --syncguard; the marker
    requires it everywhere. Needs CUDA and the native extension."""


def syncguard(
    *,
    device: str | None = None,
    warmup: int = 1,
    warmup_steps: int = 2,
    tolerance: float | None = None,
    baseline: bool = True,
) -> None:
    """Per-test options: ``device`` ("cpu" or "cuda") the region computes on, ``warmup`` runs before ``measure``,
    ``warmup_steps`` decode steps left out of the GPU timeline budgets, ``tolerance`` (relative) for this test's
    noisy metrics against its baseline, ``baseline=False`` to keep the test out of baselines."""


Signal = Literal["syncs", "ops", "compiles", "timeline", "memory", "races"]
#: The signals whose metrics vary from run to run (judged on medians, and A/B): the only budgets a timings-only run
#: (--syncguard-timings-only) checks; the others are counts, judged once in a run that counts.
TIMED_SIGNALS: frozenset[Signal] = frozenset({"timeline", "memory"})


def closest_run(values: Sequence[float], value: float) -> int:
    """The index of the run whose value is nearest ``value`` (the median a verdict reads, or the worst): the run
    a sentence or a report shows as an example of it."""
    return min(range(len(values)), key=lambda i: abs(values[i] - value))


@dataclass(frozen=True)
class BudgetKind:
    """One budget marker, described once: its signature (the marker function), the signal it needs, the metric
    it reads (whose rule aggregates its runs, as for the summary and the baseline), its bounds and direction, and
    its sentence."""

    marker: str
    signature: Callable[..., None]
    signal: Signal
    metric: Callable[[str], str]
    """The name of the metric it reads, given the budget's ``stat``."""
    sentence: Callable[[Budget, float, Measurement, int], str]
    """The arithmetic of a check in words, from the value it read, the measurement and the index of the run
    nearest that value (the example the sentence quotes)."""
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
    """The exact counter it reads (:data:`.analysis.counts.COUNTERS`), whose probe may say why it has none."""


def _per_token(budget: Budget, value: float, m: Measurement, example: int) -> str:
    return (
        f"{budget.marker}: limit {budget.limit:.2f} per token, measured {value:.2f}: "
        f"{m.syncs} syncs over {m.tokens} tokens"
    )


def _total(budget: Budget, value: float, m: Measurement, example: int) -> str:
    return f"{budget.marker}: limit {budget.limit:g}, measured {m.syncs} syncs"


def _judged_steps(m: Measurement, example: int) -> str:
    timelines = m.gpu_timelines
    shown = timelines[example]
    runs = f"median of {len(timelines)} regions, " if len(timelines) > 1 else ""
    steps = "no steps"
    if shown.steps:
        steps = f"{shown.judged_steps} steps judged after {shown.warmup_steps} warm-up{steps_note(shown.steps_from)}"
    return runs + steps


def _idle(budget: Budget, value: float, m: Measurement, example: int) -> str:
    gaps = len(m.gpu_timelines[example].gaps_us)
    return (
        f"{budget.marker}: limit {budget.limit:g} us ({budget.stat} gap), measured {value:.1f} us "
        f"({gaps} gaps, {_judged_steps(m, example)})"
    )


def _busy(budget: Budget, value: float, m: Measurement, example: int) -> str:
    shown = m.gpu_timelines[example]
    return (
        f"{budget.marker}: limit {budget.limit:.2f}, measured {value:.3f}: GPU busy {shown.busy_us:.0f} us "
        f"of a {shown.span_us:.0f} us span ({_judged_steps(m, example)})"
    )


def _fragmentation(budget: Budget, value: float, m: Measurement, example: int) -> str:
    worst = m.memory[example]
    return (
        f"{budget.marker}: limit {budget.limit:.2f}, measured {value:.3f}: 1 - allocated peak "
        f"{worst.allocated_peak / MIB:.1f} MiB / reserved peak {worst.reserved_peak / MIB:.1f} MiB"
    )


def _ops(budget: Budget, value: float, m: Measurement, example: int) -> str:
    return (
        f"{budget.marker}: limit {budget.limit:g} per token, measured {value:.1f}: {m.count('ops')} operators "
        f"over {m.tokens} tokens"
    )


def _launches(budget: Budget, value: float, m: Measurement, example: int) -> str:
    graphs = m.count("graph_launches") or 0
    kernels = (m.count("launches") or 0) - graphs
    return (
        f"{budget.marker}: limit {budget.limit:g} per token, measured {value:.1f}: {kernels} kernel launches and "
        f"{graphs} CUDA graph launches ({m.count('graph_kernels') or 0} kernels in the graphs) over {m.tokens} tokens"
    )


def _recompiles(budget: Budget, value: float, m: Measurement, example: int) -> str:
    return (
        f"{budget.marker}: limit {budget.limit:g}, measured {value:g} recompilations "
        f"({m.count('frames_compiled') or 0} frames compiled in the region)"
    )


def _counted(budget: Budget, value: float, m: Measurement, example: int) -> str:
    """The sentence of a counter's budget that has no sentence of its own (:data:`_COUNTER_SENTENCES`)."""
    spec = COUNTERS[budget.kind.counter or ""]
    if spec.per_token:
        return (
            f"{budget.marker}: limit {budget.limit:g} per token, measured {value:.1f}: {m.count(spec.name)} "
            f"{spec.description} over {m.tokens} tokens"
        )
    return f"{budget.marker}: limit {budget.limit:g}, measured {value:g} {spec.description}"


def _reserved(budget: Budget, value: float, m: Measurement, example: int) -> str:
    return f"{budget.marker}: limit {budget.limit:g} MiB, measured reserved peak {value:.1f} MiB"


def _races(budget: Budget, value: float, m: Measurement, example: int) -> str:
    return (
        f"{budget.marker}: measured {value:g} host accesses of memory whose non_blocking copy the host had not "
        "waited for"
    )


def _named(name: str) -> Callable[[str], str]:
    return lambda stat: name


#: Counters' budgets that say more than :func:`_counted` does.
_COUNTER_SENTENCES = {"max_ops_per_token": _ops, "max_launches_per_token": _launches, "max_recompiles": _recompiles}
#: What a counter's budget needs, by the probe that counts it (:attr:`.analysis.counts.CounterSpec.source`).
_COUNTER_SIGNALS: dict[str, tuple[Signal, str]] = {
    "ops": ("ops", " Needs the native extension."),
    "compiles": ("compiles", ""),
    "timeline": ("timeline", " Needs CUDA; counted from the timeline capture."),
    "allocator": ("memory", " Needs CUDA."),
    "races": ("races", " Needs CUDA and the native extension."),
}


def _counter_kind(spec: CounterSpec) -> BudgetKind:
    """The budget of a counter with a marker (:attr:`.analysis.counts.CounterSpec.budget`): ``marker(limit)`` on
    the count, or on the count per token where the counter is given so."""
    assert spec.budget is not None, spec
    signal, needs = _COUNTER_SIGNALS[spec.source]
    over = " divided by tokens" if spec.per_token else " in the region"

    def marker(limit: float) -> None:
        pass

    marker.__name__ = marker.__qualname__ = spec.budget
    marker.__doc__ = f"Fail when {spec.description}{over} exceed ``limit``.{needs}"
    metric = f"{spec.name}_per_token" if spec.per_token else spec.name
    sentence = _COUNTER_SENTENCES.get(spec.budget, _counted)
    return BudgetKind(
        spec.budget, marker, signal, _named(metric), sentence, needs_tokens=spec.per_token, counter=spec.name
    )


NO_OWN_MEMORY = (
    "no CUDA memory stats for the region, or the GPU's memory ran out during it (the allocator retried a cudaMalloc "
    "after freeing its cache: its peaks then depend on what else held that GPU's memory)"
)

KINDS: dict[str, BudgetKind] = {
    kind.marker: kind
    for kind in (
        BudgetKind(
            "max_syncs_per_token", max_syncs_per_token, "syncs", _named("syncs_per_token"), _per_token,
            needs_tokens=True,
        ),
        BudgetKind("max_syncs", max_syncs, "syncs", _named("syncs"), _total),
        *(_counter_kind(spec) for spec in COUNTERS.values() if spec.budget is not None),
        BudgetKind(
            "max_gpu_idle_us", max_gpu_idle_us, "timeline", gap_metric_name, _idle,
            unmeasured="the region launched no GPU work",
        ),
        BudgetKind(
            "min_gpu_busy", min_gpu_busy, "timeline", _named("busy_fraction"), _busy,
            limit_argument="fraction", upper=False, fraction=True, unmeasured="the region launched no GPU work",
        ),
        BudgetKind(
            "max_fragmentation", max_fragmentation, "memory", _named("fragmentation"), _fragmentation,
            fraction=True, unmeasured=NO_OWN_MEMORY,
        ),
        BudgetKind(
            "max_reserved_mb", max_reserved_mb, "memory", _named("reserved_mb"), _reserved,
            unmeasured=NO_OWN_MEMORY,
        ),
        BudgetKind(
            "no_async_races", no_async_races, "races", _named("async_races"), _races, limit_argument=None,
            counter="async_races",
        ),
    )
}  # fmt: skip


def _signature(function: Callable[..., None]) -> inspect.Signature:
    return inspect.signature(function, eval_str=True).replace(return_annotation=inspect.Signature.empty)


def marker_docs() -> list[tuple[str, str, str]]:
    """Every marker of the plugin as (name, signature, description): the reference and ``pytest --markers``."""
    functions = {**{name: kind.signature for name, kind in KINDS.items()}, "syncguard": syncguard}
    return [
        (name, str(_signature(function)), " ".join((inspect.getdoc(function) or "").split()))
        for name, function in functions.items()
    ]


def marker_lines() -> list[str]:
    """The ``markers`` ini lines of every marker of the plugin: its signature and its docstring."""
    return [f"{name}{signature}: {description}" for name, signature, description in marker_docs()]


def _bind(
    item: pytest.Item, name: str, function: Callable[..., None], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    try:
        bound = _signature(function).bind(*args, **kwargs)
    except TypeError as exc:
        raise BudgetError(f"{item.nodeid}: @pytest.mark.{name}{_signature(function)}: {exc}") from None
    bound.apply_defaults()
    return dict(bound.arguments)


def _finite(value: Any) -> bool:
    """A finite int or float (not a bool; an int too large for a float is not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _limit(item: pytest.Item, kind: BudgetKind, value: Any) -> float:
    if not _finite(value) or value < 0:
        raise BudgetError(
            f"{item.nodeid}: @pytest.mark.{kind.marker}: limit must be a finite number >= 0, got {value!r}"
        )
    if kind.fraction and value > 1:
        raise BudgetError(f"{item.nodeid}: @pytest.mark.{kind.marker}: limit is a fraction in [0, 1], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Budget:
    """A limit from one budget marker (``stat`` matters to ``max_gpu_idle_us`` only)."""

    marker: str
    limit: float
    stat: str = "max"

    @property
    def kind(self) -> BudgetKind:
        return KINDS[self.marker]

    @property
    def signal(self) -> Signal:
        return self.kind.signal

    @property
    def metric(self) -> Metric:
        found = metric(self.kind.metric(self.stat))
        assert found is not None, self
        return found

    def describe(self) -> str:
        """The budget in short, e.g. ``max_gpu_idle_us(p99)<=50``."""
        name = f"{self.marker}({self.stat})" if self.marker == "max_gpu_idle_us" else self.marker
        if self.kind.limit_argument is None:
            return name
        return f"{name}{'<=' if self.kind.upper else '>='}{self.limit:g}"

    def not_measured(self, reason: str, *, required: bool = False) -> BudgetCheck:
        """No value: the signal is missing (a CPU run). With ``required`` that fails the budget."""
        suffix = " (--syncguard-require-gpu)" if required else ""
        return BudgetCheck(self, None, False if required else None, f"{self.marker}: not measured: {reason}{suffix}")

    def check(self, measurement: Measurement) -> BudgetCheck:
        """The value the budget's metric takes over the measurement's runs, against the limit."""
        runs = self.metric.runs(measurement)
        if not runs:
            return self.not_measured(self.kind.unmeasured or "nothing was measured")
        value = self.metric.aggregate(runs)
        held = value <= self.limit if self.kind.upper else value >= self.limit
        text = self.kind.sentence(self, value, measurement, closest_run(runs, value))
        return BudgetCheck(self, value, held, text)


@dataclass(frozen=True)
class BudgetCheck:
    """One budget against a measurement: the value its metric took, whether it held (None: not measured or not
    checked), and the arithmetic in words."""

    budget: Budget
    value: float | None
    held: bool | None
    text: str


@dataclass(frozen=True)
class GuardOptions:
    """The ``syncguard`` marker's per-test options."""

    device: str | None = None
    warmup: int = 1
    warmup_steps: int = 2
    tolerance: float | None = None
    baseline: bool = True


def budgets_for(item: pytest.Item) -> tuple[Budget, ...]:
    """The budgets a test carries. Every copy of a budget marker (on the test, a parametrize case, its class, its
    module, or added by a fixture) is an assertion that must hold, so each is validated and the strictest limit
    of each marker (and ``stat``) is the one checked: a closer marker never loosens a farther one."""
    budgets: dict[tuple[str, str], Budget] = {}
    for name, kind in KINDS.items():
        for marker in item.iter_markers(name):
            arguments = _bind(item, name, kind.signature, marker.args, marker.kwargs)
            stat = arguments.get("stat", "max")
            if name == "max_gpu_idle_us":
                try:
                    parse_stat(stat)
                except ValueError as exc:
                    raise BudgetError(f"{item.nodeid}: @pytest.mark.{name}: {exc}") from None
            limit = 0.0 if kind.limit_argument is None else _limit(item, kind, arguments[kind.limit_argument])
            budget = Budget(name, limit, stat)
            known = budgets.get((name, stat))
            if known is None or (budget.limit < known.limit if kind.upper else budget.limit > known.limit):
                budgets[(name, stat)] = budget
    return tuple(budgets.values())


#: Checked in every measured test on CUDA under --syncguard, marker or not.
DEFAULT_RACE_CHECK = Budget("no_async_races", 0.0)


def with_default_checks(budgets: tuple[Budget, ...], on_cuda: bool) -> tuple[Budget, ...]:
    """A measured test's budgets under --syncguard: with the race check on CUDA, where its marker is absent."""
    if not on_cuda or any(b.marker == DEFAULT_RACE_CHECK.marker for b in budgets):
        return budgets
    return (*budgets, DEFAULT_RACE_CHECK)


def options_for(item: pytest.Item) -> GuardOptions:
    """The test's ``syncguard`` marker options, validated."""
    marker = item.get_closest_marker("syncguard")
    if marker is None:
        return GuardOptions()
    arguments = _bind(item, "syncguard", syncguard, marker.args, marker.kwargs)
    device, warmup, warmup_steps = arguments["device"], arguments["warmup"], arguments["warmup_steps"]
    if device is not None and device not in ("cpu", "cuda"):
        raise BudgetError(f"{item.nodeid}: @pytest.mark.syncguard: device must be 'cpu' or 'cuda', got {device!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise BudgetError(f"{item.nodeid}: @pytest.mark.syncguard: warmup must be an int >= 0, got {warmup!r}")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise BudgetError(
            f"{item.nodeid}: @pytest.mark.syncguard: warmup_steps must be an int >= 0, got {warmup_steps!r}"
        )
    tolerance, baseline = arguments["tolerance"], arguments["baseline"]
    if tolerance is not None:
        try:
            tolerance = parse_tolerance(tolerance)
        except ValueError as exc:
            raise BudgetError(f"{item.nodeid}: @pytest.mark.syncguard: tolerance {exc}") from None
    if not isinstance(baseline, bool):
        raise BudgetError(f"{item.nodeid}: @pytest.mark.syncguard: baseline must be True or False, got {baseline!r}")
    return GuardOptions(device, warmup, warmup_steps, tolerance, baseline)


def parse_tolerance(value: Any) -> float:
    """A relative tolerance: a finite number >= 0 (a string from the command line is converted)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"must be a number >= 0, got {value!r}") from None
    if not _finite(value) or value < 0:
        raise ValueError(f"must be a finite number >= 0, got {value!r}")
    return float(value)


def _unmeasured(budget: Budget, measurement: Measurement) -> str | None:
    """Why the budget's signal is missing from the measurement, if it is."""
    if measurement.unmeasured is not None:
        return measurement.unmeasured
    counter = budget.kind.counter
    if counter is not None and (why := measurement.uncounted(counter)) is not None:
        return why
    if budget.signal not in ("syncs", "ops", "compiles") and not measurement.on_device:
        return f"needs CUDA; ran on {measurement.device}"
    if budget.signal == "timeline" and not measurement.timelines:
        return "no GPU timeline was recorded"
    return None


def check_budgets(
    nodeid: str, budgets: Sequence[Budget], measurement: Measurement, *, require_gpu: bool
) -> tuple[list[BudgetCheck], str | None]:
    """Each budget against the measurement, and the usage error that kept some from being checked (a per-token
    budget without a token count). A budget whose signal is missing is "not measured", which fails it with
    ``require_gpu``; it never passes. A timeline budget over a trace that cannot be trusted fails with the
    reason ("unreliable"), never with a number."""
    checks = []
    error = None
    for budget in budgets:
        if budget.kind.needs_tokens and not measurement.tokens:
            error = error or (
                f"{nodeid}: @pytest.mark.{budget.marker} needs a token count: pass tokens= or model= to "
                "syncguard.generation() or syncguard.measure(), or set region.tokens inside the region"
            )
            checks.append(BudgetCheck(budget, None, None, "not checked"))
        elif budget.signal == "timeline" and measurement.unreliable_timeline is not None:
            text = f"{budget.marker}: unreliable: {measurement.unreliable_timeline}"
            checks.append(BudgetCheck(budget, None, False, text))
        elif (reason := _unmeasured(budget, measurement)) is not None:
            checks.append(budget.not_measured(reason, required=require_gpu))
        else:
            checks.append(budget.check(measurement))
    return checks, error
