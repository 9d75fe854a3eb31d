"""The compiles signal: torch.compile's own records of what it compiled in a region (dynamo's counters and
compilation metrics, :mod:`..probes.compiles`), on CPU and CUDA."""

from __future__ import annotations

from .base import CounterSpec, Limit, Measured, Signal


def _recompiles(budget: Limit, value: float, m: Measured, example: int) -> str:
    return (
        f"{budget.marker}: limit {budget.limit:g}, measured {value:g} recompilations "
        f"({m.count('frames_compiled') or 0} frames compiled in the region)"
    )


SIGNAL = Signal(
    "compiles",
    counters=(
        CounterSpec("frames_compiled", "frames torch.compile compiled", quiet_when_zero=True),
        CounterSpec(
            "recompiles",
            "recompilations of an already compiled frame",
            quiet_when_zero=True,
            column="recompiles",
            items="recompile reasons",
            budget="max_recompiles",
            sentence=_recompiles,
        ),
        CounterSpec(
            "graph_breaks",
            "graph breaks taken while compiling",
            quiet_when_zero=True,
            column="graph breaks",
            items="graph breaks",
            budget="max_graph_breaks",
        ),
    ),
)
