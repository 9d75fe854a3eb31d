"""``syncguard report``: a run's results against baselines or the history, as Markdown and JSON verdicts."""

from __future__ import annotations

import argparse
from dataclasses import fields

from ..report import ReportRequest, report
from . import options


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    report = commands.add_parser("report", help="a run's results against baselines: Markdown and JSON verdicts")
    report.add_argument(
        "files",
        nargs="+",
        metavar="RESULTS",
        help="results files of pytest --syncguard "
        "--syncguard-json (*.json), or JUnit XML files of --junitxml (without the details that "
        "explain a count's change, nor the environment's differences)",
    )
    report.add_argument(
        "--baselines",
        metavar="DIR",
        help="compare with this baselines folder (default: with the values the run compared with)",
    )
    report.add_argument(
        "--markdown",
        metavar="OUT",
        help="write the PR comment here (else print the whole report); "
        "the full report (every test's rows; the comment counts those that passed unchanged) goes beside it, "
        "OUT with suffix .full.md; the comment is cut to the forge's limit in bytes",
    )
    report.add_argument("--json", metavar="OUT", help="write the verdicts as JSON")
    report.add_argument(
        "--tolerance",
        type=options.tolerance,
        default=None,
        help="relative tolerance of noisy metrics (default: each test's own, as the run recorded it)",
    )
    report.add_argument(
        "--judge-host-timings",
        action="store_true",
        help="judge host timings (time, tokens/s, "
        "gaps, busy) against the baselines too: only where the runner recorded them",
    )
    report.add_argument("--ab", metavar="FILE", help="add this A/B report (syncguard ab --json) to the Markdown")
    report.add_argument(
        "--fail-on-regression",
        action="store_true",
        help="exit 1 when a test regressed, failed a budget or failed otherwise (in the run or on the A/B's head)",
    )
    report.add_argument(
        "--repository",
        metavar="OWNER/NAME",
        help="with --commit: each sync site of a file of this checkout is a link to its line on the forge",
    )
    options.forge_options(report)
    report.add_argument("--commit", metavar="SHA", help="the head commit the run measured (with --repository)")
    report.add_argument(
        "--history",
        metavar="DIR",
        help="judge each GPU model against the default branch's history "
        "in DIR (syncguard history fetch) where it has one; --baselines stands in for the others",
    )
    report.add_argument(
        "--history-unavailable",
        metavar="WHY",
        help="say that the default branch's history could not "
        "be read, and why: the report judges against --baselines and reads ⚠️ at best",
    )
    report.add_argument(
        "--accept",
        metavar="WHY",
        help="this change's regressions are intended, and WHY (a pull request's label, say): they are reported and "
        "do not fail the run with --fail-on-regression; failed budgets and failed tests still do",
    )
    report.add_argument(
        "--base-ref",
        metavar="REF",
        help="judge against this commit's files of --baselines (a pull "
        "request's base): a change cannot loosen its own gate; what the working tree's files loosen "
        "against them is said above the fold",
    )
    report.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    given = {f.name: getattr(args, f.name) for f in fields(ReportRequest)}
    return report(ReportRequest(**{**given, "files": tuple(args.files)}))
