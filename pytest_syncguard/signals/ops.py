"""The operators signal: operators dispatched in a region, counted by the native operator counter
(:mod:`..probes.ops`) on CPU and CUDA."""

from __future__ import annotations

from .base import CounterSpec, Limit, Measured, Signal


def _ops(budget: Limit, value: float, m: Measured, example: int) -> str:
    return (
        f"{budget.marker}: limit {budget.limit:g} per token, measured {value:.1f}: {m.count('ops')} operators "
        f"over {m.tokens} tokens"
    )


SIGNAL = Signal(
    "ops",
    counters=(
        CounterSpec(
            "ops",
            "operators dispatched (aten and other dispatcher ops, nested calls included, as "
            "torch.profiler's cpu_op events count them)",
            per_token=True,
            column="ops/token",
            items="operators",
            budget="max_ops_per_token",
            sentence=_ops,
        ),
    ),
    needs_text=" Needs the native extension.",
)
