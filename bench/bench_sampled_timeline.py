"""The sampled timeline as a test takes it (the plugin's probe: PM samples, the marker kernel and a CUDA event per
step; judged by :func:`~pytest_syncguard.instruments.judge_sampled_region`), on the suite's strategies (GPT-2 124M,
batch 32, prompt 16, 100 new tokens). Needs CUDA.

Steps are the loop's graph replays (cuda_graph, static_compiled) or its model's forward calls (the other
strategies, marked by the probe's forward pre-hook as ``syncguard.measure(model=...)`` does); the first
``--warmup-steps`` are left out, as a test leaves them out.

1. ``--agreement``: per strategy, one run sampled while CUPTI records every kernel, memcpy and memset of the same
   run on the same GPU clock (bench_pm_sampling.DeviceRecords, which slows each launch: both numbers are of that
   slower run). The truth is the records that start in the judged part (from the first judged step's event to the
   region's end) under the one definition of the timeline (``gaps.occupies``: kernels and device-to-device copies;
   an idle stretch under a microsecond is busy): its busy time, p99 and widest gap against the plugin's.
   ``--keep DIR`` writes each run's samples, step events and labelled records from the region's start to
   ``--keep-ms`` into the judged part
   (tests/data/sampled_steps, checked by tests/test_sampled_steps.py).
2. ``--traced``: per strategy, one run under the plugin's own trace capture (as a counting run is taken): its
   judged steps, gap count per step, p99 and widest gap, to set beside the records of (1).
3. ``--rounds``: per strategy, a sampled run (the probe, marks included) at each of ``--interval-ns``, a run with
   the probe's marks alone (no sampler) and a second bare run, each next to a bare run (which goes first
   alternates; the variants' order rotates): wall-time ratios of the region's block, medians with 90% signed-rank
   intervals. ``--budget SECONDS`` stops adding rounds once spent, after at least two per strategy (the rounds
   run so far are reported).

``--interval-ns N[,M...]`` samples every N ns instead of the plugin's interval (for the cost's dependence on it).

Run from the repository root: ``python -m bench.bench_sampled_timeline [--agreement a,b] [--strategies a,b]
[--traced a,b] [--rounds N] [--keep DIR] [--interval-ns N,M]``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from itertools import accumulate
from pathlib import Path
from typing import Any

import torch

from bench.bench_pm_sampling import DeviceRecords, truth
from bench.bench_timeline_capture import NEW_TOKENS, paired_rounds, ratio_interval, shared_deadlines, timed, workload
from examples.strategies import STRATEGIES
from pytest_syncguard.analysis import gaps, trace_file
from pytest_syncguard.analysis.sampled import StepEvents
from pytest_syncguard.budgets import GuardOptions
from pytest_syncguard.instruments import judge_sampled_region
from pytest_syncguard.probes import cupti, sampler
from pytest_syncguard.probes.patches import Patches
from pytest_syncguard.probes.pm_sampling import Samples
from pytest_syncguard.probes.sampler import ACTIVE_CYCLES, ELAPSED_CYCLES, SAMPLER, SampledRegion
from pytest_syncguard.probes.timeline import TIMELINE

#: Strategies whose steps are graph replays; the others' are forward calls.
GRAPH_LOOPS = ("cuda_graph", "static_compiled")


@contextmanager
def forward_steps(model: torch.nn.Module, name: str) -> Iterator[None]:
    """Each forward call of ``model`` marks a step in the sampled region, as under ``measure(model=...)``."""
    handle = None if name in GRAPH_LOOPS else model.register_forward_pre_hook(SAMPLER.forward_step)
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()


def agreement(
    name: str, fn: Callable[[], object], model: Any, records: DeviceRecords, args: argparse.Namespace, keep: bool
) -> None:
    with SAMPLER.arming() as regions, records.recording(), forward_steps(model, name), SAMPLER.region(1):
        fn()
    if 1 not in regions:
        print(f"{name:<16} not sampled: {SAMPLER.problem}", flush=True)
        return
    region = regions[1]
    judged = judge_sampled_region(region, args.warmup_steps)
    timeline = judged.timeline
    begin = judged.steps.judged_from(args.warmup_steps) if judged.steps is not None else region.window[0]
    ops = sorted(op for op in records.ops if begin <= op[0] <= region.window[1])
    if timeline is None or not ops:
        print(f"{name:<16} no timeline: {judged.problem}", flush=True)
        return
    busy, true_gaps = truth(ops)
    stat = gaps.gap_stat
    plugin = (timeline.busy_us, timeline.gap_stat("p99"), timeline.gap_stat("max"))
    records_ = (busy, stat(true_gaps, "p99"), stat(true_gaps, "max"))
    assert region.events is not None
    print(
        f"{name:<16} {timeline.judged_steps} steps judged after {timeline.warmup_steps} ({region.events.steps_from}); "
        f"busy {plugin[0]:.0f} / {records_[0]:.0f} us ({plugin[0] / records_[0] - 1:+.1%}); p99 gap {plugin[1]:.1f} / "
        f"{records_[1]:.1f} us; max gap {plugin[2]:.1f} / {records_[2]:.1f} us; gaps {len(timeline.gaps_us)} / "
        f"{len(true_gaps)}; span {timeline.span_us:.0f} / {(ops[-1][1] - ops[0][0]) / 1e3:.0f} us "
        "(plugin / records)",
        flush=True,
    )
    if keep and args.keep is not None:
        kept(args.keep / f"{name}.json.gz", region, records.ops, begin + int(args.keep_ms * 1e6))


def traced(name: str, fn: Callable[[], object], model: Any, warmup_steps: int) -> None:
    """One run under the plugin's trace capture (a counting run's timeline): its judged steps and gaps."""
    hooks = [] if name in GRAPH_LOOPS else TIMELINE.step_hooks(model)
    try:
        with TIMELINE.capturing() as files, TIMELINE.region(1):
            fn()
    finally:
        for hook in hooks:
            hook.remove()
    try:
        trace = trace_file.load(files[0])
        timeline = gaps.analyze(trace, window=gaps.regions(trace)[1], warmup_steps=warmup_steps)
    finally:
        for path in files:
            path.unlink(missing_ok=True)
    if timeline is None:
        print(f"{name:<16} traced: no device work", flush=True)
        return
    count = len(timeline.gaps_us)
    print(
        f"{name:<16} traced: {timeline.judged_steps} steps judged after {timeline.warmup_steps} "
        f"({timeline.steps_from}); gaps {count} ({count / max(timeline.judged_steps, 1):.1f} per step); p99 gap "
        f"{timeline.gap_stat('p99'):.1f} us; max gap {timeline.gap_stat('max'):.1f} us; busy {timeline.busy_us:.0f} us",
        flush=True,
    )


def kept(path: Path, region: SampledRegion, ops: list[tuple[int, int, str]], until: int) -> None:
    """The region's samples up to ``until`` (ns), its step events and the device records that start before it."""
    samples = region.samples
    rows = [i for i, start in enumerate(samples.start_ns) if region.window[0] <= start < until]
    kept = replace(region, samples=samples.picked(rows), window=(region.window[0], min(until, region.window[1])))
    write_kept(path, kept, [op for op in ops if op[0] < until])
    print(f"    kept {path} ({len(rows)} samples)", flush=True)


def write_kept(path: Path, region: SampledRegion, ops: Sequence[tuple[int, int, str]]) -> None:
    """A kept run as gzipped JSON: each sample's start as a step from the one before, its length, its active and
    elapsed cycles; the region's window and step events; the device records (ns, sorted; each with its label,
    ``bench_pm_sampling.RECORD_LABELS``)."""
    samples = region.samples
    assert region.events is not None
    starts = samples.start_ns
    data = {
        "window_ns": list(region.window),
        "first_ns": starts[0],
        "start_step_ns": [b - a for a, b in zip((starts[0], *starts[:-1]), starts, strict=True)],
        "length_ns": [b - a for a, b in zip(starts, samples.end_ns, strict=True)],
        "active": [int(v) for v in samples.column(ACTIVE_CYCLES)],
        "elapsed": [int(v) for v in samples.column(ELAPSED_CYCLES)],
        "marker_end_us": region.events.marker_end_us,
        "steps_us": list(region.events.steps_us),
        "steps_from": region.events.steps_from,
        "interval_ns": samples.interval_ns,
        "device_ops_ns": [[a, b] for a, b, _ in sorted(ops)],
        "device_ops_label": [label for _, _, label in sorted(ops)],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", compresslevel=9) as sink:
        json.dump(data, sink, separators=(",", ":"))


def read_kept(path: Path) -> tuple[SampledRegion, list[tuple[int, int, str]]]:
    """A run written by :func:`write_kept`: the sampled region, as the probe left it, and the device records."""
    with gzip.open(path, "rt") as source:
        data = json.load(source)
    starts = tuple(accumulate(data["start_step_ns"], initial=data["first_ns"]))[1:]
    ends = tuple(start + length for start, length in zip(starts, data["length_ns"], strict=True))
    values = tuple(zip(data["active"], data["elapsed"], strict=True))
    samples = Samples.of_rows(
        (ACTIVE_CYCLES, ELAPSED_CYCLES), starts, ends, values, interval_ns=data.get("interval_ns", 0)
    )
    events = StepEvents(data["marker_end_us"], tuple(data["steps_us"]), data["steps_from"])
    region = SampledRegion(samples, (data["window_ns"][0], data["window_ns"][1]), events)
    ops = zip(data["device_ops_ns"], data["device_ops_label"], strict=True)
    return region, [(a, b, label) for (a, b), label in ops]


def overhead(
    name: str, fn: Callable[[], object], model: Any, rounds: int, deadline: float, intervals: Sequence[int]
) -> None:
    """Each variant (sampled at each interval, the probe's marks alone, bare again) next to a bare run: ratios of
    the block's time. The sampler is armed for each sampled run alone, as a test's call arms it."""
    variants = [f"sampled {ns} ns" for ns in intervals] + ["marks only", "bare again"]
    problems: list[str] = []

    def run(variant: str) -> float:
        if variant.startswith("sampled"):
            sampler.INTERVAL_NS = int(variant.split()[1])
            with SAMPLER.arming(), forward_steps(model, name), SAMPLER.region(1):
                wall = timed(fn)
            if SAMPLER.problem:
                problems.append(SAMPLER.problem)
            return wall
        if variant == "marks only":
            with marks_only(model, name):
                return timed(fn)
        return timed(fn)

    walls, ratios = paired_rounds(variants, run, rounds, deadline)
    median = statistics.median
    cells = " | ".join(f"{v} {median(ratios[v]):.3f} ({ratio_interval(ratios[v])})" for v in variants)
    print(
        f"{name:<16} {len(ratios['bare again'])} rounds, bare {median(walls['bare']) * 1e3:7.1f} ms | {cells}"
        + (f" | sampler: {problems[0]}" if problems else ""),
        flush=True,
    )


@contextmanager
def marks_only(model: torch.nn.Module, name: str) -> Iterator[None]:
    """What the probe adds to the loop besides the sampler: the marker kernel and a CUDA event per step (forward
    calls, or graph replays through the same patch)."""
    replays = Patches()
    SAMPLER._clock = sampler._StepClock()
    replays.patch(torch.cuda.CUDAGraph, "replay", SAMPLER._marking_replays)
    try:
        with forward_steps(model, name):
            yield
    finally:
        replays.undo()
        SAMPLER._clock = None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agreement", default=",".join(STRATEGIES))
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--budget", type=float, default=1e9, help="seconds after which no round is started")
    parser.add_argument("--warmup-steps", type=int, default=GuardOptions().warmup_steps)
    parser.add_argument("--traced", default="", help="strategies run once under the plugin's trace capture, last")
    parser.add_argument("--keep", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=1, help="agreement runs per strategy (the first is kept)")
    parser.add_argument("--keep-ms", type=float, default=60.0)
    parser.add_argument(
        "--interval-ns",
        default=str(sampler.INTERVAL_NS),
        help="the PM sampler's intervals (comma-separated) for the cost; the agreement uses the first",
    )
    args = parser.parse_args()
    intervals = [int(ns) for ns in args.interval_ns.split(",")]
    sampler.INTERVAL_NS = intervals[0]
    if not torch.cuda.is_available():
        raise SystemExit("bench_sampled_timeline needs CUDA")
    began = time.monotonic()
    model, prompt, eos = workload()
    uuid = str(torch.cuda.get_device_properties(0).uuid)[:8]
    print(f"machine: {torch.cuda.get_device_name()} (GPU-{uuid}); torch {torch.__version__}", flush=True)
    runs = {n: (lambda s=STRATEGIES[n]: s(model, prompt, NEW_TOKENS, eos)) for n in STRATEGIES}
    records = DeviceRecords(cupti.library() or cupti.load())
    for name in [n for n in args.agreement.split(",") if n]:
        runs[name]()  # warm-up (static_compiled compiles here)
        for repeat in range(args.repeat):
            agreement(name, runs[name], model, records, args, keep=repeat == 0)
    names = [n for n in args.strategies.split(",") if n]
    for name, deadline in shared_deadlines(names, args.budget, began):
        overhead(name, runs[name], model, args.rounds, deadline, intervals)
    for name in [n for n in args.traced.split(",") if n]:  # last: a capture detaches CUPTI when it stops
        runs[name]()
        traced(name, runs[name], model, args.warmup_steps)


if __name__ == "__main__":
    main()
