"""Budget markers: parsed and validated into frozen budgets, judged against a measurement."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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


def syncguard(*, device: str | None = None, warmup: int = 1) -> None:
    """Per-test options: ``device`` ("cpu" or "cuda") the region computes on, ``warmup`` runs before ``measure``."""


BUDGET_MARKERS: dict[str, Callable[..., None]] = {
    "max_syncs_per_token": max_syncs_per_token,
    "max_syncs": max_syncs,
}


def _signature(function: Callable[..., None]) -> inspect.Signature:
    return inspect.signature(function, eval_str=True).replace(return_annotation=inspect.Signature.empty)


def marker_help(name: str, function: Callable[..., None]) -> str:
    """The ``markers`` ini line of a marker: its signature and its docstring."""
    return f"{name}{_signature(function)}: {inspect.getdoc(function)}"


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
    return float(value)


@dataclass(frozen=True)
class SyncBudget:
    """A limit on syncs, per token or in total."""

    marker: str
    limit: float

    @property
    def per_token(self) -> bool:
        return self.marker == "max_syncs_per_token"

    def describe(self) -> str:
        limit = f"{self.limit:g}"
        return f"<= {limit}/token" if self.per_token else f"<= {limit}"

    def judge(self, measurement: SyncMeasurement) -> Verdict:
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


@dataclass(frozen=True)
class Verdict:
    """The outcome of one budget: the measured value, whether it held, and the arithmetic in words."""

    budget: SyncBudget
    value: float
    passed: bool
    text: str


@dataclass(frozen=True)
class TestOptions:
    """The ``syncguard`` marker's per-test options."""

    device: str | None = None
    warmup: int = 1


def budgets_for(item: pytest.Item) -> tuple[SyncBudget, ...]:
    """The budgets a test carries; the closest marker of each name wins (function over class over module)."""
    budgets = []
    for name, function in BUDGET_MARKERS.items():
        marker = item.get_closest_marker(name)
        if marker is None:
            continue
        arguments = _bind(item, name, function, marker.args, marker.kwargs)
        budgets.append(SyncBudget(name, _limit(item, name, arguments["limit"])))
    return tuple(budgets)


def options_for(item: pytest.Item) -> TestOptions:
    """The test's ``syncguard`` marker options, validated."""
    marker = item.get_closest_marker("syncguard")
    if marker is None:
        return TestOptions()
    arguments = _bind(item, "syncguard", syncguard, marker.args, marker.kwargs)
    device, warmup = arguments["device"], arguments["warmup"]
    if device is not None and device not in ("cpu", "cuda"):
        raise BudgetError(f"{item.nodeid}: @pytest.mark.syncguard: device must be 'cpu' or 'cuda', got {device!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise BudgetError(f"{item.nodeid}: @pytest.mark.syncguard: warmup must be an int >= 0, got {warmup!r}")
    return TestOptions(device=device, warmup=warmup)
