"""The wall-time signal: each measured run's wall time (on CUDA between device syncs) and its tokens per second.
Host timings: judged A/B on one runner, not against a baseline recorded on another; no budget of its own."""

from __future__ import annotations

from .base import Measured, Metric, Part, Runs, Signal, chained


def _rates(m: Measured) -> list[float]:
    return [rate for t in m.timings if (rate := t.tokens_per_second) is not None]


SIGNAL = Signal(
    "wall_time",
    metrics=(
        Metric(
            "seconds",
            "s",
            counted=False,
            higher_is_better=False,
            floor=0.0,
            runs=lambda m: [t.seconds for t in m.timings],
            host=True,
            description="wall time of a measured run",
        ),
        Metric(
            "tokens_per_second",
            "tok/s",
            counted=False,
            higher_is_better=True,
            floor=0.0,
            runs=_rates,
            host=True,
            description="tokens over the wall time of a measured run",
        ),
    ),
    timed=True,
    parts=(Part("timings", chained, Runs.TIMED),),
)
