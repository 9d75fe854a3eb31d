"""``syncguard ab``: base and head of a change on this runner, in interleaved rounds, and judged."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from ...document.ab import document
from ...files import write_atomically
from ...render.ab import summary_lines
from ...render.markdown import ab_lines
from ..ab.plan import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MIN_EFFECT,
    DEFAULT_PROCESSES,
    DEFAULT_ROUNDS,
    ABInterrupted,
    Plan,
    first_round_of,
    judged_by_baseline,
)
from ..ab.plan import run as run_rounds
from ..ab.sides import ABError
from ..outputs import path_problem
from . import options


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ab = commands.add_parser(
        "ab",
        help="base and head of a change on this runner, in interleaved rounds: counts compared exactly, "
        "timings as head/base with confidence intervals",
        description="Run the pytest arguments given after -- in a checkout of the base and in this directory, "
        "alternating, and judge head against base.",
    )
    where = ab.add_mutually_exclusive_group(required=True)
    where.add_argument("--base", metavar="REF", help="the base commit: a git worktree of it is made and removed")
    where.add_argument("--base-dir", metavar="DIR", help="a checkout of the base, used as it is")
    ab.add_argument(
        "--rounds",
        type=options.rounds,
        default=DEFAULT_ROUNDS,
        help=f"the most rounds of a test (default "
        f"{DEFAULT_ROUNDS}); a test whose verdict more rounds cannot change is settled: held test by test, "
        "from its 4th round with 2 pairs of processes (3rd with one: Student's t until a pair has 6, then "
        "the signed-rank interval), else from the 6th (a 95%% signed-rank interval needs 6)",
    )
    ab.add_argument(
        "--processes",
        type=options.pairs,
        default=DEFAULT_PROCESSES,
        metavar="N",
        help="warm pytests per "
        f"side for rounds held test by test (default {DEFAULT_PROCESSES}): the pairs run the rounds in "
        "turn and a timing is called a change only where every pair's interval calls it, so that a "
        "process's own offset is not read as one (1: one pair, as before)",
    )
    ab.add_argument(
        "--time-budget",
        type=options.seconds,
        default=None,
        metavar="SECONDS",
        help="start no round that "
        "would end later than this after the start, at what the last round took for the tests still "
        "running",
    )
    ab.add_argument(
        "--min-effect",
        type=options.effect,
        default=None,
        metavar="FRACTION",
        help="the smallest relative change judged a regression or improvement (default: each "
        f"metric's own: device time 0.01, host timings {DEFAULT_MIN_EFFECT})",
    )
    ab.add_argument(
        "--confidence",
        type=options.probability,
        default=DEFAULT_CONFIDENCE,
        help=f"of the intervals (default {DEFAULT_CONFIDENCE})",
    )
    ab.add_argument(
        "--out", default="syncguard-ab", metavar="DIR", help="each round's results and log (default syncguard-ab/)"
    )
    ab.add_argument("--json", metavar="OUT", help="write the A/B report as JSON (for syncguard report --ab)")
    ab.add_argument("--markdown", metavar="OUT", help="write the A/B report as Markdown")
    ab.add_argument(
        "--timeout",
        type=options.seconds,
        default=3600.0,
        metavar="SECONDS",
        help="give up a side's start or a round's run that takes longer (default 3600)",
    )
    ab.add_argument(
        "--fresh-processes",
        action="store_true",
        help="a new pytest for each side in each round, "
        "instead of one per side kept warm across the rounds: for a change whose effect is once per "
        "process (import, compilation, the first run) or sides that cannot share the device",
    )
    ab.add_argument(
        "--no-host-timings",
        dest="host_timings",
        action="store_false",
        help="judge counts and "
        "device-side metrics only (device time, memory): host timings (time, tokens/s, gaps, busy "
        "fraction) are neither judged nor keep a test running",
    )
    ab.add_argument(
        "--timed-runs",
        type=options.timed_runs,
        default=None,
        metavar="N",
        help="timed runs of each test's "
        "measure() after its traced run, in each round after the first (default: its own repeat; 0: the "
        "traced run alone, which gives the device time); the rounds make the interval",
    )
    ab.add_argument(
        "--skip-judged",
        metavar="RESULTS",
        help="the suite's JSON results (pytest --syncguard-json): "
        "leave out the tests whose device time they judged against a baseline (the A/B then settles "
        "only what no baseline could)",
    )
    ab.add_argument(
        "--head-results",
        metavar="RESULTS",
        help="the suite's JSON results of this same head on this runner (pytest --syncguard-json): they are the "
        "head's first round, counts and budgets included, not run again",
    )
    ab.add_argument("--fail-on-regression", action="store_true", help="exit 1 when a test regressed")
    ab.add_argument("pytest_args", nargs="*", metavar="-- PYTEST_ARGS", help="what each round runs")
    ab.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not args.pytest_args:
        print("syncguard ab: give the pytest arguments after --, e.g. -- tests/test_speed.py", file=sys.stderr)
        return 2
    paths = [
        ("--json", args.json, "file"),
        ("--markdown", args.markdown, "file"),
        ("--out", args.out, "folder"),
        ("--base-dir", args.base_dir, "checkout"),
    ]
    if (problem := path_problem("ab", paths)) is not None:
        print(problem, file=sys.stderr)
        return 2
    judged, head_first = None, None
    option, value = "", ""
    try:
        slug = _runner_slug() if args.skip_judged or args.head_results else None
        if args.skip_judged:
            option, value = "--skip-judged", args.skip_judged
            judged = judged_by_baseline(Path(value), slug)
        if args.head_results:
            option, value = "--head-results", args.head_results
            head_first = first_round_of(Path(value), slug)
    except ValueError as exc:
        print(f"syncguard ab: {option} {value}: {exc}" if option else f"syncguard ab: {exc}", file=sys.stderr)
        return 2
    try:
        report = run_rounds(
            base_ref=args.base,
            base_dir=Path(args.base_dir) if args.base_dir else None,
            head=Path.cwd(),
            pytest_args=args.pytest_args,
            plan=Plan(
                args.rounds,
                args.min_effect,
                args.confidence,
                args.time_budget,
                args.timed_runs,
                args.host_timings,
                args.processes,
            ),
            out=Path(args.out),
            timeout=args.timeout,
            fresh_processes=args.fresh_processes,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
            judged=judged,
            head_first=head_first,
        )
    except ABError as exc:
        print(f"syncguard ab: {exc}", file=sys.stderr)
        return 2
    except ABInterrupted as exc:
        print("\n".join(exc.lines()), file=sys.stderr, flush=True)
        return exc.exit_status
    if args.json:
        write_atomically(Path(args.json), json.dumps(document(report), indent=2, sort_keys=True) + "\n")
    if args.markdown:
        write_atomically(Path(args.markdown), "\n".join(ab_lines(report)) + "\n")
    print("\n".join(summary_lines(report)))
    return 1 if args.fail_on_regression and report.regressions else 0


def _runner_slug() -> str:
    """This runner's device slug, asked of a ``syncguard device`` process (this one imports no torch)."""

    done = subprocess.run(
        [sys.executable, "-m", "pytest_syncguard.gate.cli", "device", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    try:
        return str(json.loads(done.stdout)["slug"])
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"cannot tell this runner's device (syncguard device: {done.stderr.strip()[:200]})") from None
