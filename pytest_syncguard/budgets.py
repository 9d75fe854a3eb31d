"""Budget markers: each kind described once (:data:`KINDS`), parsed and validated into frozen budgets, and
checked against a measurement."""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .analysis.gaps import parse_stat
from .document.budget import Budget, BudgetCheck
from .metrics import parse_tolerance
from .signals import KINDS, BudgetKind

if TYPE_CHECKING:
    import pytest

    from .measurement import Measurement


class BudgetError(Exception):
    """A budget marker or option that cannot be used; the message names the test and the marker."""


# The marker functions are never called for their result: their signatures are the markers' API, used to bind
# the marker's arguments, and their docstrings are what `pytest --markers` shows. Each budget's is its signal's
# (:mod:`.signals`); this one holds a test's options.
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
    _misspelt(item)
    budgets: dict[tuple[str, str], Budget] = {}
    for name, kind in KINDS.items():
        for marker in item.iter_markers(name):
            arguments = _bind(item, name, kind.signature, marker.args, marker.kwargs)
            stat = arguments[kind.stat] if kind.stat is not None else "max"
            if kind.stat is not None:
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


def _misspelt(item: pytest.Item) -> None:
    """A :class:`BudgetError` for a marker of the test that no one registered and that is spelt nearly as one of
    the plugin's (``max_sync_per_token``): as written, the budget it means is never enforced."""
    ours = [*KINDS, "syncguard"]
    registered = {line.split("(")[0].split(":")[0].strip() for line in item.config.getini("markers")}
    for marker in item.iter_markers():
        if marker.name in ours or marker.name in registered:
            continue
        closest = difflib.get_close_matches(marker.name, ours, n=1, cutoff=0.8)
        if closest:
            raise BudgetError(
                f"{item.nodeid}: @pytest.mark.{marker.name} is no marker of pytest-syncguard: did you "
                f"mean @pytest.mark.{closest[0]}? As written, no budget is enforced"
            )


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


def _unmeasured(budget: Budget, measurement: Measurement) -> str | None:
    """Why the budget's signal is missing from the measurement, if it is."""
    if measurement.unmeasured is not None:
        return measurement.unmeasured
    counter = budget.kind.counter
    if counter is not None and (why := measurement.uncounted(counter)) is not None:
        return why
    signal = budget.signal
    if signal.cuda and not measurement.on_device:
        return f"needs CUDA; ran on {measurement.device}"
    return signal.unmeasured(measurement) if signal.unmeasured is not None else None


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
        elif budget.signal.name == "timeline" and measurement.unreliable_timeline is not None:
            text = f"{budget.marker}: unreliable: {measurement.unreliable_timeline}"
            checks.append(BudgetCheck(budget, None, False, text))
        elif (reason := _unmeasured(budget, measurement)) is not None:
            checks.append(budget.not_measured(reason, required=require_gpu))
        else:
            checks.append(budget.check(measurement))
    return checks, error
