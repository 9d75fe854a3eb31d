"""The ``syncguard`` command: ``trace`` (gap analysis of any PyTorch profiler trace) and ``device`` (this
machine's device name and slug)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence

from .analysis import gaps, trace_file
from .report.terminal import gap_lines


def device_slug(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``; the baseline file name of a device."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def _trace(args: argparse.Namespace) -> int:
    try:
        trace = trace_file.load(args.file)
    except trace_file.TraceError as exc:
        print(f"syncguard trace: {exc}", file=sys.stderr)
        return 2
    timeline = gaps.analyze(trace, warmup_steps=args.warmup_steps, top=args.top)
    if args.json:
        data = {"file": args.file, "events": trace.events_read, "timeline": timeline.to_dict() if timeline else None}
        print(json.dumps(data, indent=2))
        return 0
    print(f"{args.file}: {trace.events_read} events, {len(trace.gpu_ops)} device ops")
    if timeline is None:
        print("no device activity (kernels, memcpy, memset) in this trace")
        return 0
    for line in gap_lines(timeline.to_dict()):
        print(line)
    for stream in timeline.streams:
        print(
            f"  stream {stream.stream}: {stream.ops} ops, busy {stream.busy_fraction:.3f}, "
            f"max gap {stream.max_gap_us:.1f} us"
        )
    return 0


def _device(args: argparse.Namespace) -> int:
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        slug = device_slug(name)
    else:
        name, slug = "cpu", "cpu"
    cuda = torch.version.cuda or "-"
    print(f"device: {name}\nslug: {slug}\ntorch: {torch.__version__}\ncuda: {cuda}\npython: {sys.version.split()[0]}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="syncguard", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    trace = commands.add_parser("trace", help="idle gaps, busy fraction and gap causes of a profiler trace")
    trace.add_argument("file", help="a Chrome/Perfetto JSON trace from torch.profiler (.json or .json.gz)")
    trace.add_argument("--json", action="store_true", help="print the analysis as JSON")
    trace.add_argument("--warmup-steps", type=int, default=0, help="leave out the first N steps (default 0)")
    trace.add_argument("--top", type=int, default=10, help="how many of the largest gaps to attribute")
    trace.set_defaults(run=_trace)
    device = commands.add_parser("device", help="this machine's device name, baseline slug and versions")
    device.set_defaults(run=_device)
    args = parser.parse_args(argv)
    if getattr(args, "warmup_steps", 0) < 0 or getattr(args, "top", 1) < 0:
        parser.error("--warmup-steps and --top must be >= 0")
    return int(args.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
