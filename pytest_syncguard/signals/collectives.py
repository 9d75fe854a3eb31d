"""The collectives signal: the collectives a region called (all-reduce, all-gather, ... of any process group, NCCL
or gloo), each with its call site, counted by the collective probe (:mod:`..probes.collectives`); and on CUDA, from
a traced run, each collective's kernel, which the report matches across the ranks of a launch to split each rank's
time in collectives into its wait for the last rank and the transfer, and to name the straggler
(:mod:`..analysis.collectives`). The sampled timeline cannot tell a collective's kernel from another: the waits come
from the counting run's trace."""

from __future__ import annotations

from .base import CounterSpec, Part, Runs, Signal, united

SIGNAL = Signal(
    "collectives",
    counters=(
        CounterSpec("collectives", "collectives called (torch.distributed's and the functional collectives, any "
                    "process group)", quiet_when_zero=True, per_token=True, items="collectives (operation and call "
                    "site)", budget="max_collectives_per_token"),
    ),
    # Per region number: its tokens and calls in order (every run), and its collective kernels' (start, end) with
    # how many were left out (traced runs).
    parts=(Part("collective_calls", united, Runs.EVERY), Part("collective_kernels", united, Runs.EVERY)),
)  # fmt: skip
