"""The metrics a test's measurement yields: how each is read from the measured regions, how it is compared
with a baseline and how it is shown. The one table of them is :data:`METRICS`.

Counts (syncs and the counters of :mod:`.analysis.counts`) are deterministic and compared exactly; the rest are
noisy: each measured run (region) gives one value, and a test's metric aggregates them by the metric's one rule
(:attr:`Metric.aggregate`: the median, or for memory the worst run), the same for its budget, the summary, the
JSON results and the baseline, with the number of runs beside it. Of the noisy ones, device-side metrics (device
time per token, allocator memory) are set by the GPU and the software and compared with a baseline within a
tolerance; host-dependent ones (wall time, tokens/s, idle gaps, busy fraction) are set by the runner's CPU as
much as by the GPU: they are judged A/B on one runner (:mod:`.ab`), and against a baseline only where the user
says the runner is the baseline's host.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from .signals import COUNTERS
from .signals.base import MIB
from .signals.timeline import gap_metric_name

if TYPE_CHECKING:
    from .analysis.memory import MemoryStats
    from .measurement import Measurement

#: The device's own time per decode step: the timing the gate judges against a baseline, shown first.
DEVICE_TIME = "gpu_us_per_token"


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    counted: bool
    """A deterministic count: any increase is a regression."""
    higher_is_better: bool
    floor: float
    """Noisy metrics: changes smaller than this (in ``unit``) are never reported, whatever the tolerance."""
    runs: Callable[[Measurement], list[float]]
    """Its value in each measured run of a measurement (empty when not measured)."""
    quiet_when_zero: bool = False
    """Counted metrics only: left out of a test's metrics when 0 and no budget reads it; absent compares as 0."""
    host: bool = False
    """Depends on the host that launches the work: not judged against a baseline recorded on another runner."""
    tolerance: float | None = None
    """Device-side metrics: the relative change within which they are unchanged, unless a test or the run sets
    one, or (with :attr:`min_tolerance`) the baseline's recordings calibrate one."""
    min_tolerance: float | None = None
    """Device-side metrics whose baseline keeps a history of recordings: the least tolerance their spread may
    calibrate (:func:`.comparison.calibrated_tolerance`), what moves between hosts of one GPU model
    (docs/explanation/gate.md)."""
    aggregate: Callable[[Sequence[float]], float] = statistics.median
    """How a test's runs make its value, for its budget, the summary, the JSON results and the baseline alike: the
    median of a noisy metric, the worst run of memory (a budget must hold in every run), the largest count."""
    ab_min_effect: float | None = None
    """The smallest relative change ``syncguard ab`` calls a regression or improvement of it, unless
    ``--min-effect`` says; None: :data:`.ab.DEFAULT_MIN_EFFECT`."""
    description: str = ""
    """What it is, in a few words (the reference's metric table)."""
    column: str | None = None
    """Of the exact counters: the summary's column for it; None: in the JSON results only."""

    def format(self, value: float) -> str:
        if self.counted and float(value).is_integer():
            return f"{int(value)}"
        text = f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
        return f"{text} {self.unit}" if self.unit else text


def _gap_runs(stat: str) -> Callable[[Measurement], list[float]]:
    return lambda m: [t.gap_stat(stat) for t in m.gpu_timelines]


def _per_token(m: Measurement) -> list[float]:
    return [m.syncs / m.tokens] if m.tokens else []


def _own_memory(m: Measurement) -> list[MemoryStats]:
    """The allocator numbers of the regions in which no cudaMalloc failed: where the GPU's memory ran out and the
    allocator freed its cache to retry, its peaks depend on what else held that GPU's memory, not on the test."""
    return [s for s in m.memory if not s.alloc_retries]


def _rates(m: Measurement) -> list[float]:
    return [rate for t in m.timings if (rate := t.tokens_per_second) is not None]


_GAP_METRIC = re.compile(r"^(max|mean|p\d+(?:\.\d+)?)_gap_us$")


def _counted(name: str) -> Callable[[Measurement], list[float]]:
    return lambda m: [] if (value := m.count(name)) is None else [float(value)]


def _counted_per_token(name: str) -> Callable[[Measurement], list[float]]:
    return lambda m: [] if (value := m.per_token(name)) is None else [value]


def _worst(runs: Sequence[float]) -> float:
    """Of a lower-is-better metric, the worst run; of a count, the largest (a count that varies fails on its
    worst run rather than passing on its best)."""
    return max(runs)


def _counter_metrics() -> list[Metric]:
    """Each counter of :data:`.signals.COUNTERS` as a metric, and per token where it is given so."""
    metrics = []
    for spec in COUNTERS.values():
        column = None if spec.per_token else spec.column
        metrics.append(Metric(spec.name, spec.unit, counted=True, higher_is_better=False, floor=0.0,
                              runs=_counted(spec.name), quiet_when_zero=spec.quiet_when_zero, aggregate=_worst,
                              description=spec.description, column=column))  # fmt: skip
        if spec.per_token:
            metrics.append(Metric(f"{spec.name}_per_token", "", counted=True, higher_is_better=False, floor=0.0,
                                  runs=_counted_per_token(spec.name), aggregate=_worst,
                                  description=f"{spec.description}, per token", column=spec.column))  # fmt: skip
    return metrics


@cache
def _gap(stat: str) -> Metric:
    return Metric(
        gap_metric_name(stat), "us", counted=False, higher_is_better=False, floor=2.0, runs=_gap_runs(stat), host=True,
        description=f"the {stat} idle gap of the device over the region's judged steps, all streams merged",
    )  # fmt: skip


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("syncs", "", counted=True, higher_is_better=False, floor=0.0, runs=lambda m: [float(m.syncs)],
               aggregate=_worst, description="host-device syncs in the measured regions"),
        Metric("syncs_per_token", "", counted=True, higher_is_better=False, floor=0.0, runs=_per_token,
               aggregate=_worst, description="host-device syncs per token (decode step)"),
        _gap("max"),
        _gap("p99"),
        Metric(
            "busy_fraction", "", counted=False, higher_is_better=True, floor=0.01,
            runs=lambda m: [t.busy_fraction for t in m.gpu_timelines], host=True,
            description="the device's busy time over the span of the region's judged steps",
        ),
        Metric(
            DEVICE_TIME, "us", counted=False, higher_is_better=False, floor=1.0,
            runs=lambda m: m.device_us_per_token(), tolerance=0.05, min_tolerance=0.015, ab_min_effect=0.01,
            description="the device's busy time per judged decode step, from the kernels' records of the traced "
            "runs (a measure()'s counting run)",
        ),
        Metric(
            # Its floor follows reserved_mb's 2%: a reserved peak within that moves 1 - allocated/reserved by up
            # to 0.02 x (1 - fragmentation) for the same allocated peak, a packing of blocks, not a regression.
            "fragmentation", "", counted=False, higher_is_better=False, floor=0.02,
            runs=lambda m: [s.fragmentation for s in _own_memory(m)], tolerance=0.02, min_tolerance=0.02,
            aggregate=_worst,
            description="1 - allocated peak / reserved peak of the caching allocator in a region",
        ),
        Metric(
            "reserved_mb", "MiB", counted=False, higher_is_better=False, floor=2.0,
            runs=lambda m: [s.reserved_peak / MIB for s in _own_memory(m)], tolerance=0.02, min_tolerance=0.02,
            aggregate=_worst,
            description="the caching allocator's reserved peak in a region",
        ),
        Metric(
            "seconds", "s", counted=False, higher_is_better=False, floor=0.0,
            runs=lambda m: [t.seconds for t in m.timings], host=True, description="wall time of a measured run",
        ),
        Metric("tokens_per_second", "tok/s", counted=False, higher_is_better=True, floor=0.0, runs=_rates, host=True,
               description="tokens over the wall time of a measured run"),
        *_counter_metrics(),
    )
}  # fmt: skip


def metric(name: str) -> Metric | None:
    """The metric called ``name``: one of :data:`METRICS`, or the gap statistic a budget asked for
    (``p95_gap_us``, ``mean_gap_us``); None for a name this version does not know."""
    known = METRICS.get(name)
    if known is not None:
        return known
    match = _GAP_METRIC.match(name)
    return _gap(match.group(1)) if match else None


def timing_order(name: str) -> tuple[int, str]:
    """How timings are listed: device time first, other device-side metrics next, host timings last."""
    spec = metric(name)
    return (0 if name == DEVICE_TIME else 2 if spec is not None and spec.host else 1, name)


#: The largest value any metric can have: past it (a 309-digit number) a file holds no measurement.
LARGEST_VALUE = 1e15


def value_problem(name: str, value: float) -> str | None:
    """Why ``value`` cannot be a measured value of metric ``name`` (None: it can): every metric (counts, times,
    fractions, sizes) is a finite number from 0 to :data:`LARGEST_VALUE`."""
    if not math.isfinite(value):
        return f"{name} = {value!r}: not a finite number"
    if value < 0:
        return f"{name} = {value!r}: a measurement cannot be negative"
    if value > LARGEST_VALUE:
        return f"{name} = {value!r}: past any measurement (over {LARGEST_VALUE:.0e})"
    return None


def rounded(value: float) -> float:
    """Six significant digits: baseline files stay readable and diffs small."""
    return float(f"{value:.6g}")


@dataclass(frozen=True)
class Metrics:
    """A test's metrics: each value (its runs aggregated by the metric's rule) and how many runs it aggregates."""

    values: Mapping[str, float]
    runs: Mapping[str, int]

    def get(self, name: str) -> float | None:
        return self.values.get(name)

    def __getitem__(self, name: str) -> float:
        return self.values[name]

    def __contains__(self, name: str) -> bool:
        return name in self.values

    @classmethod
    def of(cls, measurement: Measurement, extra: Iterable[str] = ()) -> Metrics:
        """Every metric of :data:`METRICS` that ``measurement`` has, plus the ``extra`` ones (gap statistics
        a budget judges), each its runs aggregated by its rule."""
        values: dict[str, float] = {}
        runs: dict[str, int] = {}
        for name in [*METRICS, *(n for n in extra if n not in METRICS)]:
            spec = metric(name)
            if spec is None:
                continue
            per_run = spec.runs(measurement)
            if spec.quiet_when_zero and not any(per_run) and name not in extra:
                continue
            if per_run:
                values[name] = rounded(spec.aggregate(per_run))
                runs[name] = len(per_run)
        return cls(values, runs)
