"""A test's measured result as plain data: what reports, xdist and the JSON file carry."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..analysis.sites import Frame
from ..budgets import SyncBudget, Verdict
from ..guard import SyncMeasurement
from ..metrics import measured

TOP_SITES = 10


def _display(frame: Frame) -> str:
    """A frame as ``file:line in function``, the file relative to the working directory when inside it."""
    path = os.path.abspath(frame.filename)
    cwd = os.getcwd() + os.sep
    shown = path[len(cwd) :] if path.startswith(cwd) else frame.filename
    return f"{shown}:{frame.lineno} in {frame.function}"


@dataclass(frozen=True)
class BudgetOutcome:
    marker: str
    limit: float
    value: float | None
    passed: bool | None
    """None when the budget could not be judged (a usage error) or measured (no CUDA)."""
    text: str
    describe: str = ""
    """The budget in short, e.g. ``max_gpu_idle_us(p99)<=50``."""


@dataclass(frozen=True)
class SiteRecord:
    kind: str
    op: str
    site: str
    count: int
    stack: list[str]


@dataclass(frozen=True)
class TestResult:
    """Everything the plugin knows about one test; plain data so it survives pytest-xdist."""

    nodeid: str
    device: str
    tokens: int | None
    syncs: int
    allowed_syncs: int
    syncs_per_token: float | None
    regions: int
    by_kind: dict[str, int]
    invisible_kinds: list[str]
    budgets: list[BudgetOutcome] = field(default_factory=list)
    sites: list[SiteRecord] = field(default_factory=list)
    more_sites: int = 0
    more_syncs: int = 0
    error: str | None = None
    timeline: dict[str, Any] | None = None
    """The GPU timeline of the test's last region with GPU work (``Timeline.to_dict``)."""
    timeline_regions: int = 0
    memory: list[dict[str, Any]] = field(default_factory=list)
    """Allocator numbers per region and device (``MemoryStats.to_dict``)."""
    allocation_sites: list[dict[str, Any]] = field(default_factory=list)
    """The largest allocation sites of a failing test's allocator history (``AllocationSite.to_dict``)."""
    artifacts: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    """Every metric measured (``metrics.METRICS``): counts, and medians over runs of the noisy ones."""
    samples: dict[str, int] = field(default_factory=dict)
    """How many runs each metric is the median of."""
    baseline: dict[str, Any] | None = None
    """The comparison with the baseline entry (``Comparison.to_dict``); None when not compared."""
    notes: list[str] = field(default_factory=list)
    fingerprint: dict[str, str | None] = field(default_factory=dict)
    """The environment of the run, when compared with a baseline (``environment.fingerprint``)."""

    @property
    def verdict(self) -> str:
        """error, fail, regression (against the baseline), pass, "not measured" (nothing failed, something
        could not be measured) or measured."""
        if self.error is not None:
            return "error"
        if any(b.passed is False for b in self.budgets):
            return "fail"
        if self.baseline is not None and self.baseline["status"] == "regression":
            return "regression"
        if not self.budgets:
            return "measured"
        return "pass" if all(b.passed for b in self.budgets) else "not measured"

    @property
    def failed(self) -> bool:
        return self.verdict in ("fail", "error", "regression")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["verdict"] = self.verdict
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TestResult:
        data = dict(data)
        data.pop("verdict", None)
        data["budgets"] = [BudgetOutcome(**b) for b in data.get("budgets", [])]
        data["sites"] = [SiteRecord(**s) for s in data.get("sites", [])]
        return cls(**data)

    @classmethod
    def build(
        cls,
        nodeid: str,
        measurement: SyncMeasurement,
        verdicts: list[Verdict],
        *,
        unjudged: Sequence[SyncBudget] = (),
        error: str | None = None,
    ) -> TestResult:
        sites = measurement.sites()
        shown, rest = sites[:TOP_SITES], sites[TOP_SITES:]
        timelines = [t for t in measurement.timelines if t is not None]
        values, samples = measured(measurement)
        return cls(
            nodeid=nodeid,
            device=measurement.device,
            tokens=measurement.tokens,
            syncs=measurement.syncs,
            allowed_syncs=measurement.allowed_syncs,
            syncs_per_token=measurement.syncs_per_token,
            regions=measurement.regions,
            by_kind=measurement.by_kind(),
            invisible_kinds=list(measurement.invisible_kinds),
            budgets=[
                BudgetOutcome(v.budget.marker, v.budget.limit, v.value, v.passed, v.text, v.budget.describe())
                for v in verdicts
            ]
            + [BudgetOutcome(b.marker, b.limit, None, None, "not judged", b.describe()) for b in unjudged],
            sites=[
                SiteRecord(s.kind, s.op, _display(s.site) if s.site else "?", s.count, [_display(f) for f in s.stack])
                for s in shown
            ],
            more_sites=len(rest),
            more_syncs=sum(s.count for s in rest),
            error=error,
            timeline=timelines[-1].to_dict() if timelines else None,
            timeline_regions=len(timelines),
            memory=[m.to_dict() for m in measurement.memory],
            metrics=values,
            samples=samples,
        )
