"""The syncs signal: host-device syncs, counted by the sync probe (:mod:`..probes.syncs`) on CPU and CUDA, each
with its call site; budgets per token and in total."""

from __future__ import annotations

from ..words import plural
from .base import BudgetKind, Limit, Measured, Metric, Part, Section, Signal, chained, first_reason, named, worst


# The marker functions are never called for their result: their signatures are the markers' API, used to bind
# the marker's arguments, and their docstrings are what `pytest --markers` shows.
def max_syncs_per_token(limit: float) -> None:
    """Fail when host-device syncs divided by tokens (decode steps) exceed ``limit``."""


def max_syncs(limit: float) -> None:
    """Fail when the total of host-device syncs in the region (or the whole test) exceeds ``limit``."""


def _per_token(budget: Limit, value: float, m: Measured, example: int) -> str:
    return (
        f"{budget.marker}: limit {budget.limit:.2f} per token, measured {value:.2f}: "
        f"{plural(m.syncs, 'sync')} over {plural(m.tokens or 0, 'token')}"
    )


def _total(budget: Limit, value: float, m: Measured, example: int) -> str:
    return f"{budget.marker}: limit {budget.limit:g}, measured {plural(m.syncs, 'sync')}"


def _per_token_runs(m: Measured) -> list[float]:
    return [m.syncs / m.tokens] if m.tokens else []


SIGNAL = Signal(
    "syncs",
    metrics=(
        Metric(
            "syncs",
            "",
            counted=True,
            higher_is_better=False,
            floor=0.0,
            runs=lambda m: [float(m.syncs)],
            aggregate=worst,
            description="host-device syncs in the measured regions",
        ),
        Metric(
            "syncs_per_token",
            "",
            counted=True,
            higher_is_better=False,
            floor=0.0,
            runs=_per_token_runs,
            aggregate=worst,
            description="host-device syncs per token (decode step)",
        ),
    ),
    kinds=(
        BudgetKind(
            "max_syncs_per_token", max_syncs_per_token, "syncs", named("syncs_per_token"), _per_token, needs_tokens=True
        ),
        BudgetKind("max_syncs", max_syncs, "syncs", named("syncs"), _total),
    ),
    shows=frozenset({Section.SITES}),
    # A measure() keeps its worst run's syncs; where a run could not count the CUDA calls made outside torch (a
    # trace held CUPTI), a run that could is the worst.
    parts=(Part("events", chained), Part("cuda_calls_uncounted", first_reason)),
)
