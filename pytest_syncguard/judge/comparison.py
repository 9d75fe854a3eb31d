"""A test's metrics against its baseline entry: one :class:`Change` per metric, the overall status, and what
explains a change of its counts.

Counts are compared exactly (any increase is a regression). Device-side metrics (device time per token, allocator
memory) are compared beyond a relative tolerance and the metric's floor: the one the test or the run sets, else
the one the baseline's recordings of the metric calibrate (:func:`calibrated_tolerance`: from their spread, for a
metric that keeps them), else the metric's own, which needs a value of at least :data:`MIN_RUNS` runs.
Host-dependent timings are "not judged" against a baseline, which was recorded on another runner, unless the run
says the runner is the baseline's host (``host_timings``); they are judged A/B (:mod:`..gate.ab`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..analysis.explain import Details, Explanation, explain
from ..document.comparison import NOT_MEASURED, Change, Comparison, Drift, Fingerprint, Spread
from ..metrics import Metrics, metric
from ..signals import EXPLAIN
from ..status import MOVED, Status

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


def within_band(name: str, reference: float, value: float, tolerance: float) -> bool:
    """Whether ``value`` lies within ``tolerance`` (relative) of ``reference``, or within metric ``name``'s floor:
    the one band a noisy metric is judged within, a pull request's value and a default-branch run's alike."""
    spec = metric(name)
    floor = spec.floor if spec is not None else 0.0
    return abs(value - reference) <= max(floor, tolerance * abs(reference))


def count_status(name: str, old: float, new: float) -> str:
    """A count against its baseline (or base) value, exactly: any increase is a regression. The one judgement of
    a count, at test time, in ``syncguard report``, ``syncguard baselines OLD NEW`` and ``syncguard ab``."""
    if new == old:
        return Status.UNCHANGED
    spec = metric(name)
    worse = new < old if spec is not None and spec.higher_is_better else new > old
    return Status.REGRESSION if worse else Status.IMPROVEMENT


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
    if within_band(name, old, new, within):
        status = Status.UNCHANGED
    else:
        status = Status.REGRESSION if worse else Status.IMPROVEMENT
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
    overall = (
        Status.REGRESSION
        if Status.REGRESSION in statuses
        else Status.IMPROVEMENT
        if Status.IMPROVEMENT in statuses
        else NOT_MEASURED
        if lost
        else Status.UNCHANGED
    )
    moved = [c.metric for c in changes if c.status in MOVED and _counted(c.metric)]
    explanation = explain(*details, moved, EXPLAIN) if moved else Explanation()
    return Comparison(device, file, overall, tuple(changes), tolerance, fingerprint, drift, explanation, host_timings)


def _counted(name: str) -> bool:
    spec = metric(name)
    return spec is not None and spec.counted
