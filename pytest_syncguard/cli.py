"""The ``syncguard`` command: ``report`` (JUnit files against baselines -> Markdown/JSON verdicts),
``comment`` (one sticky PR comment per GPU model through ``gh``), ``trace`` (gap analysis of any PyTorch
profiler trace), ``baselines`` (show or diff baseline files) and ``device`` (this machine's slug and
fingerprint)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from .comment import GH_TIMEOUT_S
from .files import write_atomically


def _trace(args: argparse.Namespace) -> int:
    from .analysis import gaps, trace_file
    from .report.terminal import gap_lines

    try:
        trace = trace_file.load(args.file)
    except trace_file.TraceError as exc:
        print(f"syncguard trace: {exc}", file=sys.stderr)
        return 2
    timeline = gaps.analyze(trace, warmup_steps=args.warmup_steps, top=args.top)
    statistics = {}
    if timeline is not None:
        statistics = {"busy_fraction": timeline.busy_fraction, "max_gap_us": timeline.gap_stat("max"),
                      "p99_gap_us": timeline.gap_stat("p99")}  # fmt: skip
    if args.json:
        data: dict[str, object] = {"file": args.file, "events": trace.events_read, "timeline": None}
        if timeline is not None:
            data["timeline"] = {**timeline.summary().to_dict(), **{k: round(v, 5) for k, v in statistics.items()}}
        print(json.dumps(data, indent=2, allow_nan=False))
        return 0
    print(f"{args.file}: {trace.events_read} events, {len(trace.gpu_ops)} device ops")
    if timeline is None:
        print("no device activity (kernels, memcpy, memset) in this trace")
        return 0
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


def _device(args: argparse.Namespace) -> int:
    from .environment import fingerprint, slug_for

    device = "cuda" if _cuda() else "cpu"
    data = {"slug": slug_for(device), **fingerprint(device)}
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print("\n".join(f"{key}: {'-' if value is None else value}" for key, value in data.items()))
    return 0


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _report(args: argparse.Namespace) -> int:
    from .baselines import BaselineError
    from .report.junit import JUnitError
    from .report.markdown import render
    from .report.run import compare_run

    paths = [Path(p) for p in args.junit]
    try:
        run = compare_run(paths, Path(args.baselines) if args.baselines else None, args.tolerance)
    except (JUnitError, BaselineError) as exc:
        print(f"syncguard report: {exc}", file=sys.stderr)
        return 2
    if not run.cases:
        print(f"syncguard report: no measured test in {', '.join(map(str, paths))} (run pytest with --syncguard "
              "and --junitxml)", file=sys.stderr)  # fmt: skip
        return 2
    if args.json:
        write_atomically(Path(args.json), json.dumps(run.to_dict(), indent=2, sort_keys=True) + "\n")
    full_path = Path(args.markdown).with_suffix(".full.md") if args.markdown else None
    text, truncated = render(run, full_report=full_path.name if full_path else None)
    if args.markdown:
        write_atomically(Path(args.markdown), text)
        if truncated and full_path is not None:
            write_atomically(full_path, render(run, limit=sys.maxsize)[0])
    else:
        print(text, end="")
    regressions = len(run.with_status("regression"))
    print(
        f"syncguard report: {len(run.cases)} tests, {regressions} regressions"
        + (f"; markdown truncated, full report in {full_path}" if truncated else ""),
        file=sys.stderr,
    )
    return 1 if args.fail_on_regression and regressions else 0


def _comment(args: argparse.Namespace) -> int:
    from .comment import CommentError, post

    try:
        body = Path(args.body_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"syncguard comment: cannot read --body-file {args.body_file} as UTF-8 text: {exc}", file=sys.stderr)
        return 2
    try:
        posted = post(body, args.pr, key=args.key, repo=args.repo, author=args.author, timeout=args.gh_timeout)
    except CommentError as exc:
        print(f"syncguard comment: {exc}", file=sys.stderr)
        return 2
    print(f"syncguard comment: {posted.action} comment {posted.comment_id} {posted.url}".rstrip())
    return 0


def _baselines(args: argparse.Namespace) -> int:
    from .baselines import BaselineError, read
    from .metrics import metric as metric_named

    try:
        files = [read(Path(f)) for f in args.files]
    except BaselineError as exc:
        print(f"syncguard baselines: {exc}", file=sys.stderr)
        return 2
    for name, baseline in zip(args.files, files, strict=True):
        if baseline is None:
            print(f"syncguard baselines: {name}: no such file", file=sys.stderr)
            return 2
    if len(files) == 1:
        only = files[0]
        assert only is not None
        print(f"{only.path}: device {only.device}, {len(only.tests)} tests")
        for key, value in sorted(only.fingerprint.items()):
            print(f"  {key}: {value}")
        for nodeid, entry in sorted(only.tests.items()):
            metrics = ", ".join(
                f"{m} {spec.format(v) if (spec := metric_named(m)) else v}" for m, v in sorted(entry.items())
            )
            print(f"{nodeid}: {metrics}")
        return 0
    old, new = files
    assert old is not None and new is not None
    changed = 0
    for nodeid in sorted(set(old.tests) | set(new.tests)):
        a, b = old.tests.get(nodeid), new.tests.get(nodeid)
        if a is None or b is None:
            print(f"{'+' if a is None else '-'} {nodeid}")
            changed += 1
            continue
        for metric in sorted(set(a) | set(b)):
            if a.get(metric) != b.get(metric):
                print(f"~ {nodeid}: {metric} {a.get(metric)} -> {b.get(metric)}")
                changed += 1
    print(f"{changed} differences")
    return 0


def _tolerance(text: str) -> float:
    from .budgets import parse_tolerance

    try:
        return parse_tolerance(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"expected a pull request number, got {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value < math.inf):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="syncguard", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    report = commands.add_parser("report", help="JUnit files of a run against baselines: Markdown and JSON verdicts")
    report.add_argument("junit", nargs="+", help="JUnit XML files written by pytest --syncguard --junitxml")
    report.add_argument("--baselines", metavar="DIR", help="compare with this baselines folder (default: with the "
                        "values the run compared with)")  # fmt: skip
    report.add_argument("--markdown", metavar="OUT", help="write the PR comment here (else print it); when cut to "
                        "GitHub's limit the full report goes to OUT with suffix .full.md")  # fmt: skip
    report.add_argument("--json", metavar="OUT", help="write the verdicts as JSON")
    report.add_argument("--tolerance", type=_tolerance, default=None, help="relative tolerance of noisy metrics "
                        "(default: each test's own, as the run recorded it)")  # fmt: skip
    report.add_argument("--fail-on-regression", action="store_true", help="exit 1 when a test regressed")
    report.set_defaults(run=_report)

    comment = commands.add_parser("comment", help="create or update this tool's PR comment through gh")
    comment.add_argument("--pr", type=_positive, required=True, help="pull request number")
    comment.add_argument("--body-file", required=True, help="Markdown body (from syncguard report --markdown)")
    comment.add_argument("--repo", help="OWNER/NAME (default: gh's repository of the working directory)")
    comment.add_argument("--key", default="syncguard", help="one comment per key, e.g. the GPU's slug")
    comment.add_argument("--author", help="the login gh posts as (default: asked from gh)")
    comment.add_argument("--gh-timeout", type=_seconds, default=GH_TIMEOUT_S, metavar="SECONDS",
                         help=f"give up a gh call that takes longer (default {GH_TIMEOUT_S:g})")  # fmt: skip
    comment.set_defaults(run=_comment)

    trace = commands.add_parser("trace", help="idle gaps, busy fraction and gap causes of a profiler trace")
    trace.add_argument("file", help="a Chrome/Perfetto JSON trace from torch.profiler (.json or .json.gz)")
    trace.add_argument("--json", action="store_true", help="print the analysis as JSON")
    trace.add_argument("--warmup-steps", type=int, default=0, help="leave out the first N steps (default 0)")
    trace.add_argument("--top", type=int, default=10, help="how many of the largest gaps to attribute")
    trace.set_defaults(run=_trace)

    baselines = commands.add_parser("baselines", help="show a baseline file, or the differences of two")
    baselines.add_argument("files", nargs="+", metavar="FILE", help="one file to show, or OLD NEW to compare")
    baselines.set_defaults(run=_baselines)

    device = commands.add_parser("device", help="this machine's baseline slug and environment fingerprint")
    device.add_argument("--json", action="store_true", help="print as JSON")
    device.set_defaults(run=_device)
    args = parser.parse_args(argv)
    if getattr(args, "warmup_steps", 0) < 0 or getattr(args, "top", 1) < 0:
        parser.error("--warmup-steps and --top must be >= 0")
    if args.command == "baselines" and len(args.files) > 2:
        parser.error("baselines: give one file to show or two to compare")
    return int(args.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
