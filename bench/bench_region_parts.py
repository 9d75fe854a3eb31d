"""What a measured region costs a decode loop, probe by probe: each loop run bare and inside a
``SyncGuard().generation()`` region, whole and with one of its region probes left out (and with every one left out:
the region's own clock and bookkeeping), the variants interleaved in one process (one run of each per round, in a
rotating order), per variant the median over rounds of its time per token over the bare run's of the same round;
"bare again" is the noise.

A probe whose removal brings the region's ratio down by more than that noise is what the region costs. A plain
``generation()`` region counts operators too (the native counter), which a ``measure()``'s timed runs do not.
``--sampled`` enters the sampled instrument around each region as the plugin does around a test's call (the PM
sampler and the launch log over the run).

    python -m bench.bench_region_parts [--loops static_cache,hf_generate] [--rounds 6] [--sampled]

Run from the repository root; it prints the machine, torch and transformers it ran with.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import replace
from typing import Any

import torch
import transformers

from examples import models
from examples.strategies import STRATEGIES, release_kept_state
from examples.test_strategies import BATCH, NEW_TOKENS, PROMPT
from pytest_syncguard import guard, instruments
from pytest_syncguard.guard import SyncGuard

#: The region probes a variant leaves out (one at a time), by name (guard.REGION_PROBES).
LEFT_OUT = (
    "operators",
    "timeline annotation",
    "marked steps",
    "syncs",
    "CUDA calls",
    "transfers",
    "driver calls",
    "compiles",
    "CUDA graphs",
)
#: The variant that leaves every probe out: the region's own clock and bookkeeping.
EVERY = "every probe"


def _never(region: Any) -> bool:
    return False


@contextmanager
def _without(name: str | None) -> Iterator[None]:
    """The region's probes without ``name`` (None: all) while the block runs."""
    probes = guard.REGION_PROBES
    if name is not None:
        guard.REGION_PROBES = tuple(replace(p, wanted=_never) if name in (p.name, EVERY) else p for p in probes)
    try:
        yield
    finally:
        guard.REGION_PROBES = probes


def _sampled_instrument(cuda: bool) -> AbstractContextManager[Any]:
    """The sampled timed-run instrument of a test's call, as the plugin arms it (CUDA only)."""
    if not cuda:
        return nullcontext()
    from pytest_syncguard.timeline_source import SAMPLED, TimelineSource

    return instruments.for_call(TimelineSource(SAMPLED, "bench"), cuda=True).recording()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", default="static_cache,hf_generate,kv_cache")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--sampled", action="store_true", help="the region inside the sampled instrument too")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    name = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"machine: {name}; torch {torch.__version__}; transformers {transformers.__version__}")
    model = models.gpt2(device, tiny=not cuda)
    generator = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, model.config.vocab_size, (BATCH, PROMPT), generator=generator).to(device)
    eos = model.config.vocab_size
    variants: dict[str, str | None] = {"region": None, **{f"region without {p}": p for p in (*LEFT_OUT, EVERY)}}
    for loop in args.loops.split(","):
        strategy = STRATEGIES[loop]

        def run() -> Any:
            return strategy(model, prompt, NEW_TOKENS, eos)  # noqa: B023

        run()
        run()
        ratios: dict[str, list[float]] = {v: [] for v in [*variants, "bare again"]}
        bare_ms: list[float] = []
        names = list(ratios)
        for round_ in range(args.rounds):
            bare = _timed(run, None, cuda, args.sampled)
            bare_ms.append(bare * 1e3 / NEW_TOKENS)
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for variant in order:
                if variant == "bare again":
                    ratios[variant].append(_timed(run, None, cuda, args.sampled) / bare)
                else:
                    ratios[variant].append(_timed(run, variants[variant] or "", cuda, args.sampled) / bare)
        parts = " | ".join(f"{v} {statistics.median(r):.3f}" for v, r in ratios.items())
        print(f"{loop:16} bare {statistics.median(bare_ms):.2f} ms/token | {parts}", flush=True)
        release_kept_state()


def _timed(run: Callable[[], Any], left_out: str | None, cuda: bool, sampled: bool) -> float:
    """Seconds of one run: bare (``left_out`` None) by the wall clock between device syncs, else a region's own
    clock, with the probe named ``left_out`` left out ("": none)."""
    if left_out is None:
        if cuda:
            torch.cuda.synchronize()
        began = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - began
    with ExitStack() as stack:
        stack.enter_context(_without(left_out or None))
        if sampled:
            stack.enter_context(_sampled_instrument(cuda))
        syncguard = SyncGuard("bench_region_parts", warmup=0)
        with syncguard.generation(tokens=NEW_TOKENS) as region:
            run()
    return region.measurement.timings[0].seconds


if __name__ == "__main__":
    main()
