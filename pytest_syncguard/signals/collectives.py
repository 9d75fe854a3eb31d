"""The collectives signal: the collectives a region called (all-reduce, all-gather, ... of any process group, NCCL
or gloo), each with its call site, counted by the collective probe (:mod:`..probes.collectives`); and on CUDA, from
a traced run, each collective's kernel, which the report matches across the ranks of a launch to split each rank's
time in collectives into its wait for the last rank and the transfer, and to name the straggler
(:mod:`..analysis.collectives`). The sampled timeline cannot tell a collective's kernel from another: the waits come
from the counting run's trace."""

from __future__ import annotations

from .base import CounterSpec, Measured, Metric, Part, Runs, Signal, united

#: Joined from a launch's ranks (:func:`..document.launch.join`): the longest any rank waited for the last rank to
#: arrive at its collectives, per token (median over steps).
WAIT_METRIC = "collective_wait_us_per_token"


def _joined_only(m: Measured) -> list[float]:
    return []  # no process sees the other ranks: the report joins it


SIGNAL = Signal(
    "collectives",
    counters=(
        CounterSpec("collectives", "collectives called (torch.distributed's and the functional collectives, any "
                    "process group)", quiet_when_zero=True, per_token=True, items="collectives (operation and call "
                    "site)", budget="max_collectives_per_token"),
    ),
    metrics=(
        Metric(WAIT_METRIC, "us", counted=False, higher_is_better=False, floor=20.0, runs=_joined_only, host=True,
               description="the longest wait of any rank of a launch for the last rank to arrive at its "
               "collectives, per token (median over steps; joined by the report from the ranks' traced runs)"),
    ),
    # Per region number: its tokens and calls in order (every run), and its collective kernels' (start, end) with
    # how many were left out (traced runs).
    parts=(Part("collective_calls", united, Runs.EVERY), Part("collective_kernels", united, Runs.EVERY)),
)  # fmt: skip
