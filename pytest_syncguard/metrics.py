"""The metrics a test's measurement yields, as baselines, JUnit properties and reports carry them.

Counts (syncs) are deterministic and compared exactly; the rest are noisy and are the median over the
measured runs (regions), with the number of runs beside them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .guard import SyncMeasurement


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    counted: bool
    """A deterministic count: any increase is a regression."""
    higher_is_better: bool
    floor: float
    """Noisy metrics: changes smaller than this (in ``unit``) are never reported, whatever the tolerance."""

    def format(self, value: float) -> str:
        if self.counted and float(value).is_integer():
            return f"{int(value)}"
        text = f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
        return f"{text} {self.unit}" if self.unit else text


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("syncs", "", counted=True, higher_is_better=False, floor=0.0),
        Metric("syncs_per_token", "", counted=True, higher_is_better=False, floor=0.0),
        Metric("max_gap_us", "us", counted=False, higher_is_better=False, floor=2.0),
        Metric("p99_gap_us", "us", counted=False, higher_is_better=False, floor=2.0),
        Metric("busy_fraction", "", counted=False, higher_is_better=True, floor=0.01),
        Metric("fragmentation", "", counted=False, higher_is_better=False, floor=0.01),
        Metric("reserved_mb", "MiB", counted=False, higher_is_better=False, floor=1.0),
        Metric("seconds", "s", counted=False, higher_is_better=False, floor=0.0),
        Metric("tokens_per_second", "tok/s", counted=False, higher_is_better=True, floor=0.0),
    )
}


def _rounded(value: float) -> float:
    """Six significant digits: baseline files stay readable and diffs small."""
    return float(f"{value:.6g}")


def measured(measurement: SyncMeasurement) -> tuple[dict[str, float], dict[str, int]]:
    """The metrics of a measurement and, for each, how many runs its value is the median of."""
    values: dict[str, float] = {"syncs": measurement.syncs}
    samples: dict[str, int] = {"syncs": 1}
    if measurement.syncs_per_token is not None:
        values["syncs_per_token"] = _rounded(measurement.syncs_per_token)
        samples["syncs_per_token"] = 1

    def put(name: str, runs: list[float]) -> None:
        if runs:
            values[name] = _rounded(statistics.median(runs))
            samples[name] = len(runs)

    timelines = [t for t in measurement.timelines if t is not None]
    put("max_gap_us", [t.gap_stat("max") for t in timelines])
    put("p99_gap_us", [t.gap_stat("p99") for t in timelines])
    put("busy_fraction", [t.busy_fraction for t in timelines])
    put("fragmentation", [m.fragmentation for m in measurement.memory])
    put("reserved_mb", [m.reserved_peak / 2**20 for m in measurement.memory])
    put("seconds", [t.seconds for t in measurement.timings])
    put("tokens_per_second", [r for t in measurement.timings if (r := t.tokens_per_second) is not None])
    return values, samples
