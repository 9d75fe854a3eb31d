"""A test's metrics against its baseline entry: one :class:`Change` per metric, the overall status, and what
explains a change of its counts.

Counts are compared exactly (any increase is a regression). Device-side metrics (device time per token, allocator
memory) are compared beyond a relative tolerance and the metric's floor: the one the test or the run sets, else
the one the baseline's recordings of the metric calibrate (:func:`calibrated_tolerance`: from their spread, for a
metric that keeps them), else the metric's own, which needs a value of at least :data:`MIN_RUNS` runs.
Host-dependent timings are "not judged" against a baseline, which was recorded on another runner, unless the run
says the runner is the baseline's host (``host_timings``); they are judged A/B (:mod:`.ab`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..analysis.explain import Details, Explanation, explain
from ..metrics import Metrics, metric
from ..words import plural

#: A test's status against its baseline entry when a count the entry holds was not measured now.
NOT_MEASURED = "not measured"
#: An update's status for a test whose entry was not written after all (its xdist worker went down first).
NOT_UPDATED = "NOT updated"

#: The relative tolerance of host timings judged against a baseline (opted in) and of a metric with none of its own.
DEFAULT_TOLERANCE = 0.10
#: Noisy metrics without calibrated recordings are compared only when they aggregate at least this many runs.
MIN_RUNS = 3
#: A calibrated tolerance is this many standard deviations of the recordings' spread (a new value's own deviation
#: from their median included): beyond it, an unchanged program lies with a chance of about 1 in 16,000.
SPREAD_DEVIATIONS = 4.0
#: The fewest recordings whose spread calibrates a tolerance.
MIN_RECORDINGS = 2
#: Recordings from at least this many runs on at least this many hosts (a history of the default branch) show the
#: spread between hosts: their tolerance may go below a metric's floor, to a part of it.
CROSS_HOST_RECORDINGS = 10
CROSS_HOST_HOSTS = 6
CROSS_HOST_FLOOR_DIVISOR = 3.0

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
            return (f"spread ±{self.relative_sd:.2%} within {plural(self.hosts, 'host')} over "
                    f"{plural(self.recordings, 'recording')}, {self.on_host} on this host")  # fmt: skip
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


def tolerance_of(name: str, tolerance: float | None, spread: Spread | None = None) -> float:
    """The relative tolerance a noisy metric is compared within: the one the test or run set, else the one its
    baseline's recordings calibrate, else its own."""
    spec = metric(name)
    if tolerance is not None:
        return tolerance
    calibrated = calibrated_tolerance(name, spread)
    if calibrated is not None:
        return calibrated
    return spec.tolerance if spec is not None and spec.tolerance is not None else DEFAULT_TOLERANCE


def calibrated_tolerance(name: str, spread: Spread | None) -> float | None:
    """The tolerance a metric's recorded spread gives (None: it keeps no recordings, or too few):
    :data:`SPREAD_DEVIATIONS` standard deviations of a new value about the recordings' median, ``sd * sqrt(1 +
    1/n)``, and never less than the metric's :attr:`~.metrics.Metric.min_tolerance` (what moves between hosts of
    one GPU model, which recordings made on one host do not show). Judged against its own host's recordings
    (:attr:`Spread.on_host`), a new value deviates from their mean by the spread within hosts, ``sd * sqrt(1 +
    1/on_host)``, and what moves between hosts is out of it: the floor is a part of the metric's."""
    spec = metric(name)
    if spec is None or spec.min_tolerance is None or spread is None or spread.relative_sd is None:
        return None
    if spread.recordings < MIN_RECORDINGS:
        return None
    if spread.on_host:
        deviation = spread.relative_sd * math.sqrt(1 + 1 / spread.on_host)
        return max(spec.min_tolerance / CROSS_HOST_FLOOR_DIVISOR, SPREAD_DEVIATIONS * deviation)
    deviation = spread.relative_sd * math.sqrt(1 + 1 / spread.recordings)
    # Recordings of many runs on several hosts measure what moves between hosts themselves: the floor that stands in
    # for it gives way to its own part.
    seen_across_hosts = spread.recordings >= CROSS_HOST_RECORDINGS and spread.hosts >= CROSS_HOST_HOSTS
    floor = spec.min_tolerance / CROSS_HOST_FLOOR_DIVISOR if seen_across_hosts else spec.min_tolerance
    return max(floor, SPREAD_DEVIATIONS * deviation)


def count_status(name: str, old: float, new: float) -> str:
    """A count against its baseline (or base) value, exactly: any increase is a regression. The one judgement of
    a count, at test time, in ``syncguard report``, ``syncguard baselines OLD NEW`` and ``syncguard ab``."""
    if new == old:
        return "unchanged"
    spec = metric(name)
    worse = new < old if spec is not None and spec.higher_is_better else new > old
    return "regression" if worse else "improvement"


def _change(
    name: str, old: float, new: float, runs: int, tolerance: float | None, host_timings: bool, spread: Spread | None
) -> Change:
    spec = metric(name)
    assert spec is not None
    if spec.counted:
        return Change(name, old, new, count_status(name, old, new))
    if spec.host and not host_timings:
        return Change(name, old, new, "not judged")
    within = tolerance_of(name, tolerance, spread)
    calibrated = tolerance is None and calibrated_tolerance(name, spread) is not None
    if runs < MIN_RUNS and not calibrated:  # calibrated recordings are of as many runs as this one
        return Change(name, old, new, "not compared", within, spread)
    worse = new < old if spec.higher_is_better else new > old
    delta = abs(new - old)
    if delta <= spec.floor or delta <= within * abs(old):
        status = "unchanged"
    else:
        status = "regression" if worse else "improvement"
    return Change(name, old, new, status, within, spread)


def compare(
    entry: Mapping[str, float] | None,
    metrics: Metrics,
    *,
    device: str,
    file: str,
    tolerance: float | None,
    fingerprint: Fingerprint | None = None,
    drift: Drift | None = None,
    host_timings: bool = False,
    details: tuple[Details | None, Details | None] = (None, None),
    spreads: Mapping[str, Spread] | None = None,
) -> Comparison:
    """Each metric against the test's baseline ``entry`` (None: the baseline has none); ``tolerance`` is
    relative (None: each metric's own, calibrated by the entry's ``spreads`` where it has them), counts are
    exact, host timings judged only with ``host_timings``. ``details`` (the baseline's, this run's) explain the
    counts that changed. Metrics this version does not know are left out."""
    fingerprint, drift = dict(fingerprint or {}), dict(drift or {})
    if entry is None:
        return Comparison(device, file, "new", (), tolerance, fingerprint, drift, host_timings=host_timings)
    changes = []
    for name in sorted(set(entry) | set(metrics.values)):
        spec = metric(name)
        if spec is None:
            continue
        old, new = entry.get(name), metrics.get(name)
        if spec.quiet_when_zero:  # absent means none (a loop that compiled nothing)
            old, new = old or 0.0, new or 0.0
        if old is None or new is None:
            changes.append(Change(name, None if old is None else float(old), new, "new" if old is None else "missing"))
            continue
        runs, spread = metrics.runs.get(name, 1), (spreads or {}).get(name)
        changes.append(_change(name, float(old), float(new), runs, tolerance, host_timings, spread))
    statuses = {c.status for c in changes}
    # A count the baseline holds that this run could not measure (its probe could not run) is no "unchanged".
    lost = any(c.status == "missing" and _counted(c.metric) for c in changes)
    overall = ("regression" if "regression" in statuses else "improvement" if "improvement" in statuses
               else NOT_MEASURED if lost else "unchanged")  # fmt: skip
    moved = [c.metric for c in changes if c.status in ("regression", "improvement") and _counted(c.metric)]
    explanation = explain(*details, moved) if moved else Explanation()
    return Comparison(device, file, overall, tuple(changes), tolerance, fingerprint, drift, explanation, host_timings)


def _counted(name: str) -> bool:
    spec = metric(name)
    return spec is not None and spec.counted
