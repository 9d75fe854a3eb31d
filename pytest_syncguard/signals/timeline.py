"""The timeline signal: the GPU's idle gaps and busy fraction over a region's judged steps, recorded by the call's
timeline instrument (:mod:`..instruments`), and the device work its traces count exactly (launches, copies,
memsets); CUDA only."""

from __future__ import annotations

import re
from functools import cache

from ..analysis.gaps import steps_note
from .base import (
    BudgetKind,
    CounterSpec,
    Limit,
    Measured,
    Metric,
    Part,
    Runs,
    Section,
    Signal,
    chained,
    first_reason,
    named,
    united,
)


def max_gpu_idle_us(limit: float, *, stat: str = "max") -> None:
    """Fail when the GPU's idle gaps in the region (all streams merged, steady state) exceed ``limit`` us;
    ``stat`` is "max", "mean" or a percentile such as "p99". Needs CUDA."""


def min_gpu_busy(fraction: float) -> None:
    """Fail when GPU busy time over the region's GPU span (steady state) is below ``fraction``. Needs CUDA."""


#: The device's own time per decode step: the timing the gate judges against a baseline, shown first.
DEVICE_TIME = "gpu_us_per_token"
_GAP_METRIC = re.compile(r"^(max|mean|p\d+(?:\.\d+)?)_gap_us$")


def gap_metric_name(stat: str) -> str:
    """The metric of an idle-gap statistic: ``p99`` -> ``p99_gap_us``."""
    return f"{stat}_gap_us"


def gap_stat_of(name: str) -> str | None:
    """The statistic of an idle-gap metric's name (``p95_gap_us`` -> ``p95``); None for another name."""
    match = _GAP_METRIC.match(name)
    return match.group(1) if match else None


@cache
def gap_metric(stat: str) -> Metric:
    """The metric of an idle-gap statistic (``max``, ``mean``, a percentile), the one a budget asks for too."""
    return Metric(
        gap_metric_name(stat),
        "us",
        counted=False,
        higher_is_better=False,
        floor=2.0,
        runs=lambda m: [t.gap_stat(stat) for t in m.gpu_timelines],
        host=True,
        description=f"the {stat} idle gap of the device over the region's judged steps, all streams merged",
    )


def _judged_steps(m: Measured, example: int) -> str:
    timelines = m.gpu_timelines
    shown = timelines[example]
    runs = f"median of {len(timelines)} regions, " if len(timelines) > 1 else ""
    steps = "no steps"
    if shown.steps:
        steps = f"{shown.judged_steps} steps judged after {shown.warmup_steps} warm-up{steps_note(shown.steps_from)}"
    return runs + steps


def _idle(budget: Limit, value: float, m: Measured, example: int) -> str:
    gaps = len(m.gpu_timelines[example].gaps_us)
    return (
        f"{budget.marker}: limit {budget.limit:g} us ({budget.stat} gap), measured {value:.1f} us "
        f"({gaps} gaps, {_judged_steps(m, example)})"
    )


def _busy(budget: Limit, value: float, m: Measured, example: int) -> str:
    shown = m.gpu_timelines[example]
    return (
        f"{budget.marker}: limit {budget.limit:.2f}, measured {value:.3f}: GPU busy {shown.busy_us:.0f} us "
        f"of a {shown.span_us:.0f} us span ({_judged_steps(m, example)})"
    )


def _launches(budget: Limit, value: float, m: Measured, example: int) -> str:
    graphs = m.count("graph_launches") or 0
    kernels = (m.count("launches") or 0) - graphs
    return (
        f"{budget.marker}: limit {budget.limit:g} per token, measured {value:.1f}: {kernels} kernel launches and "
        f"{graphs} CUDA graph launches ({m.count('graph_kernels') or 0} kernels in the graphs) over {m.tokens} tokens"
    )


def _copies(way: str, words: str) -> tuple[CounterSpec, CounterSpec]:
    copies = f"copies_{way}"
    return (
        CounterSpec(copies, f"{words} copies", items="copies (kind and size)"),
        CounterSpec(
            f"copy_bytes_{way}", f"bytes copied {words.replace('-to-', ' to ')}", explained_by=copies, unit="B"
        ),
    )


def _no_timeline(m: Measured) -> str | None:
    return "no GPU timeline was recorded" if not m.timelines else None


NO_GPU_WORK = "the region launched no GPU work"

SIGNAL = Signal(
    "timeline",
    metrics=(
        gap_metric("max"),
        gap_metric("p99"),
        Metric(
            "busy_fraction",
            "",
            counted=False,
            higher_is_better=True,
            floor=0.01,
            runs=lambda m: [t.busy_fraction for t in m.gpu_timelines],
            host=True,
            description="the device's busy time over the span of the region's judged steps",
        ),
        Metric(
            DEVICE_TIME,
            "us",
            counted=False,
            higher_is_better=False,
            floor=1.0,
            runs=lambda m: m.device_us_per_token(),
            tolerance=0.05,
            min_tolerance=0.015,
            ab_min_effect=0.01,
            description="the device's busy time per judged decode step, from the kernels' records of the traced "
            "runs (a measure()'s counting run)",
        ),
    ),
    counters=(
        CounterSpec(
            "launches",
            "kernel launches (a CUDA graph launch counts one)",
            per_token=True,
            column="launches/token",
            items="kernels",
            budget="max_launches_per_token",
            sentence=_launches,
        ),
        CounterSpec("graph_launches", "CUDA graph launches", column="graph launches"),
        CounterSpec(
            "graph_kernels",
            "kernels and copy nodes run by CUDA graph launches",
            items="kernels and copy nodes in CUDA graphs",
        ),
        *_copies("h2d", "host-to-device"),
        *_copies("d2h", "device-to-host"),
        *_copies("d2d", "device-to-device"),
        CounterSpec("memsets", "memsets", items="memsets (size)"),
    ),
    kinds=(
        BudgetKind(
            "max_gpu_idle_us", max_gpu_idle_us, "timeline", gap_metric_name, _idle, unmeasured=NO_GPU_WORK, stat="stat"
        ),
        BudgetKind(
            "min_gpu_busy",
            min_gpu_busy,
            "timeline",
            named("busy_fraction"),
            _busy,
            limit_argument="fraction",
            upper=False,
            fraction=True,
            unmeasured=NO_GPU_WORK,
        ),
    ),
    cuda=True,
    needs_text=" Needs CUDA; counted from the timeline capture.",
    timed=True,
    on_demand=True,
    shows=frozenset({Section.TIMELINE}),
    unmeasured=_no_timeline,
    # Filled after the call by its instrument (:meth:`..instruments.Instrument.timelines`): the timed runs'
    # timelines, the traced runs' device time.
    parts=(
        Part("timelines", chained, Runs.TIMED),
        Part("unreliable_timeline", first_reason, Runs.EVERY),
        Part("device_times", united, Runs.EVERY),
    ),
)
