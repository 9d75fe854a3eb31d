"""What each part of the sampled probe's step marks costs a loop that replays a CUDA graph per step (issue 43: the
marks alone cost static_compiled about 2.7% on an H100). Needs CUDA.

Per strategy and round, each variant next to a bare run (which goes first alternates; the variants' order
rotates): wall-time ratios of the loop between device syncs, medians with 90% signed-rank intervals, and the cost
per graph replay that the median ratio means. The variants wrap ``torch.cuda.CUDAGraph.replay`` as the probe does:

- ``patch``: the wrapper alone;
- ``capturing check``: the wrapper asks ``torch.cuda.is_current_stream_capturing()``;
- ``new event``: the wrapper makes a timing event and records it before the replay (the probe's mark until
  issue 43's last round, without the check);
- ``pooled event``: the wrapper records the next of events made and recorded once before the run;
- ``probe marks``: the probe's own marks (:meth:`pytest_syncguard.probes.sampler._StepClock.replay`: since issue
  43's last round, one event before the first replay and one after each);
- ``event after``: the wrapper makes a timing event and records it once the replay is queued (the host's work then
  overlaps the replay's on the device, where a mark before it delays the replay).

Run from the repository root: ``python -m bench.bench_step_marks [--strategies a,b] [--variants a,b] [--rounds N]
[--budget S]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from bench.bench_timeline_capture import NEW_TOKENS, paired_rounds, ratio_interval, shared_deadlines, timed, workload
from examples.strategies import STRATEGIES
from pytest_syncguard.probes import sampler
from pytest_syncguard.probes.patches import Patches

VARIANTS = ("patch", "capturing check", "new event", "pooled event", "probe marks", "event after")
#: Events made up front for ``pooled event`` (more than a run's replays).
POOL = 4096


@contextmanager
def wrapped(variant: str, replays: list[int]) -> Iterator[None]:
    """``CUDAGraph.replay`` wrapped as ``variant`` does; ``replays`` gets the run's replay count."""
    patches = Patches()
    count = [0]
    pool: list[torch.cuda.Event] = []
    clock = sampler._StepClock() if variant == "probe marks" else None
    if variant == "pooled event":
        pool = [torch.cuda.Event(enable_timing=True) for _ in range(POOL)]  # type: ignore[no-untyped-call]
        for event in pool:
            event.record()
        pool.reverse()

    def wrap(replay: Callable[[torch.cuda.CUDAGraph], None]) -> Callable[[torch.cuda.CUDAGraph], None]:
        def marked(graph: torch.cuda.CUDAGraph) -> None:
            count[0] += 1
            if variant == "capturing check":
                torch.cuda.is_current_stream_capturing()  # type: ignore[no-untyped-call]
            elif variant == "new event":
                torch.cuda.Event(enable_timing=True).record()  # type: ignore[no-untyped-call]
            elif variant == "pooled event":
                pool.pop().record()
            elif clock is not None:
                clock.replay(replay, graph)
                return
            replay(graph)
            if variant == "event after":
                torch.cuda.Event(enable_timing=True).record()  # type: ignore[no-untyped-call]

        return marked

    patches.patch(torch.cuda.CUDAGraph, "replay", wrap)
    try:
        yield
    finally:
        patches.undo()
        replays.append(count[0])


def cost(name: str, fn: Callable[[], object], variants: tuple[str, ...], rounds: int, deadline: float) -> None:
    replays: list[int] = []

    def run(variant: str) -> float:
        if variant == "bare":
            return timed(fn)
        with wrapped(variant, replays):
            return timed(fn)

    walls, ratios = paired_rounds(variants, run, rounds, deadline)
    median = statistics.median
    bare, per_run = median(walls["bare"]), max(median(replays), 1)
    cells = " | ".join(
        f"{v} {median(ratios[v]):.3f} ({ratio_interval(ratios[v])}, "
        f"{(median(ratios[v]) - 1) * bare / per_run * 1e6:+.1f} us/replay)"
        for v in variants
    )
    rounds_run = len(ratios[variants[0]])
    print(f"{name:<16} {rounds_run} rounds, bare {bare * 1e3:.1f} ms, {per_run} replays | {cells}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategies", default="static_compiled,cuda_graph")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--budget", type=float, default=1e9, help="seconds after which no round is started")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_step_marks needs CUDA")
    began = time.monotonic()
    model, prompt, eos = workload()
    print(f"machine: {torch.cuda.get_device_name()}; torch {torch.__version__}", flush=True)
    names = [n for n in args.strategies.split(",") if n]
    variants = tuple(v for v in args.variants.split(",") if v)
    if unknown := set(variants) - set(VARIANTS):
        parser.error(f"--variants: unknown {', '.join(sorted(unknown))}; known: {', '.join(VARIANTS)}")
    for name, deadline in shared_deadlines(names, args.budget, began):
        strategy = STRATEGIES[name]
        cost(name, lambda s=strategy: s(model, prompt, NEW_TOKENS, eos), variants, args.rounds, deadline)


if __name__ == "__main__":
    main()
