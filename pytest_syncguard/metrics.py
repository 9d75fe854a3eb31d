"""The metrics a test's measurement yields: the one table of them (:data:`METRICS`, made from the signals' own
metrics and their exact counters), and a test's values of them (:class:`Metrics`).

Counts (syncs and the counters of :mod:`.analysis.counts`) are deterministic and compared exactly; the rest are
noisy: each measured run (region) gives one value, and a test's metric aggregates them by the metric's one rule
(:attr:`Metric.aggregate`: the median, or for memory the worst run), the same for its budget, the summary, the
JSON results and the baseline, with the number of runs beside it. Of the noisy ones, device-side metrics (device
time per token, allocator memory) are set by the GPU and the software and compared with a baseline within a
tolerance; host-dependent ones (wall time, tokens/s, idle gaps, busy fraction) are set by the runner's CPU as
much as by the GPU: they are judged A/B on one runner (:mod:`.gate.ab`), and against a baseline only where the user
says the runner is the baseline's host.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .signals import COUNTERS, SIGNALS
from .signals.base import Measured, Metric, worst
from .signals.timeline import DEVICE_TIME, gap_metric, gap_stat_of

__all__ = ["DEVICE_TIME", "METRICS", "Metric", "Metrics", "metric", "rounded", "timing_order", "value_problem"]

if TYPE_CHECKING:
    from .measurement import Measurement


def _counted(name: str) -> Callable[[Measured], list[float]]:
    return lambda m: [] if (value := m.count(name)) is None else [float(value)]


def _counted_per_token(name: str) -> Callable[[Measured], list[float]]:
    return lambda m: [] if (value := m.per_token(name)) is None else [value]


def _counter_metrics() -> list[Metric]:
    """Each counter of :data:`.signals.COUNTERS` as a metric, and per token where it is given so."""
    metrics = []
    for spec in COUNTERS.values():
        column = None if spec.per_token else spec.column
        metrics.append(
            Metric(
                spec.name,
                spec.unit,
                counted=True,
                higher_is_better=False,
                floor=0.0,
                runs=_counted(spec.name),
                quiet_when_zero=spec.quiet_when_zero,
                aggregate=worst,
                description=spec.description,
                column=column,
            )
        )
        if spec.per_token:
            metrics.append(
                Metric(
                    f"{spec.name}_per_token",
                    "",
                    counted=True,
                    higher_is_better=False,
                    floor=0.0,
                    runs=_counted_per_token(spec.name),
                    quiet_when_zero=spec.quiet_when_zero,
                    aggregate=worst,
                    description=f"{spec.description}, per token",
                    column=spec.column,
                )
            )
    return metrics


#: Every metric: each signal's own (:attr:`.signals.base.Signal.metrics`), then each exact counter's.
METRICS: dict[str, Metric] = {
    m.name: m for m in (*(m for signal in SIGNALS for m in signal.metrics), *_counter_metrics())
}


def metric(name: str) -> Metric | None:
    """The metric called ``name``: one of :data:`METRICS`, or the gap statistic a budget asked for
    (``p95_gap_us``, ``mean_gap_us``); None for a name this version does not know."""
    known = METRICS.get(name)
    if known is not None:
        return known
    stat = gap_stat_of(name)
    return gap_metric(stat) if stat is not None else None


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


def parse_tolerance(value: Any) -> float:
    """A relative tolerance: a finite number >= 0 (a string from the command line is converted); ValueError saying
    what it got otherwise. The one check of a tolerance, whether a marker, an ini key or the command line gives it."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"must be a number >= 0, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"must be a finite number >= 0, got {value!r}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite or value < 0:
        raise ValueError(f"must be a finite number >= 0, got {value!r}")
    return float(value)
