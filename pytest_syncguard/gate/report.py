"""``syncguard report``: a run's results files judged against its baselines or the default branch's history, and
its verdict written as the PR comment's Markdown, as JSON, or printed; what the command line and the comment
workflow (:mod:`.artifact`) both run. No torch here."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..document.ab import read_report
from ..document.file import ResultsError
from ..files import write_atomically
from ..judge.baselines import BaselineError
from ..judge.junit import JUnitError
from ..judge.run import compare_run
from ..judge.verdict import Verdict
from ..render.links import SiteLinks, commit_problem
from ..render.markdown import MARKER_ROOM, render
from .forge.base import CommentError, Forge
from .forge.choice import forge_named
from .outputs import clobbers, path_problem

if TYPE_CHECKING:
    from ..document.ab import ABReport


@dataclass(frozen=True)
class ReportRequest:
    """What a report is asked to do: the options of ``syncguard report`` (docs/reference/cli.md says each)."""

    files: tuple[str, ...]
    baselines: str | None = None
    markdown: str | None = None
    json: str | None = None
    tolerance: float | None = None
    judge_host_timings: bool = False
    ab: str | None = None
    fail_on_regression: bool = False
    repository: str | None = None
    commit: str | None = None
    history: str | None = None
    history_unavailable: str | None = None
    accept: str | None = None
    base_ref: str | None = None
    forge: str | None = None
    server: str | None = None


def _ab_report(path: str | None) -> ABReport | None:
    """The A/B report a ``report --ab`` names (untrusted: validated); None without one."""

    if path is None:
        return None
    try:
        return read_report(Path(path))
    except ValueError as exc:
        raise ValueError(f"--ab {path}: {exc}") from exc


def report(args: ReportRequest) -> int:
    """``syncguard report``: the run of ``args.files`` judged, written as Markdown (and JSON) or printed; the
    verdict's exit status, 2 naming what is wrong with an input or an output."""

    paths = [Path(p) for p in args.files]
    full = str(Path(args.markdown).with_suffix(".full.md")) if args.markdown else None
    outputs = [
        ("--json", args.json, "file"),
        ("--markdown", args.markdown, "file"),
        ("--markdown's full report", full, "file"),
    ]
    inputs = [*(("RESULTS", p) for p in args.files), ("--ab", args.ab)]
    if args.baselines:
        inputs += [("--baselines", str(p)) for p in Path(args.baselines).glob("*.json")]
    problem = path_problem("report", outputs) or clobbers("report", outputs, inputs)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    try:
        forge = forge_named(args.forge, args.server)
    except CommentError as exc:
        print(f"syncguard report: {exc}", file=sys.stderr)
        return 2
    if (wrong := _links_problem(forge, args.repository, args.commit)) is not None:
        print(f"syncguard report: {wrong}", file=sys.stderr)
        return 2
    try:
        ab = _ab_report(args.ab)
    except ValueError as exc:
        print(f"syncguard report: {exc}", file=sys.stderr)
        return 2
    if args.history is not None and not Path(args.history).is_dir():
        print(
            f"syncguard report: --history {args.history}: not a folder (syncguard history fetch makes it)",
            file=sys.stderr,
        )
        return 2
    if args.base_ref is not None and not args.baselines:
        print(
            "syncguard report: --base-ref judges against that commit's files of --baselines DIR: give both",
            file=sys.stderr,
        )
        return 2
    try:
        run = compare_run(
            paths,
            Path(args.baselines) if args.baselines else None,
            args.tolerance,
            args.judge_host_timings,
            base_ref=args.base_ref,
            history=Path(args.history) if args.history else None,
        )
        run.history_unavailable = args.history_unavailable
        run.accepted = args.accept or None
    except (ResultsError, JUnitError, BaselineError) as exc:
        print(f"syncguard report: {exc}", file=sys.stderr)
        return 2
    if not run.cases:
        print(
            f"syncguard report: no measured test in {', '.join(map(str, paths))} (run pytest with --syncguard "
            "and --syncguard-json or --junitxml)",
            file=sys.stderr,
        )
        return 2
    try:
        if args.json:
            write_atomically(Path(args.json), json.dumps(run.to_dict(), indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        print(f"syncguard report: cannot write --json {args.json}: {exc}", file=sys.stderr)
        return 2
    full_path = Path(args.markdown).with_suffix(".full.md") if args.markdown else None
    # Only a comment is cut to the forge's limit: printed, the report is whole (there is no file for the rest).
    limit = forge.body_limit - MARKER_ROOM if args.markdown else sys.maxsize
    links = SiteLinks.of(forge.web(args.repository) if args.repository else None, args.commit, Path.cwd())
    # A comment counts the tests that passed unchanged and leaves their rows to the full report beside it.
    name = full_path.name if full_path else None
    text, truncated = render(run, limit=limit, full_report=name, ab=ab, links=links, every_row=not args.markdown)
    try:
        if args.markdown:
            write_atomically(Path(args.markdown), text)
            if full_path is not None:
                write_atomically(full_path, render(run, limit=sys.maxsize, ab=ab, links=links)[0])
        else:
            print(text, end="")
    except OSError as exc:  # a full disk, a folder gone: nothing half-written is left (write_atomically)
        print(f"syncguard report: cannot write the report: {exc}", file=sys.stderr)
        return 2
    verdict = Verdict.of(run, ab)
    print(
        f"syncguard report: {verdict.sentence()}"
        + (f"; markdown truncated, full report in {full_path}" if truncated else ""),
        file=sys.stderr,
    )
    return verdict.exit_status(args.fail_on_regression)


def _links_problem(forge: Forge, repository: str | None, commit: str | None) -> str | None:
    """What is wrong with ``--repository`` and ``--commit`` (None: both well formed, or neither given)."""
    if repository is None and commit is None:
        return None
    if repository is None or commit is None:
        return "--repository and --commit go together: give both, or neither"
    return forge.repository_problem(repository) or commit_problem(commit)
