"""The races signal: host accesses of memory whose non_blocking copy the host had not waited for, found by the
race watch (:mod:`..probes.races`) on CUDA with the native extension."""

from __future__ import annotations

from .base import BudgetKind, CounterSpec, Limit, Measured, Part, Runs, Signal, chained, named


def no_async_races() -> None:
    """Fail when the host reads or writes memory whose non_blocking copy it has not waited for (a race: the
    value read may be stale). Checked by default in measured regions on CUDA under --syncguard; the marker
    requires it everywhere. Needs CUDA and the native extension."""


def _races(budget: Limit, value: float, m: Measured, example: int) -> str:
    return (
        f"{budget.marker}: measured {value:g} host accesses of memory whose non_blocking copy the host had not "
        "waited for"
    )


SIGNAL = Signal(
    "races",
    counters=(
        CounterSpec(
            "async_races",
            "host accesses of memory whose non_blocking copy the host had not waited for",
            quiet_when_zero=True,
            column="races",
        ),
    ),
    kinds=(
        BudgetKind(
            "no_async_races",
            no_async_races,
            "races",
            named("async_races"),
            _races,
            limit_argument=None,
            counter="async_races",
        ),
    ),
    cuda=True,
    needs_text=" Needs CUDA and the native extension.",
    on_demand=True,
    probes="races",
    parts=(Part("races", chained, Runs.EVERY, empty=tuple),),
)
