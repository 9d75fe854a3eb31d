"""The CUDA-graph health signal: in a region, the CUDA graphs recorded (a new capture, a CUDA graph tree's first
recording or re-recording of a compiled function), the graphs torch.compile decided to skip, and the calls of
skipped graphs (steps that fell back to eager), each with torch's reason and the call site, counted by the
CUDA-graph probe (:mod:`..probes.graphs`). A decoding loop that replays its graphs records none and skips none in
its steady state."""

from __future__ import annotations

from .base import BudgetKind, CounterSpec, Limit, Measured, Signal, named


def no_graph_skips() -> None:
    """Fail when a graph torch.compile was asked to run as CUDA graphs ran without them in the region (a step that
    fell back to eager: inductor's "skipping cudagraphs due to ...", decided in the region or before it); the
    failure gives torch's reason and the call site. Needs CUDA."""


def _recordings(budget: Limit, value: float, m: Measured, example: int) -> str:
    return f"{budget.marker}: limit {budget.limit:g}, measured {value:g} CUDA graphs recorded in the region"


def _skips(budget: Limit, value: float, m: Measured, example: int) -> str:
    return (
        f"{budget.marker}: measured {value:g} calls of compiled graphs that ran without their CUDA graphs "
        f"(torch skipped them; {m.count('graph_skips') or 0} skips decided in the region)"
    )


SIGNAL = Signal(
    "graphs",
    counters=(
        CounterSpec(
            "graph_recordings",
            "CUDA graphs recorded (captures begun: new graphs, and CUDA graph trees' "
            "recordings and re-recordings of compiled functions)",
            quiet_when_zero=True,
            column="graphs recorded",
            items="recordings (what recorded, and where)",
            budget="max_graph_recordings",
            sentence=_recordings,
        ),
        CounterSpec(
            "graph_skips",
            "graphs torch.compile decided to run without CUDA graphs (inductor's cudagraph_skips counter)",
            quiet_when_zero=True,
            items="skips (torch's reason, and where)",
        ),
        CounterSpec(
            "eager_graph_calls",
            "calls of compiled graphs that ran without the CUDA graphs torch skipped (steps that fell back to eager)",
            quiet_when_zero=True,
            column="graph skips",
            items="calls without CUDA graphs (torch's reason, and where)",
        ),
    ),
    kinds=(
        BudgetKind(
            "no_graph_skips",
            no_graph_skips,
            "graphs",
            named("eager_graph_calls"),
            _skips,
            limit_argument=None,
            counter="eager_graph_calls",
        ),
    ),
    cuda=True,
    needs_text=" Needs CUDA.",
)
