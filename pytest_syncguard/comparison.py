"""A test's metrics against its baseline entry: one :class:`Change` per metric and the overall status.

Counts are compared exactly (any increase is a regression); noisy metrics only when they are the median of at
least :data:`MIN_RUNS` runs, beyond a relative tolerance and the metric's floor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .metrics import Metrics, metric

DEFAULT_TOLERANCE = 0.10
#: Noisy metrics are compared only when they are the median of at least this many runs.
MIN_RUNS = 3
#: Timings on the ``cpu`` slug are not compared: it stands for any CPU, so they would compare machines.
UNTIMED_DEVICES = frozenset({"cpu"})
TIMINGS = frozenset({"seconds", "tokens_per_second"})

Fingerprint = dict[str, "str | None"]
#: Fingerprint keys whose value differs: key -> [baseline's, this run's].
Drift = dict[str, "list[str | None]"]


@dataclass(frozen=True)
class Change:
    """One metric against its baseline value."""

    metric: str
    old: float | None
    new: float | None
    status: str
    """regression, improvement, unchanged, new (no baseline value), missing (not measured now) or
    not compared (a noisy metric from too few runs)."""

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
        return f"{self.metric} {spec.format(self.old)} -> {spec.format(self.new)} ({change}{relative})"


@dataclass(frozen=True)
class Comparison:
    """A test's metrics against its entry in the baseline file of ``device`` (a slug)."""

    device: str
    file: str
    status: str
    """regression, improvement, unchanged, new (no entry), updated (written by this run) or "not compared" (the
    test's call raised: its numbers are partial)."""
    changes: tuple[Change, ...] = ()
    tolerance: float = DEFAULT_TOLERANCE
    fingerprint: Fingerprint = field(default_factory=dict)
    """The environment this run measured in."""
    drift: Drift = field(default_factory=dict)
    """Where that environment differs from the one the baseline file was recorded in."""

    def of(self, status: str) -> list[Change]:
        return [c for c in self.changes if c.status == status]

    def baseline_values(self) -> dict[str, float]:
        """The baseline entry's value of each metric compared."""
        return {c.metric: c.old for c in self.changes if c.old is not None}

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device, "file": self.file, "status": self.status, "tolerance": self.tolerance,
            "changes": [vars(c) for c in self.changes], "fingerprint": self.fingerprint,
            "fingerprint_changes": self.drift,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Comparison:
        changes = tuple(Change(**c) for c in data["changes"])
        return cls(
            data["device"], data["file"], data["status"], changes, data["tolerance"], dict(data["fingerprint"]),
            dict(data["fingerprint_changes"]),
        )  # fmt: skip


def _status(name: str, old: float, new: float, runs: int, tolerance: float, device: str) -> str:
    spec = metric(name)
    assert spec is not None
    worse = new < old if spec.higher_is_better else new > old
    if spec.counted:
        if new == old:
            return "unchanged"
        return "regression" if worse else "improvement"
    if runs < MIN_RUNS or (device in UNTIMED_DEVICES and name in TIMINGS):
        return "not compared"
    delta = abs(new - old)
    if delta <= spec.floor or delta <= tolerance * abs(old):
        return "unchanged"
    return "regression" if worse else "improvement"


def compare(
    entry: Mapping[str, float] | None,
    metrics: Metrics,
    *,
    device: str,
    file: str,
    tolerance: float,
    fingerprint: Fingerprint | None = None,
    drift: Drift | None = None,
) -> Comparison:
    """Each metric against the test's baseline ``entry`` (None: the baseline has none); ``tolerance`` is
    relative, counts are exact. Metrics this version does not know are left out."""
    fingerprint, drift = dict(fingerprint or {}), dict(drift or {})
    if entry is None:
        return Comparison(device, file, "new", (), tolerance, fingerprint, drift)
    changes = []
    for name in sorted(set(entry) | set(metrics.values)):
        spec = metric(name)
        if spec is None:
            continue
        old, new = entry.get(name), metrics.get(name)
        if spec.quiet_when_zero:  # absent means none (a loop that compiled nothing)
            old, new = old or 0.0, new or 0.0
        if old is None or new is None:
            status = "new" if old is None else "missing"
        else:
            status = _status(name, float(old), float(new), metrics.runs.get(name, 1), tolerance, device)
        changes.append(Change(name, None if old is None else float(old), new, status))
    statuses = {c.status for c in changes}
    overall = "regression" if "regression" in statuses else "improvement" if "improvement" in statuses else "unchanged"
    return Comparison(device, file, overall, tuple(changes), tolerance, fingerprint, drift)
