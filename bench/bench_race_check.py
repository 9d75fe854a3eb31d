"""What the race check costs a decoding loop: a measured region with the check against the same region without it,
for every strategy at the seed article's sizes (GPT-2 124M, batch 32, prompt 16, 100 new tokens). Needs CUDA.

Each round runs, per strategy, both variants in an order that alternates each round, in one process; both are
timed regions that count no operators (a timed run of ``syncguard.measure()``), so the ratio is the check's own
cost. Loops with no copy in flight (kv_cache, static_cache, ...) pay only for the wrappers of event and stream
calls; stream_pingpong and cuda_graph keep a flag copy in flight across their steps, during which every operator
passes the native access check. It prints per strategy the medians of wall time, the median over rounds of
checked/unchecked, how many copies the check watched per run and how many races it found (none expected).

Run from the repository root: ``python -m bench.bench_race_check [--rounds N] [--strategies a,b]``; it prints the
machine it ran on.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from bench.bench_timeline_capture import BATCH, NEW_TOKENS, PROMPT, workload
from examples.strategies import STRATEGIES
from pytest_syncguard.analysis.races import RaceEvent
from pytest_syncguard.guard import GenerationRegion
from pytest_syncguard.probes.races import RACES


def timed(generate: Callable[[], object], check: bool, races: list[RaceEvent]) -> float:
    """Wall time of one region around ``generate`` (between device syncs, as a region is timed)."""
    region = GenerationRegion(NEW_TOKENS, "cuda", count_ops=False, needs=frozenset({"races"}) if check else frozenset())
    torch.cuda.synchronize()
    start = time.perf_counter()
    with region.recording():
        generate()
    seconds = time.perf_counter() - start
    assert region.measurement is not None
    races.extend(region.measurement.races)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated (default: all)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_race_check needs CUDA")
    if RACES.unavailable() is not None:
        raise SystemExit(f"bench_race_check: {RACES.unavailable()}")
    model, prompt, eos = workload()
    print(
        f"machine: {torch.cuda.get_device_name()}; torch {torch.__version__}; GPT-2 124M, batch {BATCH}, prompt "
        f"{PROMPT}, {NEW_TOKENS} new tokens; {args.rounds} rounds, variants alternating",
        flush=True,
    )
    print(f"{'strategy':<16} {'plain ms':>9} {'checked ms':>10} {'checked/plain':>13} {'copies/run':>10} {'races':>6}")
    for name in args.strategies.split(","):
        strategy = STRATEGIES[name]

        def generate(strategy: Callable[..., object] = strategy) -> None:
            strategy(model, prompt, NEW_TOKENS, eos)

        races: list[RaceEvent] = []
        for check in (False, True, False, True):  # warm-up: compilation, graph capture, allocator
            timed(generate, check, races)
        plain: list[float] = []
        checked: list[float] = []
        seen = RACES.seen
        for round_ in range(args.rounds):
            order = (False, True) if round_ % 2 == 0 else (True, False)
            for check in order:
                (checked if check else plain).append(timed(generate, check, races))
        copies = (RACES.seen - seen) / args.rounds
        ratio = statistics.median(c / p for c, p in zip(checked, plain, strict=True))
        print(
            f"{name:<16} {statistics.median(plain) * 1e3:>9.1f} {statistics.median(checked) * 1e3:>10.1f} "
            f"{ratio:>13.3f} {copies:>10.1f} {len(races):>6}",
            flush=True,
        )


if __name__ == "__main__":
    main()
