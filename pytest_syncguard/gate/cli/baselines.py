"""``syncguard baselines``: show, compare, record or reset baseline files."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ...document.file import ResultsError, read_all
from ...environment import fingerprint_changes
from ...judge.baselines import BaselineError, path_for, read, record, reset_history
from ...judge.comparison import MIN_RUNS, compare, tolerance_of
from ...metrics import Metrics
from ...metrics import metric as metric_named

if TYPE_CHECKING:
    from ...judge.baselines import Baseline


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    baselines.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
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
