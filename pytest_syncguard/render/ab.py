"""The A/B report as text: the terminal's lines and the phrases the comment uses (:mod:`.markdown`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ..document.ab import INCONCLUSIVE, REGRESSION, ABReport, RatioVerdict
from ..metrics import metric, timing_order
from ..status import Status
from ..words import plural


def failure_text(nodeid: str, how: Mapping[str, Sequence[int]]) -> str:
    """A failed test as the report shows it: ``node id: failed in rounds 1, 2``."""
    rounds = (
        f"{verdict} in round{'s' if len(n) > 1 else ''} {', '.join(map(str, n))}" for verdict, n in sorted(how.items())
    )
    return f"{nodeid}: {', '.join(rounds)}"


def duration(seconds: float) -> str:
    """``42s``, ``3m05s`` or ``1h02m``."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def summary_lines(report: ABReport) -> list[str]:
    """The A/B as text: one line per test, the non-unchanged metrics under it; of an inconclusive metric, the
    smallest change its rounds could have resolved."""
    effect = (
        "each metric's own minimum effect" if report.min_effect is None else f"minimum effect {report.min_effect:.0%}"
    )
    lines = [
        f"syncguard ab: head {report.head} against base {report.base} on {report.device or 'no device'}, "
        f"{rounds_text(report)}, "
        f"{report.confidence:.0%} intervals, {effect}",
    ]
    for side in ("head", "base"):
        lines += [
            f"{'FAILED' if side == 'head' else 'failed':12} on the {side}: {failure_text(nodeid, how)}"
            for nodeid, how in report.failed_in.get(side, {}).items()
        ]
    for test in report.tests:
        lines.append(f"{test.verdict.upper() if test.verdict == REGRESSION else test.verdict:12} {test.nodeid}")
        for c in test.counts:
            lines.append(f"    {c.metric}: {_number(c.base)} -> {_number(c.head)} ({c.status})")
        lines.extend(f"    {line}" for line in test.explanation.lines())
        for name, v in sorted(test.timings.items(), key=lambda item: timing_order(item[0])):
            lines.append(f"    {name}: {ratio_text(v)} {v.verdict}{verdict_note(v, name)}")
        lines.extend(f"    {name}: {why}" for name, why in sorted(test.unmeasured.items()))
        if test.nodeid in report.costs:
            lines.append(f"    {cost_text(report, test.nodeid)}")
    for side, ids in sorted(report.only_in.items()):
        lines.append(f"only measured on the {side} (not compared): {', '.join(ids)}")
    if report.judged_by_baseline:
        lines.append(f"judged against the baseline, not A/B-tested: {judged_text(report)}")
    if report.unreached:
        lines.append(f"NOT A/B-TESTED (undecided: the time budget ran out first): {', '.join(report.unreached)}")
    totals = {v: len(report.with_verdict(v)) for v in (Status.REGRESSION, Status.IMPROVEMENT, "varies", INCONCLUSIVE)}
    failed = {side: len(report.failed_in.get(side, {})) for side in ("head", "base")}
    missing = len(report.only_in.get("base", ()))
    lines.append(
        f"syncguard ab: {len(report.tests)} tests, "
        + ", ".join(f"{n} {verdict}" for verdict, n in totals.items())
        + "".join(f", {n} failed on the {side} (not compared)" for side, n in failed.items() if n)
        + (f", {missing} measured on the base only (not compared)" if missing else "")
        + (f", {len(report.unreached)} not A/B-tested" if report.unreached else "")
    )
    return lines


def judged_text(report: ABReport) -> str:
    """The tests left out as judged against the baseline: ``2 tests (baselines/h100.json): id, id``."""
    files = sorted(set(report.judged_by_baseline.values()))
    ids = ", ".join(report.judged_by_baseline)
    return f"{len(report.judged_by_baseline)} tests ({', '.join(files)}): {ids}"


def cost_text(report: ABReport, nodeid: str) -> str:
    """What a held test's rounds took: ``7 rounds: the first 14.2 s, then 1.3 s each (both sides)``."""
    first, later = report.costs[nodeid]
    rounds = max((v.rounds for t in report.tests if t.nodeid == nodeid for v in t.timings.values()), default=1)
    then = f", then {later:.1f} s each" if later is not None else ""
    return f"{rounds} round{'s' if rounds != 1 else ''}: the first {first:.1f} s{then} (both sides)"


def rounds_text(report: ABReport, shown: Callable[[str], str] = str) -> str:
    """How the rounds ran: ``6 rounds interleaved (every test settled after 6 rounds, 1m37s; one warm pytest per
    side)``; why they stopped (text of the report, which may be untrusted) as ``shown`` renders it."""
    processes = "one warm pytest per side" if report.warm_sides else "a pytest per side per round"
    if report.processes > 1:
        processes = (
            f"{report.processes} warm pytests per side, their pairs' rounds in turn, a verdict where every pair agrees"
        )
    if report.held:
        processes += ", test by test, its fixtures kept set up across its rounds (a later round: its call, warm)"
    if report.head_first:
        processes += f", the head's first round the suite's ({shown(Path(report.head_first).name)})"
    if report.timed_rounds:
        runs = "" if report.timed_runs is None else f" ({report.timed_runs} per test, after the traced one)"
        processes += f", timings only after the first round{runs}"
    if not report.host_timings:
        processes += ", host timings not judged"
    took = f", {duration(report.elapsed_s)}" if report.elapsed_s is not None else ""
    return f"{plural(report.rounds, 'round')} interleaved ({shown(report.stopped or 'as asked')}{took}; {processes})"


def verdict_note(v: RatioVerdict, name: str = "") -> str:
    """Why a timing (metric ``name``) has no interval, or, of an inconclusive one, what its rounds could resolve:
    `` (3 rounds cannot ...)``, `` (6 rounds, resolves ±4.1%; minimum effect 3%)``, or that more rounds could not
    settle it: `` (6 rounds; host time not resolvable on this runner: ±9.8% after the most rounds, ...)``."""
    if v.reason:
        return f" ({v.reason})"
    pairs = f", pairs {' and '.join(f'x{ratio:.3f}' for ratio in v.pairs)}" if v.pairs else ""
    if v.spread is not None:
        spec = metric(name)
        what = "host time" if spec is not None and spec.host else name or "it"
        effect = f"the minimum effect {v.min_effect:.0%}" if v.min_effect is not None else "the minimum effect"
        return (
            f" ({v.rounds} rounds{pairs}; {what} not resolvable on this runner: ±{v.spread:.1%} after the most "
            f"rounds, wider than {effect})"
        )
    how = (", t interval" if v.method == "t" else "") + pairs
    if v.verdict != INCONCLUSIVE or v.resolvable is None:
        return f" ({v.rounds} rounds{how})"
    effect = f"; minimum effect {v.min_effect:.0%}" if v.min_effect is not None else ""
    return f" ({v.rounds} rounds{how}, resolves ±{v.resolvable:.1%}{effect}{_direction(v, name)})"


def _direction(v: RatioVerdict, name: str) -> str:
    """Of an inconclusive timing whose interval is clear of no change: which way it moved, by less than could be
    told from the minimum effect."""
    spec = metric(name)
    if spec is None or v.low is None or v.high is None or v.low <= 1 <= v.high:
        return ""
    worse = (v.high < 1) if spec.higher_is_better else (v.low > 1)
    return f"; {'slower' if worse else 'faster'}: its interval is clear of no change, not of the minimum effect"


def ratio_text(v: RatioVerdict) -> str:
    """``x1.031 [0.998, 1.062]`` (head/base, its interval), or ``-`` without one."""
    if v.ratio is None or v.low is None or v.high is None:
        return "-"
    return f"x{v.ratio:.3f} [{v.low:.3f}, {v.high:.3f}]"


def _number(value: float) -> str:
    return f"{int(value)}" if float(value).is_integer() else f"{value:.4g}"
