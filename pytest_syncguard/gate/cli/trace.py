"""``syncguard trace``: the gap analysis of a PyTorch profiler trace or a kept timeline file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ...analysis import gaps, reliability, trace_file
from ...codec import encode
from ...files import MAX_UNPACKED_BYTES
from ...render.perfetto import TimelineFileError, is_timeline_file, load
from ...render.terminal import gap_lines
from . import options


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    trace = commands.add_parser(
        "trace",
        help="idle gaps, busy fraction and gap causes of a profiler trace, or of a judged timeline the plugin kept",
    )
    trace.add_argument(
        "file",
        help="a Chrome/Perfetto JSON trace from torch.profiler, or a judged timeline "
        "(*.timeline.json.gz); .json or .json.gz",
    )
    trace.add_argument("--json", action="store_true", help="print the analysis as JSON")
    trace.add_argument("--warmup-steps", type=int, default=0, help="leave out the first N steps (default 0)")
    trace.add_argument("--top", type=int, default=10, help="how many of the largest gaps to attribute")
    trace.add_argument(
        "--max-unpacked-mb",
        type=options.megabytes,
        default=MAX_UNPACKED_BYTES >> 20,
        metavar="MB",
        help=f"refuse a file that unpacks to more (default {MAX_UNPACKED_BYTES >> 20})",
    )
    trace.set_defaults(run=run)


def _timeline_file(args: argparse.Namespace) -> int:
    """``syncguard trace`` of a judged timeline the plugin wrote: each region's numbers, from its events."""

    try:
        meta, regions = load(Path(args.file), args.max_unpacked_mb << 20, "--max-unpacked-mb")
    except TimelineFileError as exc:
        print(f"syncguard trace: {exc}", file=sys.stderr)
        return 2
    found = []
    for region in regions:
        t = region.timeline
        statistics = {
            "busy_fraction": t.busy_fraction,
            "max_gap_us": t.gap_stat("max"),
            "p99_gap_us": t.gap_stat("p99"),
        }
        found.append((region, statistics))
    if args.json:
        data = {
            "file": args.file,
            "nodeid": meta["nodeid"],
            "source": meta["source"],
            "regions": [
                {**encode(r.timeline.summary(r.region)), "shown": r.shown, **{k: round(v, 5) for k, v in st.items()}}
                for r, st in found
            ],
        }
        print(json.dumps(data, indent=2, allow_nan=False))
        return 0
    print(f"{args.file}: judged timeline of {meta['nodeid']} ({meta['source']} source), {len(regions)} regions")
    for region, st in found:
        print(f"region {region.region}{' (the one its summary shows)' if region.shown else ''}:")
        summary = region.timeline.summary(region.region)
        for line in gap_lines(summary, st["busy_fraction"], st["max_gap_us"], st["p99_gap_us"]):
            print(f"  {line}")
    return 0


def run(args: argparse.Namespace) -> int:
    if is_timeline_file(Path(args.file)):
        return _timeline_file(args)
    try:
        trace = trace_file.load(args.file, args.max_unpacked_mb << 20, "--max-unpacked-mb")
    except trace_file.TraceError as exc:
        print(f"syncguard trace: {exc}", file=sys.stderr)
        return 2
    # A trace of the plugin's capture carries its sentinel, which is not the loop's work; another profiler's
    # trace is not judged by it.
    sentinel = [r.start for r in trace.ranges if r.name == reliability.SENTINEL_ANNOTATION]
    captured = bool(sentinel)
    window = (float("-inf"), sentinel[-1]) if captured else None
    timeline = gaps.analyze(trace, window=window, warmup_steps=args.warmup_steps, top=args.top)
    problem = (reliability.sentinel_problem(trace) if captured else None) or (timeline and timeline.unreliable)
    if problem:
        if args.json:
            found = {"file": args.file, "events": trace.events_read, "timeline": None, "unreliable": problem}
            print(json.dumps(found, indent=2))
        else:
            print(f"{args.file}: unreliable: {problem}")
        return 1
    statistics = {}
    if timeline is not None:
        statistics = {
            "busy_fraction": timeline.busy_fraction,
            "max_gap_us": timeline.gap_stat("max"),
            "p99_gap_us": timeline.gap_stat("p99"),
        }
    clocks = reliability.clock_problem(trace)
    if args.json:
        data: dict[str, object] = {"file": args.file, "events": trace.events_read, "timeline": None}
        if clocks is not None:
            data["warnings"] = [clocks]
        if timeline is not None:
            data["timeline"] = {**encode(timeline.summary()), **{k: round(v, 5) for k, v in statistics.items()}}
        print(json.dumps(data, indent=2, allow_nan=False))
        return 0
    print(f"{args.file}: {trace.events_read} events, {len(trace.gpu_ops)} device ops")
    if timeline is None:
        steps, _ = gaps.step_starts(trace, window)
        if trace.gpu_ops and steps and args.warmup_steps >= len(steps):
            print(
                f"nothing judged: all {len(steps)} steps are warm-up steps (--warmup-steps {args.warmup_steps}); "
                f"give fewer than {len(steps)}"
            )
            return 2
        print("no device activity (kernels, memcpy, memset) in this trace")
        return 0
    if clocks is not None:
        print(f"warning: {clocks}")
    lines = gap_lines(
        timeline.summary(), statistics["busy_fraction"], statistics["max_gap_us"], statistics["p99_gap_us"]
    )
    for line in lines:
        print(line)
    for stream in timeline.streams:
        print(
            f"  stream {stream.stream}: {stream.ops} ops, busy {stream.busy_fraction:.3f}, "
            f"max gap {stream.max_gap_us:.1f} us"
        )
    return 0
