"""The ``syncguard`` command: ``report`` (a run's results against baselines -> Markdown/JSON verdicts),
``comment`` (one sticky PR comment per GPU model through ``gh``), ``trace`` (gap analysis of any PyTorch
profiler trace), ``baselines`` (show or diff baseline files), ``device`` (this machine's slug and
fingerprint) and ``ab`` (base and head of a change run in interleaved rounds on this runner, and judged)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ..codec import encode
from ..document.ab import MAX_PROCESSES
from ..files import MAX_UNPACKED_BYTES, write_atomically
from ..words import plural
from .forge.github import GH_TIMEOUT_S
from .outputs import clobbers, path_problem

#: The most timed runs a test's measure() makes in an A/B round (each run is a whole generation).
MAX_TIMED_RUNS = 1000
T = TypeVar("T", int, float)

if TYPE_CHECKING:
    from ..judge.baselines import Baseline
    from ..judge.history import History


def _timeline_file(args: argparse.Namespace) -> int:
    """``syncguard trace`` of a judged timeline the plugin wrote: each region's numbers, from its events."""
    from ..render.perfetto import TimelineFileError, load
    from ..render.terminal import gap_lines

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


def _trace(args: argparse.Namespace) -> int:
    from ..analysis import gaps, reliability, trace_file
    from ..render.perfetto import is_timeline_file
    from ..render.terminal import gap_lines

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


def _device(args: argparse.Namespace) -> int:
    from ..environment import fingerprint, slug_for

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


def _ab(args: argparse.Namespace) -> int:
    from ..document.ab import document
    from ..render.ab import summary_lines
    from ..render.markdown import ab_lines
    from .ab.plan import ABInterrupted, Plan, first_round_of, judged_by_baseline, run
    from .ab.sides import ABError

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
        report = run(
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
    import subprocess

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


def _report(args: argparse.Namespace) -> int:
    from dataclasses import fields

    from .report import ReportRequest, report

    options = {f.name: getattr(args, f.name) for f in fields(ReportRequest)}
    return report(ReportRequest(**{**options, "files": tuple(args.files)}))


def _comment(args: argparse.Namespace) -> int:
    from .forge.base import CommentError
    from .forge.choice import comments_of, forge_named
    from .forge.comment import post

    try:
        body = Path(args.body_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"syncguard comment: cannot read --body-file {args.body_file} as UTF-8 text: {exc}", file=sys.stderr)
        return 2
    try:
        forge = forge_named(args.forge, args.server)
        comments = comments_of(forge, args.timeout)
        posted = post(body, args.pr, key=args.key, forge=forge, comments=comments, repo=args.repo, author=args.author)
    except CommentError as exc:
        print(f"syncguard comment: {exc}", file=sys.stderr)
        return 2
    print(f"syncguard comment: {posted.action} comment {posted.comment_id} {posted.url}".rstrip())
    return 0


def _post_artifact(args: argparse.Namespace) -> int:
    from .artifact import ArtifactError, post_artifact

    try:
        post_artifact(
            Path(args.artifact),
            args.repo,
            args.head_sha,
            baselines=Path(args.baselines),
            work=Path(args.work or tempfile.mkdtemp(prefix="syncguard-")),
            approval_label=args.approval_label,
        )
    except ArtifactError as exc:
        print(f"syncguard post-artifact: {exc}", file=sys.stderr)
        return 1
    return 0


def _baselines(args: argparse.Namespace) -> int:
    from ..judge.baselines import BaselineError, read, reset_history

    if args.record:
        return _record(args)
    if args.reset_history is not None:
        if len(args.files) != 1:
            print("syncguard baselines: --reset-history takes one FILE", file=sys.stderr)
            return 2
        try:
            emptied = reset_history(Path(args.files[0]), args.reset_history)
        except BaselineError as exc:
            print(f"syncguard baselines: {exc}", file=sys.stderr)
            return 2
        print(f"syncguard baselines: {args.files[0]}: emptied the history of {emptied} tests")
        return 0
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
            _show_entry(nodeid, entry, only)
        return 0
    old, new = files
    assert old is not None and new is not None
    return _judge_baselines(old, new)


def _record(args: argparse.Namespace) -> int:
    """``syncguard baselines DIR --record RESULTS...``: a finished run's results written into DIR's baselines."""
    from ..document.file import ResultsError, read_all
    from ..judge.baselines import BaselineError, path_for, record

    if len(args.files) != 1 or Path(args.files[0]).is_file():
        given = Path(args.files[0])
        hint = f": give its folder, `syncguard baselines {given.parent} --record ...`" if given.is_file() else ""
        print(
            f"syncguard baselines: --record writes into a baselines folder (one file per GPU model, named by its "
            f"slug), not into {' '.join(args.files)}{hint}",
            file=sys.stderr,
        )
        return 2
    directory = Path(args.files[0])
    try:
        results = read_all(Path(path) for path in args.record)
    except ResultsError as exc:
        print(f"syncguard baselines: {exc}", file=sys.stderr)
        return 2
    unnamed = [t.nodeid for t in results if not t.device_slug]
    if unnamed:
        why = "the results name no device (written before results carried their device's slug): run them again"
        print(f"syncguard baselines: NOT recorded: {', '.join(unnamed)}: {why}", file=sys.stderr)
        return 2
    status = 0
    try:
        recorded = list(record(results, lambda t: path_for(directory, t.device_slug), args.host))
    except BaselineError as exc:
        print(f"syncguard baselines: NOT recorded: {exc}", file=sys.stderr)
        return 2
    for problem, written in recorded:
        if problem is not None:
            print(f"syncguard baselines: NOT recorded: {problem}", file=sys.stderr)
            status = 2
            continue
        print(f"syncguard baselines: wrote {written.entries} entries to {written.path}")
        for name in written.restarted:
            print(f"syncguard baselines: history started again (the value moved beyond its tolerance): {name}")
    return status


def _show_entry(nodeid: str, entry: Mapping[str, float], baseline: Baseline) -> None:
    """A test's entry, and under it each calibrated metric's recordings with the tolerance their spread sets."""
    from ..judge.comparison import tolerance_of
    from ..metrics import metric as metric_named

    metrics = ", ".join(f"{m} {spec.format(v) if (spec := metric_named(m)) else v}" for m, v in sorted(entry.items()))
    print(f"{nodeid}: {metrics}")
    spreads = baseline.spreads(nodeid)
    for name, recordings in sorted(baseline.history.get(nodeid, {}).items()):
        spec = metric_named(name)
        values = ", ".join(
            f"{spec.format(r.value) if spec else r.value}{f' ({r.host})' if r.host else ''}" for r in recordings
        )
        within = tolerance_of(name, None, spreads[name])
        print(f"    {name} history: {values}; {spreads[name].describe()}: tolerance {within:.1%}")


def _judge_baselines(old: Baseline, new: Baseline) -> int:
    """Each test of NEW against its entry in OLD by the one comparison the gate uses (counts exactly, device-side
    metrics within their tolerance, host timings shown but not judged), with what explains a count's change.
    A baseline value is a recorded median, compared as one."""
    from ..environment import fingerprint_changes
    from ..judge.comparison import MIN_RUNS, compare
    from ..metrics import Metrics

    changed = 0
    if old.device != new.device:
        print(
            f"warning: {old.path} is the baseline of {old.device}, {new.path} of {new.device}: another GPU model's "
            "device time and memory are not comparable; counts are"
        )
    for key, (was, now) in fingerprint_changes(old.fingerprint, new.fingerprint).items():
        print(f"environment: {key} {was} -> {now}")
    statuses: dict[str, int] = {}
    for nodeid in sorted(set(old.tests) | set(new.tests)):
        a, b = old.tests.get(nodeid), new.tests.get(nodeid)
        if a is None or b is None:
            print(f"{'+' if a is None else '-'} {nodeid}")
            changed += 1
            continue
        comparison = compare(
            a,
            Metrics(b, dict.fromkeys(b, MIN_RUNS)),
            device=new.device,
            file=str(new.path),
            tolerance=None,
            details=(old.details.get(nodeid), new.details.get(nodeid)),
            spreads=old.spreads(nodeid),
        )
        moved = [c for c in comparison.changes if c.old != c.new]
        if not moved:
            continue
        changed += len(moved)
        statuses[comparison.status] = statuses.get(comparison.status, 0) + 1
        print(f"~ {nodeid}: {comparison.status}")
        for change in moved:
            print(f"    {change.status}: {change.describe()}")
        for line in comparison.explanation.lines():
            print(f"    {line}")
    tally = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
    print(f"{changed} differences" + (f" (tests: {tally})" if tally else ""))
    return 0


def _tolerance(text: str) -> float:
    from ..metrics import parse_tolerance

    try:
        return parse_tolerance(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _whole(text: str) -> int:
    """A whole number written in ASCII digits alone (no sign, no space, no other script's digits)."""
    if not (text.isascii() and text.isdigit()):
        raise ValueError(text)
    return int(text)


def _bounded(convert: Callable[[str], T], accept: Callable[[T], bool], expected: str) -> Callable[[str], T]:
    """An option's type: ``convert`` of its text where ``accept`` takes the value, else an argparse error saying what
    was ``expected`` and what was given. The one way every number option of the command is checked."""

    def parse(text: str) -> T:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


_probability = _bounded(float, lambda v: 0.5 <= v < 1, "a confidence from 0.5 to below 1 (e.g. 0.95)")
_effect = _bounded(float, lambda v: 0 < v < 1, "a relative change above 0 and below 1 (0.01: 1%)")
_timed_runs = _bounded(_whole, lambda v: v <= MAX_TIMED_RUNS, f"a number of runs from 0 to {MAX_TIMED_RUNS}")
_pairs = _bounded(_whole, lambda v: 1 <= v <= MAX_PROCESSES, f"a number of processes from 1 to {MAX_PROCESSES}")
_rounds = _bounded(_whole, lambda v: 1 <= v <= 1000, "a number of rounds from 1 to 1000")
_positive = _bounded(_whole, lambda v: v > 0, "a pull request number")
_seconds = _bounded(float, lambda v: 0 < v < math.inf, "a number of seconds > 0")
_megabytes = _bounded(_whole, lambda v: v > 0, "a whole number of megabytes > 0")


def _forge_options(parser: argparse.ArgumentParser) -> None:
    """``--forge`` and ``--server``: where the comment goes and the links lead."""
    from .forge.choice import NAMES

    parser.add_argument(
        "--forge",
        choices=NAMES,
        help="the forge of the repository (default: gitlab inside a GitLab job, which sets GITLAB_CI; else github)",
    )
    parser.add_argument(
        "--server", metavar="URL", help="GitLab's server (default: the job's CI_SERVER_URL, else https://gitlab.com)"
    )


def _history_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .history_branch import BRANCH

    history = commands.add_parser(
        "history",
        help="the default branch's runs per GPU model: record a run, fetch "
        "them for a pull request's report, write baselines or a page from them",
    )
    actions = history.add_subparsers(dest="action", required=True)
    record = actions.add_parser("record", help="append a default-branch run's results to the history")
    record.add_argument("results", nargs="+", metavar="RESULTS", help="results files (pytest --syncguard-json)")
    record.add_argument("--commit", required=True, help="the commit the run measured")
    where = record.add_mutually_exclusive_group(required=True)
    where.add_argument("--into", metavar="DIR", help="a folder of history files")
    where.add_argument(
        "--push",
        metavar="REMOTE",
        help="the history branch of this git remote (e.g. origin): "
        "fetched, appended and pushed, again on a new tip while another push rejects it",
    )
    record.add_argument("--branch", default=BRANCH, help=f"the history branch (default {BRANCH})")
    fetch = actions.add_parser("fetch", help="copy the history branch's files into a folder (for report --history)")
    fetch.add_argument("--into", metavar="DIR", required=True, help="the folder the history files are copied into")
    fetch.add_argument(
        "--remote", default="origin", help="the git remote whose history branch is read (default origin)"
    )
    fetch.add_argument("--branch", default=BRANCH, help=f"the history branch (default {BRANCH})")
    baselines = actions.add_parser("baselines", help="write baseline files (baselines/<slug>.json) from a history")
    baselines.add_argument("folder", metavar="DIR", help="a folder of history files")
    baselines.add_argument("--out", metavar="DIR", required=True, help="the baselines folder to write into")
    page = actions.add_parser("page", help="a static HTML page of every test's metrics per GPU model")
    page.add_argument("folder", metavar="DIR", help="a folder of history files")
    page.add_argument("--out", metavar="FILE", required=True, help="the HTML file to write")
    page.add_argument("--repository", metavar="OWNER/NAME", help="each point links to its commit on the forge")
    _forge_options(page)
    history.set_defaults(run=_history)


def _history(args: argparse.Namespace) -> int:
    """``syncguard history record|fetch|baselines|page``."""
    from ..document.file import ResultsError, read_all
    from ..judge import history
    from . import history_branch
    from .forge.base import CommentError

    try:
        if args.action == "record":
            results = read_all(Path(path) for path in args.results)
            if args.into:
                held = history.record(Path(args.into), results, args.commit, history.now())
                for slug, recorded in held.items():
                    print(f"syncguard history: {recorded.describe(slug)}")
            else:
                history_branch.push(Path.cwd(), results, args.commit, remote=args.push, branch=args.branch)
            return 0
        if args.action == "fetch":
            found = history_branch.fetch(Path.cwd(), Path(args.into), remote=args.remote, branch=args.branch)
            print(
                f"syncguard history: {args.remote} {args.branch} "
                + (
                    "fetched into " + args.into
                    if found
                    else "does not exist yet: every GPU model is judged as seen for the first time"
                )
            )
            return 0
        histories = _histories(Path(args.folder))
        if args.action == "baselines":
            from ..judge.baselines import document

            for kept in histories:
                reference = history.baseline(kept)
                target = Path(args.out) / f"{kept.device}.json"
                write_atomically(
                    target, document(kept.device, {}, reference.tests, reference.details, reference.history)
                )
                print(f"syncguard history: {target}: {len(reference.tests)} tests from {len(kept.runs)} runs")
            return 0
        from ..render.charts import page
        from .forge.choice import forge_named

        inputs = [("DIR", str(p)) for p in Path(args.folder).iterdir() if p.name.endswith((".jsonl", ".json"))]
        if (problem := clobbers("history page", [("--out", args.out, "file")], inputs)) is not None:
            print(problem, file=sys.stderr)
            return 2

        forge = forge_named(args.forge, args.server)
        if args.repository and (wrong := forge.repository_problem(args.repository)) is not None:
            print(f"syncguard history: {wrong}", file=sys.stderr)
            return 2
        write_atomically(Path(args.out), page(histories, forge.web(args.repository) if args.repository else None))
        print(f"syncguard history: {args.out}: {plural(len(histories), 'GPU model')}")
        return 0
    except (history.HistoryError, ResultsError, CommentError, OSError) as exc:
        print(f"syncguard history: {exc}", file=sys.stderr)
        return 2


def _histories(folder: Path) -> list[History]:
    """Every GPU model's history in ``folder``."""
    from ..judge import history

    files = sorted(folder.glob(f"*{history.RUNS_SUFFIX}"))
    for other in (path for path in files if history.slug_of(path.name) is None):
        print(
            f"syncguard history: {other}: not a GPU model's history (its name is no device slug): left out",
            file=sys.stderr,
        )
    slugs = [slug for path in files if (slug := history.slug_of(path.name)) is not None]
    return [found for slug in slugs if (found := history.read(folder, slug)) is not None]


def build_parser() -> argparse.ArgumentParser:
    """The ``syncguard`` command's parser: every subcommand and option (docs/reference/cli.md is made from it)."""
    # The module docstring without its reStructuredText markup: --help is read in a terminal.
    parser = argparse.ArgumentParser(prog="syncguard", description=(__doc__ or "").replace("``", ""))
    commands = parser.add_subparsers(dest="command", required=True)

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
        "when cut to GitHub's limit the full report goes to OUT with suffix .full.md",
    )
    report.add_argument("--json", metavar="OUT", help="write the verdicts as JSON")
    report.add_argument(
        "--tolerance",
        type=_tolerance,
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
    _forge_options(report)
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
        "--base-ref",
        metavar="REF",
        help="judge against this commit's files of --baselines (a pull "
        "request's base): a change cannot loosen its own gate; what the working tree's files loosen "
        "against them is said above the fold",
    )
    report.set_defaults(run=_report)

    from .ab.plan import DEFAULT_CONFIDENCE, DEFAULT_MIN_EFFECT, DEFAULT_PROCESSES, DEFAULT_ROUNDS

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
        type=_rounds,
        default=DEFAULT_ROUNDS,
        help=f"the most rounds of a test (default "
        f"{DEFAULT_ROUNDS}); a test whose verdict more rounds cannot change is settled: held test by test, "
        "from its 4th round with 2 pairs of processes (3rd with one: Student's t until a pair has 6, then "
        "the signed-rank interval), else from the 6th (a 95%% signed-rank interval needs 6)",
    )
    ab.add_argument(
        "--processes",
        type=_pairs,
        default=DEFAULT_PROCESSES,
        metavar="N",
        help="warm pytests per "
        f"side for rounds held test by test (default {DEFAULT_PROCESSES}): the pairs run the rounds in "
        "turn and a timing is called a change only where every pair's interval calls it, so that a "
        "process's own offset is not read as one (1: one pair, as before)",
    )
    ab.add_argument(
        "--time-budget",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="start no round that "
        "would end later than this after the start, at what the last round took for the tests still "
        "running",
    )
    ab.add_argument(
        "--min-effect",
        type=_effect,
        default=None,
        metavar="FRACTION",
        help="the smallest relative change judged a regression or improvement (default: each "
        f"metric's own: device time 0.01, host timings {DEFAULT_MIN_EFFECT})",
    )
    ab.add_argument(
        "--confidence",
        type=_probability,
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
        type=_seconds,
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
        type=_timed_runs,
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
    ab.set_defaults(run=_ab)

    comment = commands.add_parser(
        "comment", help="create or update this tool's comment on a pull request (GitHub, through gh) or merge request"
    )
    comment.add_argument(
        "--pr", type=_positive, required=True, help="pull request number (GitLab: the merge request's IID)"
    )
    comment.add_argument("--body-file", required=True, help="Markdown body (from syncguard report --markdown)")
    comment.add_argument(
        "--repo", help="OWNER/NAME or GROUP/PROJECT (default: gh's repository, or the GitLab job's CI_PROJECT_PATH)"
    )
    comment.add_argument("--key", default="syncguard", help="one comment per key, e.g. the GPU's slug")
    comment.add_argument("--author", help="the account the comment is posted as (default: asked from the forge)")
    _forge_options(comment)
    comment.add_argument(
        "--timeout",
        "--gh-timeout",
        dest="timeout",
        type=_seconds,
        default=GH_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up a call to the forge that takes longer (default {GH_TIMEOUT_S:g})",
    )
    comment.set_defaults(run=_comment)

    posting = commands.add_parser(
        "post-artifact",
        help="validate a GPU run's artifact (untrusted data) and post its "
        "report on the pull request it names, if still at the commit tested",
    )
    posting.add_argument("artifact", help="the downloaded artifact folder (pr-number, device-slug, results-*.json)")
    posting.add_argument("--repo", required=True, help="OWNER/NAME of the pull request")
    posting.add_argument("--head-sha", required=True, help="the commit the GPU run tested (the workflow_run's)")
    posting.add_argument(
        "--baselines",
        default="baselines",
        help="the default branch's baselines folder, for a GPU model without a history (default: baselines)",
    )
    posting.add_argument(
        "--approval-label",
        default="gpu-approved",
        help="removed from a fork's pull request "
        "after posting, so that its next push needs a maintainer again ('' to keep it)",
    )
    posting.add_argument("--work", help="where the report is rendered (default: a new temporary folder)")
    posting.set_defaults(run=_post_artifact)

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
        type=_megabytes,
        default=MAX_UNPACKED_BYTES >> 20,
        metavar="MB",
        help=f"refuse a file that unpacks to more (default {MAX_UNPACKED_BYTES >> 20})",
    )
    trace.set_defaults(run=_trace)

    baselines = commands.add_parser(
        "baselines", help="show a baseline file, or judge NEW against OLD as the gate would"
    )
    baselines.add_argument(
        "files",
        nargs="+",
        metavar="PATH",
        help="a baseline file to show (with the history of "
        "each calibrated metric and the tolerance it sets), OLD NEW files to compare, or with "
        "--record the baselines folder to write into",
    )
    baselines.add_argument(
        "--record",
        nargs="+",
        metavar="RESULTS",
        help="write these results files (pytest "
        "--syncguard-json) into the baselines folder given as PATH, as --syncguard-update-baselines "
        "would have: each calibrated metric joins its history",
    )
    baselines.add_argument(
        "--host", help="with --record: the device the results were measured on (default: the one each result names)"
    )
    baselines.add_argument(
        "--reset-history",
        nargs="*",
        metavar="NODEID",
        default=None,
        help="empty the recorded "
        "history of these tests (all when none is named) in PATH, keeping their values: the next "
        "update starts it again",
    )
    baselines.set_defaults(run=_baselines)

    _history_parser(commands)

    device = commands.add_parser("device", help="this machine's baseline slug and environment fingerprint")
    device.add_argument("--json", action="store_true", help="print as JSON")
    device.set_defaults(run=_device)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "warmup_steps", 0) < 0 or getattr(args, "top", 1) < 0:
        parser.error("--warmup-steps and --top must be >= 0")
    if args.command == "baselines" and len(args.files) > 2:
        parser.error("baselines: give one file to show or two to compare")
    try:
        return int(args.run(args))
    except KeyboardInterrupt:  # before a command's own handling of it (ab's first half second): no traceback
        print(f"syncguard {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`syncguard trace f.json | head -1`): nothing more to say
        # Python flushes stdout again at exit: point it at nothing, or that flush raises once more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports a command ended by SIGPIPE


if __name__ == "__main__":
    raise SystemExit(main())
