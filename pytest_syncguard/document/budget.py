"""A budget as the results document records it: the marker's limit, and its check against a measurement (the value
its metric took, whether it held, the arithmetic in words). The markers' parser is :mod:`..budgets`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..metrics import Metric, metric
from ..signals import BY_NAME, KINDS, BudgetKind, Signal

if TYPE_CHECKING:
    from ..measurement import Measurement


def closest_run(values: Sequence[float], value: float) -> int:
    """The index of the run whose value is nearest ``value`` (the median a verdict reads, or the worst): the run
    a sentence or a report shows as an example of it."""
    return min(range(len(values)), key=lambda i: abs(values[i] - value))


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
        """The signal it judges."""
        return BY_NAME[self.kind.signal]

    @property
    def metric(self) -> Metric:
        found = metric(self.kind.metric(self.stat))
        assert found is not None, self
        return found

    def describe(self) -> str:
        """The budget in short, e.g. ``max_gpu_idle_us(p99)<=50``; of a marker this version does not know (a record
        of another version), its name and limit as the record has them, said unknown."""
        if self.marker not in KINDS:
            return f"{self.marker}({self.stat}) {self.limit:g} (a budget this version of syncguard does not know)"
        name = f"{self.marker}({self.stat})" if self.kind.stat is not None else self.marker
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
