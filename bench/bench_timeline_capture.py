"""The GPU timeline capture against unprofiled runs of every decoding strategy (the seed article's sizes: GPT-2
124M, batch 32, prompt 16, 100 new tokens). Needs CUDA.

Each round runs, per strategy, every variant next to a bare run of its own (which of the two goes first
alternates), so that a ratio compares runs a second apart on a host whose speed drifts: a second bare run (the
noise floor: how far apart two identical runs are on this host), a captured one
(syncguard's capture: CUDA activity and the plugin's annotations), with ``--host-ops`` one that also records every
host operator (what the plugin captured before; its busy fraction and gaps from its first two timed runs, whose
traces take seconds each to read), and the ``--parts``; the order of the variants rotates each round, all in one
process. Per strategy it prints:

- wall time of each variant (medians; a captured run is timed inside the capture, between device syncs, as a
  test's region is), the median over rounds of captured/bare, and a 90% interval of captured/bare and of the
  noise floor (Hodges-Lehmann estimate and Wilcoxon signed-rank interval of the paired log ratios, as the A/B
  report computes them): a target such as captured/bare <= 1.05 is shown only when the interval's top is below
  it;
- the busy fraction of the captured region against "kernel time / bare": the union of kernel, memcpy and
  memset time of the captured traces (device timestamps, which host overhead does not change) over the bare
  runs' wall time (medians of each). A capture that slows the host makes the first lower than the second;
- the largest and 99th-percentile idle gap of the captured region (every step, no warm-up left out);
- where the steps came from, and whether the trace was reliable.

``--parts`` adds configurations timed alone, which tell the capture's costs apart: profiler configurations
(without CUDA synchronization events, CUDA activity only, without external correlation, the host side only),
syncguard's capture with activity kinds switched off after it started (driver calls, what keeping them costs;
runtime records; all but kernels, copies and memsets; everything), the allocator history (Python stacks) alone
and with the capture, and the plugin's other probes as a suite test's timed run has them (``guard``), alone and
with the capture.

``--strategies launch_loop`` (not in the default list) times a loop of nothing but kernel launches (one in-place
add on a one-element tensor at a time), ``op_loop`` one of operators that launch nothing (a view): their runs
take milliseconds, so many rounds fit in a call, and they print what the capture and each part add per iteration,
in µs (median of the paired differences, 90% interval).

Every capture and profiler session here detaches CUPTI when it stops, as syncguard's capture does: before it did,
CUPTI stayed attached after the warm-up's first capture, and every bare run paid for it (bench_cupti_floor.py).

Run from the repository root: ``python -m bench.bench_timeline_capture [--rounds N] [--host-ops]
[--parts all|a,b] [--strategies a,b] [--analysed N]``; it prints the machine it ran on.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch._C._autograd import _disable_profiler, _enable_profiler, _prepare_profiler
from torch._C._profiler import ProfilerActivity, RecordScope, _ExperimentalConfig

from examples import models
from examples.strategies import STRATEGIES
from pytest_syncguard.analysis import gaps, trace_file
from pytest_syncguard.analysis.reliability import sentinel_problem
from pytest_syncguard.gate.ab import stats as ab_stats
from pytest_syncguard.guard import SyncGuard
from pytest_syncguard.instruments import TIMED_RUN
from pytest_syncguard.probes import cupti
from pytest_syncguard.probes.memory import allocation_history
from pytest_syncguard.probes.timeline import TIMELINE, cupti_detached_afterwards

BATCH, PROMPT, NEW_TOKENS = 32, 16, 100


def workload() -> tuple[Any, torch.Tensor, int]:
    """The benches' decoding workload on CUDA: GPT-2 124M, a fixed random prompt of BATCH x PROMPT tokens, and an
    end-of-sequence id the model never emits (every run decodes all NEW_TOKENS steps)."""
    model = models.gpt2("cuda", tiny=False)
    prompt = torch.randint(0, model.config.vocab_size, (BATCH, PROMPT), generator=torch.Generator().manual_seed(2))
    return model, prompt.to("cuda"), model.config.vocab_size


CPU, CUDA = ProfilerActivity.CPU, ProfilerActivity.CUDA
#: Runs of the ``--host-ops`` variant whose trace is analysed (each takes seconds to read); the others are timed.
HOST_OPS_ANALYSED = 2
#: Confidence of the intervals printed.
CONFIDENCE = 0.9
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
    ratios: list[float] = field(default_factory=list)
    """Its wall time over that of the bare run next to it, each round."""
    differences: list[float] = field(default_factory=list)
    """Its wall time minus that of the bare run next to it, each round (seconds)."""
    steps_from: str = ""
    problems: list[str] = field(default_factory=list)

    part: Callable[[], AbstractContextManager[object]] | None = None
    """``--parts``: a profiler configuration timed alone (wall time only)."""

    def clear(self) -> None:
        for values in (self.wall, self.busy, self.device_us, self.max_gap, self.p99_gap, self.ratios, self.differences):
            values.clear()

    def run(self, fn: Callable[[], object], analysed: int) -> None:
        if self.host_ops is None:
            with self.part() if self.part is not None else nullcontext():
                self.wall.append(timed(fn))
            return
        number = next(_REGIONS)
        with TIMELINE.capturing(host_ops=self.host_ops) as files:
            self.wall.append(timed(fn, TIMELINE.region(number)))
        if len(self.busy) >= (HOST_OPS_ANALYSED if self.host_ops else analysed):
            files[0].unlink()  # reading a trace takes time a further round can use: its wall time suffices
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


def timed(fn: Callable[[], object], around: AbstractContextManager[object] | None = None) -> float:
    """Wall time of ``fn`` between device syncs, as a test's region is timed (after a garbage collection, so that
    no run pays for the garbage of the one before)."""
    gc.collect()
    torch.cuda.synchronize()
    start = time.perf_counter()
    with around or nullcontext():
        fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def paired_rounds(
    variants: Sequence[str], run: Callable[[str], float], rounds: int, deadline: float
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each variant timed next to a bare run, ``rounds`` times (the variants' order rotates from round to round and
    which of a pair goes first alternates; no round starts after ``deadline`` once two have run), after one
    warm-up run of each that is not kept. ``run(variant)`` (``"bare"`` among them) returns a run's wall time.
    Returns the wall times by variant and each variant's ratios to the bare run beside it."""
    walls: dict[str, list[float]] = {"bare": [], **{v: [] for v in variants}}
    ratios: dict[str, list[float]] = {v: [] for v in variants}
    for variant in walls:
        run(variant)  # warm-up
    for r in range(rounds):
        if r >= 2 and time.monotonic() > deadline:
            break
        for i, variant in enumerate([*variants[r % len(variants) :], *variants[: r % len(variants)]]):
            for side in ("bare", variant) if (r + i) % 2 == 0 else (variant, "bare"):
                walls[side].append(run(side))
            ratios[variant].append(walls[variant][-1] / walls["bare"][-1])
    return walls, ratios


def shared_deadlines(names: Sequence[str], budget: float, began: float) -> Iterator[tuple[str, float]]:
    """Each name with its deadline: an equal share of what is left of ``budget`` seconds since ``began`` (a
    ``time.monotonic()``), given out as each one starts."""
    for index, name in enumerate(names):
        yield name, time.monotonic() + (budget - (time.monotonic() - began)) / (len(names) - index)


@contextmanager
def _profiler(activities: set[Any], scopes: set[Any], **experimental: bool) -> Iterator[None]:
    """A profiler session of one configuration (what the parts of syncguard's capture cost apart), which detaches
    CUPTI when it stops, as syncguard's capture does (else the bare runs after it pay for CUPTI too)."""
    config = torch.autograd.profiler.profile(  # type: ignore[no-untyped-call]
        use_device="cuda", experimental_config=_ExperimentalConfig(**experimental)
    ).config()
    _prepare_profiler(config, activities)
    _enable_profiler(config, activities, scopes)  # type: ignore[call-arg]
    try:
        yield
    finally:
        torch.cuda.synchronize()
        with cupti_detached_afterwards():  # only around the stop, as in syncguard's capture (probes/timeline.py)
            _disable_profiler()


#: Iterations of one run of ``launch_loop`` and of ``op_loop``.
ITERATIONS = 2000


def launch_loop(model: object, prompt: torch.Tensor, max_new_tokens: int, eos: int) -> None:
    """Kernel launches and nothing else (the strategies' signature; only ``prompt``'s device is used): what a
    capture adds to each launch, apart from everything else a decoding loop does."""
    x = torch.zeros(1, device=prompt.device)
    for _ in range(ITERATIONS):
        x.add_(1)


def op_loop(model: object, prompt: torch.Tensor, max_new_tokens: int, eos: int) -> None:
    """Operators that launch nothing (a view of a CUDA tensor): what a capture adds to each operator the
    dispatcher runs, apart from launches (a decoding step runs about four operators per launch)."""
    x = torch.zeros(1, device=prompt.device)
    for _ in range(ITERATIONS):
        x.view(1)


#: The loops whose runs take milliseconds: what a capture adds is printed per iteration.
LOOPS = {"launch_loop": launch_loop, "op_loop": op_loop}


#: CUPTI activity kinds (cupti_activity.h's CUpti_ActivityKind), switched off after the profiler started them
#: (``--parts``): what each kind of record costs the loop.
CUPTI_KINDS = {"memcpy": 1, "memset": 2, "driver": 4, "runtime": 5, "kernel": 10, "overhead": 17, "sync": 38}


@contextmanager
def discarded_capture() -> Iterator[None]:
    """syncguard's capture of a run that is only timed: its exported trace is removed afterwards."""
    files: list[Path] = []
    try:
        with TIMELINE.capturing() as files:
            yield
    finally:
        for file in files:
            file.unlink(missing_ok=True)


@contextmanager
def _capture_without(*kinds: str) -> Iterator[None]:
    """syncguard's capture with some CUPTI activity kinds switched off once it started."""
    with discarded_capture():
        library = cupti.library()
        if library is None:
            raise RuntimeError("no libcupti loaded in this process")
        calls = [(library.cuptiActivityDisable, CUPTI_KINDS[kind]) for kind in kinds]
        for call, kind in calls:
            if status := call(kind):
                raise RuntimeError(f"{call.__name__}({kind}) returned {status}")
        yield


@contextmanager
def _memory_history(capture: bool) -> Iterator[None]:
    """The allocator history (Python stacks), with or without syncguard's capture: what a test with a memory
    budget recorded before it moved to the diagnostic rerun of a failing one."""
    with allocation_history() as snapshots, discarded_capture() if capture else nullcontext():
        yield
    for snapshot in snapshots:
        snapshot.unlink()


@contextmanager
def _guarded(capture: bool) -> Iterator[None]:
    """The plugin's probes around the run, as a suite test's timed run has them (sync probe, allocator stats, race
    check; operators not counted), with or without the capture: what a test adds to the capture's cost."""
    guard = SyncGuard("bench", device="cuda", needs=frozenset({"memory", "races"}))
    timed_repeat = guard._region(NEW_TOKENS, None, count_ops=False, run=TIMED_RUN)  # a timed repeat
    with discarded_capture() if capture else nullcontext(), timed_repeat:
        yield


PARTS: dict[str, Callable[[], AbstractContextManager[object]]] = {
    # syncguard's capture without the CUDA synchronization events
    "no sync events": lambda: _profiler({CPU, CUDA}, {RecordScope.USER_SCOPE}),
    # ... and without the host side: no annotations, nothing recorded on the host but CUPTI's records
    "CUDA only": lambda: _profiler({CUDA}, {RecordScope.USER_SCOPE}),
    # syncguard's capture without linking runtime calls to the host's ranges
    "no ext. corr.": lambda: _profiler(
        {CPU, CUDA}, {RecordScope.USER_SCOPE}, enable_cuda_sync_events=True, disable_external_correlation=True
    ),
    # the profiler's host side alone: no CUPTI
    "CPU only": lambda: _profiler({CPU}, {RecordScope.USER_SCOPE}),
    # syncguard's capture with CUPTI kinds switched on or off
    "no driver records": lambda: _capture_without("driver"),
    "no runtime": lambda: _capture_without("runtime"),
    "kernels only": lambda: _capture_without("runtime", "sync", "overhead"),
    "CUPTI off": lambda: _capture_without(*CUPTI_KINDS),
    # the allocator history of a memory budget
    "memory history": lambda: _memory_history(capture=False),
    "capture + history": lambda: _memory_history(capture=True),
    # the plugin's other probes, as a suite test has them beside the capture
    "guard": lambda: _guarded(capture=False),
    "capture + guard": lambda: _guarded(capture=True),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--analysed", type=int, default=5, help="captured runs per strategy whose trace is read "
                        "(busy fraction, gaps); the others are only timed")  # fmt: skip
    parser.add_argument("--host-ops", action="store_true", help="also capture with every host operator recorded")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated (default: all)")
    parser.add_argument("--parts", default="", help="also time these configurations that tell the capture's costs "
                        f"apart, comma-separated, or 'all' ({', '.join(PARTS)})")  # fmt: skip
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_timeline_capture needs CUDA")
    model, prompt, eos = workload()
    names = args.strategies.split(",")
    strategies: dict[str, Callable[..., object]] = {**STRATEGIES, **LOOPS}
    print(
        f"machine: {torch.cuda.get_device_name()}; torch {torch.__version__}; GPT-2 124M, batch {BATCH}, prompt "
        f"{PROMPT}, {NEW_TOKENS} new tokens; {args.rounds} rounds, variants interleaved",
        flush=True,
    )
    header = (
        f"{'strategy':<16} {'bare ms':>8} {'capt ms':>8} {'capt/bare':>9} {'90% interval':>13} {'A/A interval':>13} "
        f"{'busy':>6} {'kern/bare':>9} {'busy err':>8} {'max gap':>8} {'p99 gap':>8}"
    )
    if args.host_ops:
        header += f" | {'ops ms':>8} {'ops/bare':>8} {'busy':>6} {'max gap':>8} {'p99 gap':>8}"
    print(header + "  steps; trace")
    for name in names:
        strategy = strategies[name]

        def generate(strategy: Callable[..., object] = strategy) -> None:
            strategy(model, prompt, NEW_TOKENS, eos)

        variants = [Variant("bare", None), Variant("capture", False), Variant("bare again", None)]
        if args.host_ops:
            variants.append(Variant("host ops", True))
        chosen = list(PARTS) if args.parts == "all" else [p for p in args.parts.split(",") if p]
        parts = [Variant(part, None, part=PARTS[part]) for part in chosen]
        variants += parts
        for variant in variants:  # warm-up: compilation, graph capture, allocator, profiler start-up
            variant.run(generate, args.analysed)
            variant.run(generate, args.analysed)
        for variant in variants:
            variant.clear()
        bare, others = variants[0], variants[1:]
        for r in range(args.rounds):  # each variant next to a bare run of its own, which goes first every other time
            for i, variant in enumerate(others[r % len(others) :] + others[: r % len(others)]):
                for run in (bare, variant) if (r + i) % 2 == 0 else (variant, bare):
                    run.run(generate, args.analysed)
                variant.ratios.append(variant.wall[-1] / bare.wall[-1])
                variant.differences.append(variant.wall[-1] - bare.wall[-1])
        capture, again = variants[1], variants[2]
        median = statistics.median
        busy, share = median(capture.busy), median(capture.device_us) / 1e6 / median(bare.wall)
        error = busy / share - 1 if share else math.nan  # a loop without device work has none
        line = (
            f"{name:<16} {median(bare.wall) * 1e3:>8.1f} {median(capture.wall) * 1e3:>8.1f} "
            f"{median(capture.ratios):>9.3f} {ratio_interval(capture.ratios):>13} {ratio_interval(again.ratios):>13} "
            f"{busy:>6.3f} {share:>9.3f} {error:>+8.1%} {median(capture.max_gap):>8.0f} "
            f"{median(capture.p99_gap):>8.1f}"
        )
        if args.host_ops:
            ops = variants[3]
            line += (
                f" | {median(ops.wall) * 1e3:>8.1f} {median(ops.ratios):>8.3f} {median(ops.busy):>6.3f} "
                f"{median(ops.max_gap):>8.0f} {median(ops.p99_gap):>8.1f}"
            )
        if parts:
            line += " | " + ", ".join(f"{v.name} {median(v.ratios):.3f} ({ratio_interval(v.ratios)})" for v in parts)
        if name in LOOPS:
            line += " | added per iteration, us: " + ", ".join(
                f"{v.name} {per_iteration(v.differences)}" for v in [capture, again, *parts]
            )
        problems = sorted({p for v in variants for p in v.problems})
        print(f"{line}  {capture.steps_from}; {'unreliable: ' + problems[0] if problems else 'reliable'}", flush=True)


def ratio_interval(ratios: list[float]) -> str:
    """The 90% signed-rank interval of paired ratios, as ``low-high``; ``n/a`` when too few rounds give one."""
    found = ab_stats.interval([math.log(r) for r in ratios], CONFIDENCE)
    return f"{math.exp(found.low):.3f}-{math.exp(found.high):.3f}" if found else "n/a"


def per_iteration(differences: list[float]) -> str:
    """Median paired difference per iteration of a loop of :data:`LOOPS`, in µs, with its 90% signed-rank
    interval."""
    per_iteration = [d / ITERATIONS * 1e6 for d in differences]
    found = ab_stats.interval(per_iteration, CONFIDENCE)
    interval = f" ({found.low:.2f} to {found.high:.2f})" if found else ""
    return f"{statistics.median(per_iteration):.2f}{interval}"


if __name__ == "__main__":
    main()
