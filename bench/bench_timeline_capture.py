"""The GPU timeline capture against unprofiled runs of every decoding strategy (the seed article's sizes: GPT-2
124M, batch 32, prompt 16, 100 new tokens). Needs CUDA.

Each round runs, per strategy, a bare run and a captured one (syncguard's capture: CUDA activity and the
plugin's annotations), and with ``--host-ops`` one that also records every host operator (what the plugin
captured before; its busy fraction and gaps from its first two timed runs, whose traces take seconds each to
read), in an order rotated each round, in one process. Per strategy it prints:

- wall time of each variant (medians; a captured run is timed inside the capture, between device syncs, as a
  test's region is) and the median over rounds of captured/bare;
- the busy fraction of the captured region against "kernel time / bare": the union of kernel, memcpy and
  memset time of the captured traces (device timestamps, which host overhead does not change) over the bare
  runs' wall time (medians of each). A capture that slows the host makes the first lower than the second;
- the largest and 99th-percentile idle gap of the captured region (every step, no warm-up left out);
- where the steps came from, and whether the trace was reliable.

``--parts`` adds profiler configurations timed alone, which tell the capture's costs apart: without CUDA
synchronization events, without the host side at all (CUDA activity only), without external correlation.

Run from the repository root: ``python -m bench.bench_timeline_capture [--rounds N] [--host-ops] [--parts]
[--strategies a,b]``; it prints the machine it ran on.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._C._autograd import _disable_profiler, _enable_profiler, _prepare_profiler
from torch._C._profiler import ProfilerActivity, RecordScope, _ExperimentalConfig

from examples import models
from examples.strategies import STRATEGIES
from pytest_syncguard.analysis import gaps, trace_file
from pytest_syncguard.analysis.reliability import sentinel_problem
from pytest_syncguard.probes.timeline import TIMELINE

BATCH, PROMPT, NEW_TOKENS = 32, 16, 100
CPU, CUDA = ProfilerActivity.CPU, ProfilerActivity.CUDA
#: Runs of the ``--host-ops`` variant whose trace is analysed (each takes seconds to read); the others are timed.
HOST_OPS_ANALYSED = 2
_REGIONS = itertools.count(1)


@dataclass
class Variant:
    """One way of running a strategy, and what its runs measured."""

    name: str
    host_ops: bool | None
    """None: bare; else the capture, with or without host operators."""
    wall: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    device_us: list[float] = field(default_factory=list)
    max_gap: list[float] = field(default_factory=list)
    p99_gap: list[float] = field(default_factory=list)
    steps_from: str = ""
    problems: list[str] = field(default_factory=list)

    part: Callable[[], AbstractContextManager[object]] | None = None
    """``--parts``: a profiler configuration timed alone (wall time only)."""

    def run(self, fn: Callable[[], object]) -> None:
        if self.host_ops is None:
            with self.part() if self.part is not None else nullcontext():
                self.wall.append(_timed(fn))
            return
        number = next(_REGIONS)
        with TIMELINE.capturing(host_ops=self.host_ops) as files:
            self.wall.append(_timed(fn, TIMELINE.region(number)))
        if self.host_ops and len(self.busy) >= HOST_OPS_ANALYSED:
            files[0].unlink()  # reading a trace with every host operator takes seconds: its wall time suffices
            return
        try:
            trace = trace_file.load(files[0])
        finally:
            files[0].unlink()
        timeline = gaps.analyze(trace, window=gaps.regions(trace)[number])
        assert timeline is not None
        problem = sentinel_problem(trace) or timeline.unreliable
        if problem:
            self.problems.append(problem)
        self.steps_from = timeline.steps_from or "none"
        self.busy.append(timeline.busy_fraction)
        self.device_us.append(timeline.busy_us)
        self.max_gap.append(timeline.gap_stat("max"))
        self.p99_gap.append(timeline.gap_stat("p99"))


def _timed(fn: Callable[[], object], around: AbstractContextManager[object] | None = None) -> float:
    """Wall time of ``fn`` between device syncs, as a test's region is timed."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    with around or nullcontext():
        fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


@contextmanager
def _profiler(activities: set[Any], scopes: set[Any], **experimental: bool) -> Iterator[None]:
    """A profiler session of one configuration (what the parts of syncguard's capture cost apart)."""
    config = torch.autograd.profiler.profile(  # type: ignore[no-untyped-call]
        use_device="cuda", experimental_config=_ExperimentalConfig(**experimental)
    ).config()
    _prepare_profiler(config, activities)
    _enable_profiler(config, activities, scopes)  # type: ignore[call-arg]
    try:
        yield
    finally:
        torch.cuda.synchronize()
        _disable_profiler()


PARTS: dict[str, Callable[[], AbstractContextManager[object]]] = {
    # syncguard's capture without the CUDA synchronization events
    "no sync events": lambda: _profiler({CPU, CUDA}, {RecordScope.USER_SCOPE}),
    # ... and without the host side: no annotations, nothing recorded on the host but CUPTI's records
    "CUDA only": lambda: _profiler({CUDA}, {RecordScope.USER_SCOPE}),
    # syncguard's capture without linking runtime calls to the host's ranges
    "no ext. corr.": lambda: _profiler(
        {CPU, CUDA}, {RecordScope.USER_SCOPE}, enable_cuda_sync_events=True, disable_external_correlation=True
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--host-ops", action="store_true", help="also capture with every host operator recorded")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated (default: all)")
    parser.add_argument("--parts", action="store_true", help="also time profiler configurations that tell the "
                        "capture's costs apart (wall time over bare)")  # fmt: skip
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_timeline_capture needs CUDA")
    model = models.gpt2("cuda", tiny=False)
    generator = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, model.config.vocab_size, (BATCH, PROMPT), generator=generator).to("cuda")
    eos = model.config.vocab_size  # never emitted: every run decodes all steps
    names = args.strategies.split(",")
    print(
        f"machine: {torch.cuda.get_device_name()}; torch {torch.__version__}; GPT-2 124M, batch {BATCH}, prompt "
        f"{PROMPT}, {NEW_TOKENS} new tokens; {args.rounds} rounds, variants interleaved",
        flush=True,
    )
    header = (
        f"{'strategy':<16} {'bare ms':>8} {'capt ms':>8} {'capt/bare':>9} {'busy':>6} {'kern/bare':>9} {'busy err':>8} "
        f"{'max gap':>8} {'p99 gap':>8}"
    )
    if args.host_ops:
        header += f" | {'ops ms':>8} {'ops/bare':>8} {'busy':>6} {'max gap':>8} {'p99 gap':>8}"
    print(header + "  steps; trace")
    for name in names:
        strategy = STRATEGIES[name]

        def generate(strategy: Callable[..., object] = strategy) -> None:
            strategy(model, prompt, NEW_TOKENS, eos)

        variants = [Variant("bare", None), Variant("capture", False)]
        if args.host_ops:
            variants.append(Variant("host ops", True))
        parts = [Variant(part, None, part=make) for part, make in PARTS.items()] if args.parts else []
        variants += parts
        for variant in variants:  # warm-up: compilation, graph capture, allocator, profiler start-up
            variant.run(generate)
            variant.run(generate)
        for variant in variants:
            variant.wall.clear()
            variant.busy.clear()
            variant.device_us.clear()
            variant.max_gap.clear()
            variant.p99_gap.clear()
        for r in range(args.rounds):
            for variant in variants[r % len(variants) :] + variants[: r % len(variants)]:
                variant.run(generate)
        bare, capture = variants[0], variants[1]
        median = statistics.median
        ratios = [c / b for c, b in zip(capture.wall, bare.wall, strict=True)]
        busy, share = median(capture.busy), median(capture.device_us) / 1e6 / median(bare.wall)
        line = (
            f"{name:<16} {median(bare.wall) * 1e3:>8.1f} {median(capture.wall) * 1e3:>8.1f} {median(ratios):>9.3f} "
            f"{busy:>6.3f} {share:>9.3f} {busy / share - 1:>+8.1%} {median(capture.max_gap):>8.0f} "
            f"{median(capture.p99_gap):>8.1f}"
        )
        if args.host_ops:
            ops = variants[2]
            ops_ratios = [o / b for o, b in zip(ops.wall, bare.wall, strict=True)]
            line += (
                f" | {median(ops.wall) * 1e3:>8.1f} {median(ops_ratios):>8.3f} {median(ops.busy):>6.3f} "
                f"{median(ops.max_gap):>8.0f} {median(ops.p99_gap):>8.1f}"
            )
        if parts:
            line += " | " + ", ".join(
                f"{v.name} {median([w / b for w, b in zip(v.wall, bare.wall, strict=True)]):.3f}" for v in parts
            )
        problems = sorted({p for v in variants for p in v.problems})
        print(f"{line}  {capture.steps_from}; {'unreliable: ' + problems[0] if problems else 'reliable'}", flush=True)


if __name__ == "__main__":
    main()
