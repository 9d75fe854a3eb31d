"""Budget markers: parsed and validated into frozen budgets, judged against a measurement."""

from __future__ import annotations

import inspect
import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .analysis.gaps import parse_stat

if TYPE_CHECKING:
    import pytest

    from .guard import SyncMeasurement


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


BUDGET_MARKERS: dict[str, Callable[..., None]] = {
    "max_syncs_per_token": max_syncs_per_token,
    "max_syncs": max_syncs,
    "max_gpu_idle_us": max_gpu_idle_us,
    "min_gpu_busy": min_gpu_busy,
    "max_fragmentation": max_fragmentation,
    "max_reserved_mb": max_reserved_mb,
}
#: The signal each budget needs: syncs are counted everywhere, the rest need a CUDA run.
SIGNAL = {
    "max_syncs_per_token": "syncs",
    "max_syncs": "syncs",
    "max_gpu_idle_us": "timeline",
    "min_gpu_busy": "timeline",
    "max_fragmentation": "memory",
    "max_reserved_mb": "memory",
}
#: Budgets whose limit is a fraction in [0, 1].
_FRACTIONS = frozenset({"min_gpu_busy", "max_fragmentation"})


def _signature(function: Callable[..., None]) -> inspect.Signature:
    return inspect.signature(function, eval_str=True).replace(return_annotation=inspect.Signature.empty)


def marker_help(name: str, function: Callable[..., None]) -> str:
    """The ``markers`` ini line of a marker: its signature and its docstring."""
    return f"{name}{_signature(function)}: {' '.join((inspect.getdoc(function) or '').split())}"


def _bind(
    item: pytest.Item, name: str, function: Callable[..., None], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    try:
        bound = _signature(function).bind(*args, **kwargs)
    except TypeError as exc:
        raise BudgetError(f"{item.nodeid}: @pytest.mark.{name}{_signature(function)}: {exc}") from None
    bound.apply_defaults()
    return dict(bound.arguments)


def _limit(item: pytest.Item, name: str, value: Any) -> float:
    bad = isinstance(value, bool) or not isinstance(value, (int, float))
    if bad or not math.isfinite(value) or value < 0:
        raise BudgetError(f"{item.nodeid}: @pytest.mark.{name}: limit must be a finite number >= 0, got {value!r}")
    if name in _FRACTIONS and value > 1:
        raise BudgetError(f"{item.nodeid}: @pytest.mark.{name}: limit is a fraction in [0, 1], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class SyncBudget:
    """A limit from one budget marker: on syncs (per token or in total), GPU idle gaps, busy fraction,
    fragmentation or reserved memory."""

    marker: str
    limit: float
    stat: str = "max"

    @property
    def per_token(self) -> bool:
        return self.marker == "max_syncs_per_token"

    @property
    def signal(self) -> str:
        return SIGNAL[self.marker]

    def describe(self) -> str:
        limit = f"{self.limit:g}"
        if self.marker == "max_gpu_idle_us":
            return f"{self.marker}({self.stat})<={limit}"
        return f"{self.marker}>={limit}" if self.marker == "min_gpu_busy" else f"{self.marker}<={limit}"

    def not_measured(self, reason: str, *, required: bool = False) -> Verdict:
        """No value: the signal is missing (a CPU run). With ``required`` that fails the budget."""
        suffix = " (--syncguard-require-gpu)" if required else ""
        return Verdict(self, None, False if required else None, f"{self.marker}: not measured: {reason}{suffix}")

    def judge(self, measurement: SyncMeasurement) -> Verdict:
        if self.signal == "timeline":
            return self._judge_timeline(measurement)
        if self.signal == "memory":
            return self._judge_memory(measurement)
        syncs = measurement.syncs
        if self.per_token:
            tokens = measurement.tokens or 0
            value = syncs / tokens
            text = (
                f"{self.marker}: limit {self.limit:.2f} per token, measured {value:.2f}: "
                f"{syncs} syncs over {tokens} tokens"
            )
        else:
            value = float(syncs)
            text = f"{self.marker}: limit {self.limit:g}, measured {syncs} syncs"
        return Verdict(self, value, value <= self.limit, text)

    def _judge_timeline(self, measurement: SyncMeasurement) -> Verdict:
        timelines = [t for t in measurement.timelines if t is not None]
        if not timelines:
            return self.not_measured("the region launched no GPU work")
        runs = f"median of {len(timelines)} regions, " if len(timelines) > 1 else ""
        steps = timelines[-1]
        judged = f"{steps.judged_steps} steps judged after {steps.warmup_steps} warm-up" if steps.steps else "no steps"
        if self.marker == "max_gpu_idle_us":
            value = statistics.median([t.gap_stat(self.stat) for t in timelines])
            gaps = len(steps.gaps_us)
            text = (
                f"{self.marker}: limit {self.limit:g} us ({self.stat} gap), measured {value:.1f} us "
                f"({runs}{gaps} gaps, {judged})"
            )
            return Verdict(self, value, value <= self.limit, text)
        value = statistics.median([t.busy_fraction for t in timelines])
        text = (
            f"{self.marker}: limit {self.limit:.2f}, measured {value:.3f}: GPU busy {steps.busy_us:.0f} us "
            f"of a {steps.span_us:.0f} us span ({runs}{judged})"
        )
        return Verdict(self, value, value >= self.limit, text)

    def _judge_memory(self, measurement: SyncMeasurement) -> Verdict:
        stats = [m for m in measurement.memory if m is not None]
        if not stats:
            return self.not_measured("no CUDA memory stats for the region")
        worst = max(stats, key=lambda m: m.fragmentation if self.marker == "max_fragmentation" else m.reserved_peak)
        mib = 1024 * 1024
        if self.marker == "max_fragmentation":
            value = worst.fragmentation
            text = (
                f"{self.marker}: limit {self.limit:.2f}, measured {value:.3f}: 1 - allocated peak "
                f"{worst.allocated_peak / mib:.1f} MiB / reserved peak {worst.reserved_peak / mib:.1f} MiB"
            )
        else:
            value = worst.reserved_peak / mib
            text = f"{self.marker}: limit {self.limit:g} MiB, measured reserved peak {value:.1f} MiB"
        return Verdict(self, value, value <= self.limit, text)


@dataclass(frozen=True)
class Verdict:
    """The outcome of one budget: the measured value, whether it held (None: not measured), and the
    arithmetic in words."""

    budget: SyncBudget
    value: float | None
    passed: bool | None
    text: str


@dataclass(frozen=True)
class TestOptions:
    """The ``syncguard`` marker's per-test options."""

    device: str | None = None
    warmup: int = 1
    warmup_steps: int = 2
    tolerance: float | None = None
    baseline: bool = True


def budgets_for(item: pytest.Item) -> tuple[SyncBudget, ...]:
    """The budgets a test carries; the closest marker of each name wins (function over class over module)."""
    budgets = []
    for name, function in BUDGET_MARKERS.items():
        marker = item.get_closest_marker(name)
        if marker is None:
            continue
        arguments = _bind(item, name, function, marker.args, marker.kwargs)
        limit_argument = "fraction" if name == "min_gpu_busy" else "limit"
        stat = arguments.get("stat", "max")
        if name == "max_gpu_idle_us":
            try:
                parse_stat(stat)
            except ValueError as exc:
                raise BudgetError(f"{item.nodeid}: @pytest.mark.{name}: {exc}") from None
        budgets.append(SyncBudget(name, _limit(item, name, arguments[limit_argument]), stat))
    return tuple(budgets)


def options_for(item: pytest.Item) -> TestOptions:
    """The test's ``syncguard`` marker options, validated."""
    marker = item.get_closest_marker("syncguard")
    if marker is None:
        return TestOptions()
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
    return TestOptions(device, warmup, warmup_steps, tolerance, baseline)


def parse_tolerance(value: Any) -> float:
    """A relative tolerance: a finite number >= 0 (a string from the command line is converted)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"must be a number >= 0, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"must be a finite number >= 0, got {value!r}")
    return float(value)
