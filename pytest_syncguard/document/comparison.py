"""A test against its baseline as the results document records it: each metric's change, the spread of the
recordings that calibrated its tolerance, and the overall status. How they are judged is :mod:`..judge.comparison`."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..analysis.explain import Explanation
from ..metrics import metric
from ..status import Status
from ..words import plural

#: A test's status against its baseline entry when a count the entry holds was not measured now.
NOT_MEASURED = Status.NOT_MEASURED
#: An update's status for a test whose entry was not written after all (its xdist worker went down first).
NOT_UPDATED = Status.NOT_UPDATED

Fingerprint = dict[str, "str | None"]
#: Fingerprint keys whose value differs: key -> [baseline's, this run's].
Drift = dict[str, "tuple[str | None, str | None]"]


@dataclass(frozen=True)
class Spread:
    """What a baseline stored of a metric's recordings (its value is their median): how many, on how many hosts
    (GPUs), and their standard deviation relative to the median."""

    recordings: int
    hosts: int
    relative_sd: float | None
    """None with a single recording. With :attr:`on_host`, the spread within hosts (each about its own mean)."""
    on_host: int = 0
    """How many of the recordings the judged run's own host made, where the value it is judged against is theirs and
    the spread the one within hosts (:func:`.baselines.reference_of`); 0: judged against all hosts' median."""
    new_host: bool = False
    """The judged run's host made none of the recordings, which know their hosts: judged against all hosts' median,
    within the spread of their means (a host has an offset of its own)."""

    def describe(self) -> str:
        """``spread ±0.21% over 4 recordings on 2 hosts``, or ``spread ±0.12% within 3 hosts over 12 recordings, 4 on
        this host``."""
        hosts = f" on {plural(self.hosts, 'host')}" if self.hosts else ""
        if self.relative_sd is None:
            return f"1 recording{hosts}, spread unknown"
        if self.on_host:
            return (
                f"spread ±{self.relative_sd:.2%} within {plural(self.hosts, 'host')} over "
                f"{plural(self.recordings, 'recording')}, {self.on_host} on this host"
            )
        unseen = ", none on this host" if self.new_host else ""
        return f"spread ±{self.relative_sd:.2%} over {plural(self.recordings, 'recording')}{hosts}{unseen}"


@dataclass(frozen=True)
class Change:
    """One metric against its baseline value."""

    metric: str
    old: float | None
    new: float | None
    status: str
    """regression, improvement, unchanged, new (no baseline value), missing (not measured now), not compared (a
    noisy metric from too few runs) or not judged (a host timing against a baseline from another runner)."""
    tolerance: float | None = None
    """The relative tolerance a noisy metric was judged within (None: a count, or not judged)."""
    spread: Spread | None = None
    """The baseline's recordings of the metric that calibrated :attr:`tolerance`, where it keeps them."""

    @property
    def delta(self) -> float | None:
        return None if self.old is None or self.new is None else self.new - self.old

    @property
    def relative(self) -> float | None:
        """The change as a fraction of the baseline value (None when there is none, or it is 0)."""
        delta = self.delta
        return None if delta is None or not self.old else delta / self.old

    def describe(self) -> str:
        spec = metric(self.metric)
        delta = self.delta
        if spec is None or self.old is None or self.new is None or delta is None:
            return f"{self.metric} {self.old} -> {self.new}"
        relative = "" if self.relative is None else f", {self.relative:+.1%}"
        change = ("+" if delta >= 0 else "-") + spec.format(abs(delta))
        return f"{self.metric} {spec.format(self.old)} -> {spec.format(self.new)} ({change}{relative}{self._within()})"

    def _within(self) -> str:
        """``; tolerance 1.5%: spread ±0.04% over 3 recordings on 1 host`` for a judged noisy metric."""
        if self.tolerance is None or self.status in ("not judged", "not compared"):
            return ""
        return f"; tolerance {self.tolerance:.1%}" + (f": {self.spread.describe()}" if self.spread else "")


@dataclass(frozen=True)
class Comparison:
    """A test's metrics against its entry in the baseline file of ``device`` (a slug)."""

    device: str
    file: str
    status: str
    """regression, improvement, unchanged, new (no entry), updated (written by this run), "not compared" (the
    test's call raised: its numbers are partial), "not measured" (a count of the entry was not measured now) or
    "NOT updated" (written by this run's xdist worker, which went down before it wrote)."""
    changes: tuple[Change, ...] = ()
    tolerance: float | None = None
    """Set by the test or the run for every noisy metric; None: each metric's own (:func:`tolerance_of`)."""
    fingerprint: Fingerprint = field(default_factory=dict)
    """The environment this run measured in."""
    drift: Drift = field(default_factory=dict)
    """Where that environment differs from the one the baseline file was recorded in."""
    explanation: Explanation = field(default_factory=Explanation)
    """What changed in the sync sites and the counters' largest contributors, where counts changed."""
    host_timings: bool = False
    """Host timings were judged against the baseline (the runner is the baseline's host)."""

    def of(self, status: str) -> list[Change]:
        return [c for c in self.changes if c.status == status]

    def baseline_values(self) -> dict[str, float]:
        """The baseline entry's value of each metric compared."""
        return {c.metric: c.old for c in self.changes if c.old is not None}
