"""Baselines per device model: ``<dir>/<device-slug>.json``, one entry per test node id, and the comparison
of a test's metrics with its entry.

A baseline file is only written by :func:`update` (``--syncguard-update-baselines``): under a file lock, read,
merged with the tests that ran (others untouched), written to a temporary file and renamed over the old one,
so that concurrent pytest-xdist workers lose nothing and a reader never sees half a file. A file that is not
a baseline of this schema is an error naming it, and is never overwritten.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from .environment import fingerprint_changes
from .files import write_atomically
from .metrics import METRICS

SCHEMA = "pytest-syncguard/baselines"
SCHEMA_VERSION = 1
DEFAULT_TOLERANCE = 0.10
#: Noisy metrics are compared only when they are the median of at least this many runs.
MIN_RUNS = 3
LOCK_TIMEOUT_S = 120.0


class BaselineError(Exception):
    """A baseline file that cannot be used (corrupt, foreign, a newer schema); the message names it."""


@dataclass(frozen=True)
class Baseline:
    path: Path
    device: str
    fingerprint: dict[str, str | None]
    tests: dict[str, dict[str, float]]


def path_for(directory: Path, slug: str) -> Path:
    return directory / f"{slug}.json"


def read(path: Path) -> Baseline | None:
    """The baseline in ``path``; None when there is no such file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BaselineError(f"{path}: cannot read the baseline file: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(f"{path}: not valid JSON ({exc}); fix or delete it, it was left as it is") from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise BaselineError(f"{path}: not a pytest-syncguard baseline file (schema {SCHEMA!r} expected)")
    version = data.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise BaselineError(
            f"{path}: baseline schema version {version!r}, this syncguard reads up to {SCHEMA_VERSION}: upgrade "
            "pytest-syncguard"
        )
    tests = data.get("tests")
    if not isinstance(tests, dict) or not all(
        isinstance(entry, dict) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in entry.values())
        for entry in tests.values()
    ):
        raise BaselineError(f"{path}: 'tests' must map node ids to {{metric: number}}")
    fingerprint = data.get("fingerprint") or {}
    if not isinstance(fingerprint, dict):
        raise BaselineError(f"{path}: 'fingerprint' must be an object")
    return Baseline(path, str(data.get("device", path.stem)), fingerprint, tests)


def document(device: str, fingerprint: Mapping[str, str | None], tests: Mapping[str, Mapping[str, float]]) -> str:
    """The file's text: keys sorted, one metric per line, so that merges and reviews stay simple."""
    data = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "device": device,
        "fingerprint": dict(fingerprint),
        "tests": {nodeid: dict(sorted(tests[nodeid].items())) for nodeid in sorted(tests)},
    }
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def update(
    path: Path, device: str, entries: Mapping[str, Mapping[str, float]], fingerprint: Mapping[str, str | None]
) -> int:
    """Write ``entries`` (node id -> metrics) into the baseline at ``path``, keeping every other test's entry.
    Returns the number of entries written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S)
    try:
        with lock:
            current = read(path)
            tests = dict(current.tests) if current is not None else {}
            tests.update({nodeid: dict(metrics) for nodeid, metrics in entries.items()})
            write_atomically(path, document(device, fingerprint, tests))
    except Timeout as exc:
        raise BaselineError(f"{path}: could not lock {lock.lock_file} within {LOCK_TIMEOUT_S:.0f} s") from exc
    return len(entries)


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
        metric = METRICS.get(self.metric)
        delta = self.delta
        if metric is None or self.old is None or self.new is None or delta is None:
            return f"{self.metric} {self.old} -> {self.new}"
        relative = "" if self.relative is None else f", {self.relative:+.1%}"
        change = ("+" if delta >= 0 else "-") + metric.format(abs(delta))
        return f"{self.metric} {metric.format(self.old)} -> {metric.format(self.new)} ({change}{relative})"


@dataclass(frozen=True)
class Comparison:
    """A test's metrics against its baseline entry in the file of ``device``."""

    device: str
    file: str
    status: str
    """regression, improvement, unchanged, new (no entry), updated (written by this run) or error."""
    changes: list[Change] = field(default_factory=list)
    fingerprint_changes: dict[str, list[str | None]] = field(default_factory=dict)
    tolerance: float = DEFAULT_TOLERANCE

    def of(self, status: str) -> list[Change]:
        return [c for c in self.changes if c.status == status]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Comparison:
        changes = [Change(**c) for c in data.get("changes", [])]
        return cls(**{**data, "changes": changes})


#: Timings on the ``cpu`` slug are not compared: it stands for any CPU, so they would compare machines.
UNTIMED_DEVICES = frozenset({"cpu"})
TIMINGS = frozenset({"seconds", "tokens_per_second"})


def _status(metric: str, old: float, new: float, samples: int, tolerance: float, device: str) -> str:
    spec = METRICS[metric]
    worse = new < old if spec.higher_is_better else new > old
    if spec.counted:
        if new == old:
            return "unchanged"
        return "regression" if worse else "improvement"
    if samples < MIN_RUNS or (device in UNTIMED_DEVICES and metric in TIMINGS):
        return "not compared"
    delta = abs(new - old)
    if delta <= spec.floor or delta <= tolerance * abs(old):
        return "unchanged"
    return "regression" if worse else "improvement"


def compare(
    baseline: Baseline | None,
    device: str,
    file: Path,
    nodeid: str,
    values: Mapping[str, float],
    samples: Mapping[str, int],
    tolerance: float,
    fingerprint: Mapping[str, str | None],
) -> Comparison:
    """Each metric against the test's entry (``tolerance`` is relative; counts are exact)."""
    entry = baseline.tests.get(nodeid) if baseline is not None else None
    drift = fingerprint_changes(baseline.fingerprint, dict(fingerprint)) if baseline is not None else {}
    if entry is None:
        return Comparison(device, str(file), "new", [], drift, tolerance)
    changes = []
    for metric in sorted(set(entry) | set(values)):
        if metric not in METRICS:
            continue
        old, new = entry.get(metric), values.get(metric)
        if old is None or new is None:
            status = "new" if old is None else "missing"
        else:
            status = _status(metric, float(old), float(new), samples.get(metric, 1), tolerance, device)
        changes.append(Change(metric, None if old is None else float(old), new, status))
    statuses = {c.status for c in changes}
    overall = "regression" if "regression" in statuses else "improvement" if "improvement" in statuses else "unchanged"
    return Comparison(device, str(file), overall, changes, drift, tolerance)
