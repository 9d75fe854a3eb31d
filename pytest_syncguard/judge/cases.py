"""One measured test as a finished run reports it, read from its results file (:mod:`..document.file`) or, for
runs that wrote none, its JUnit case (:mod:`.junit`): what ``syncguard report`` compares and renders. No torch
here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..analysis.explain import Details, Explanation
from ..analysis.gaps import TimelineSummary
from ..document.comparison import Comparison, Drift, Fingerprint, Spread
from ..document.measured import MeasuredTest, RankResult, SiteRecord
from ..metrics import Metrics
from ..status import Status

#: A result's verdict as pytest's outcome of the test (what a JUnit file says).
_OUTCOMES = {"error": "error", "failed": "failed", "fail": "failed", Status.REGRESSION: "failed", "skipped": "skipped"}
#: The verdicts of a test that passed: its budgets held, it measured what it could, an expected failure.
_PASSING = frozenset({"pass", "measured", "not measured", "xfailed"})


def outcome_of(verdict: str) -> str:
    """pytest's outcome of a test of ``verdict``: passed where the verdict is a pass; a word this version does not
    know (``timeout``, ``crashed``: another version wrote it) is a failure, never read as a pass."""
    return _OUTCOMES.get(verdict) or ("passed" if verdict in _PASSING else "failed")


@dataclass(frozen=True)
class RunCase:
    """One measured test of a run."""

    nodeid: str
    outcome: str
    """passed, failed, error or skipped, as pytest reported the test."""
    verdict: str
    device_slug: str
    budgets: str | None
    """The test's budgets in short (``max_syncs_per_token<=1; ...``)."""
    metrics: Metrics
    baseline_status: str | None
    """The comparison the run made (None: it made none)."""
    baseline_values: Mapping[str, float]
    tolerance: float | None
    fingerprint: Fingerprint
    drift: Drift
    host_timings: bool = False
    details: Details | None = None
    spreads: Mapping[str, Spread] = field(default_factory=dict)
    """The spread of the baseline's recordings of each calibrated metric the run compared."""
    broken: tuple[str, ...] = ()
    """Each budget that failed, its limit and measurement in words (a JUnit file's case has none)."""
    sites: tuple[SiteRecord, ...] = ()
    """The test's sync sites, most frequent first."""
    timeline: TimelineSummary | None = None
    """Its median region's GPU timeline: the largest gaps with their causes."""
    explanation: Explanation = field(default_factory=Explanation)
    """What changed in its counts against the baseline the run compared it with."""
    host: str = ""
    """The GPU that measured it (:func:`..environment.host_id`); empty where unknown (a JUnit file's case)."""
    error: str | None = None
    """Why it erred (a rank that left no result of it included), where it did."""
    world_size: int = 1
    """The processes of the launch that measured it (torchrun's ranks)."""
    ranks: tuple[RankResult, ...] = ()
    """Each rank's part, where its ranks' documents were joined (:func:`..document.launch.join`)."""
    joined: Mapping[str, Any] = field(default_factory=dict)
    """Its ranks' records joined, by signal (the collectives matched: each rank's wait and transfer, the
    straggler)."""
    comparison: Comparison | None = None
    """The run's own judgement of it against the baseline entry it compared with, as its results file recorded it
    (None: a JUnit file's case, or no comparison made): a report against the same entry takes it as it is."""

    @property
    def compared(self) -> bool:
        """The run compared the test with a baseline entry (values in ``baseline_values``)."""
        return self.baseline_status not in (None, "new")

    @classmethod
    def of(cls, result: MeasuredTest) -> RunCase:
        """The case of a test's record in a results file."""
        comparison = result.comparison
        expected = result.expected_failure is not None  # XFAIL: what its mark expects fails no run
        return cls(
            nodeid=result.nodeid,
            outcome="skipped" if expected else outcome_of(result.verdict),
            verdict="xfailed" if expected else result.verdict,
            device_slug=result.device_slug,
            budgets="; ".join(c.budget.describe() for c in result.checks) or None,
            metrics=result.metrics,
            baseline_status=comparison.status if comparison is not None else None,
            baseline_values=comparison.baseline_values() if comparison is not None else {},
            tolerance=comparison.tolerance if comparison is not None else None,
            fingerprint=dict(comparison.fingerprint) if comparison is not None else {},
            drift=dict(comparison.drift) if comparison is not None else {},
            host_timings=comparison.host_timings if comparison is not None else False,
            details=result.details() if result.error is None and result.outcome is None else None,
            spreads={c.metric: c.spread for c in comparison.changes if c.spread} if comparison is not None else {},
            broken=() if expected else tuple(c.text for c in result.checks if c.held is False),
            sites=result.sites,
            timeline=result.timeline,
            explanation=comparison.explanation if comparison is not None else Explanation(),
            host=result.host,
            error=result.error,
            world_size=result.world_size,
            ranks=result.ranks,
            joined=result.joined,
            comparison=comparison,
        )
