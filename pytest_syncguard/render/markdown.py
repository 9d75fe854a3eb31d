"""A run's verdicts as a Markdown PR comment, read in one screen: the verdict line and a one-line summary, then
the failed budgets and each regressed test's chain (:mod:`.chain`), what changed -> on the GPU -> what it cost;
everything else (device time of every test, improvements, new and missing tests, timings that were not judged,
the environment) collapsed. With nothing regressed, a dozen lines at most are visible.

Everything that comes from the run (test ids, paths, source lines, causes) is shown in code spans: verbatim, so
that it cannot open an HTML tag, a mention, an issue reference or a link; a backtick in it lengthens the span's
fence, a ``|`` in a table cell is escaped as GFM asks, and control characters and newlines are dropped. A site is
a link to its line at the head commit where the repository and commit are known (:class:`SiteLinks`). The comment
is cut to fit GitHub's limit, with a note that points to the full report.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..document.comparison import Change
from ..judge.cases import RunCase
from ..judge.loosened import Loosened
from ..judge.run import CaseComparison, RunComparison
from ..judge.verdict import Verdict
from ..metrics import DEVICE_TIME, timing_order
from ..status import Status
from ..words import plural
from .chain import (
    Code,
    Entry,
    Line,
    Site,
    Word,
    budget_entries,
    joined_links,
    rank_lines,
    regression_entries,
    value_text,
)
from .links import SiteLinks

if TYPE_CHECKING:
    from ..document.ab import ABReport

#: Characters a comment's body leaves to the forge's limit, for the hidden marker (:mod:`pytest_syncguard.gate.forge`).
MARKER_ROOM = 512
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
MAX_TEXT = 300
#: Lists of new or missing tests longer than this are collapsed.
LONG_LIST = 20
#: Text from the run shown as it is: letters, digits and punctuation that Markdown gives no meaning to (no tag, mention,
#: issue reference, link, emphasis, table pipe or escape), and no autolink (``www.``, ``scheme://``).
_HARMLESS = re.compile(r"[A-Za-z0-9 .,:;%±()+=/-]{1,200}")


def code(text: object, *, cell: bool = False) -> str:
    """Run-supplied text as a code span: shown verbatim (no Markdown, HTML, mention or link), whatever backticks it
    holds; in a table ``cell``, its ``|`` escaped so that it does not split the cell."""
    cleaned = _CONTROL.sub(" ", str(text))[:MAX_TEXT]
    if not cleaned.strip():
        return "-"
    longest = max((len(run) for run in re.findall(r"`+", cleaned)), default=0)
    fence = "`" * (longest + 1)
    padded = f" {cleaned} " if cleaned.startswith("`") or cleaned.endswith("`") else cleaned
    span = f"{fence}{padded}{fence}"
    return span.replace("|", "\\|") if cell else span


def harmless(text: str) -> bool:
    """Whether run-supplied ``text`` renders as itself in GitHub's Markdown, outside a code span too."""
    lowered = text.lower()
    return bool(_HARMLESS.fullmatch(text)) and "www." not in lowered and "://" not in lowered


def said(text: object, *, cell: bool = False) -> str:
    """A word from the run (a status, a verdict, a cause): as it is where it is :func:`harmless`, else a code span."""
    value = str(text)
    return value if harmless(value) else code(value, cell=cell)


def _part(part: str | Code | Site | Word, links: SiteLinks | None) -> str:
    if isinstance(part, Code):
        return code(part.text)
    if isinstance(part, Word):
        return said(part.text)
    if isinstance(part, Site):
        span = code(f"{part.path}:{part.line}")
        url = links.url(part) if links is not None else None
        return f"[{span}]({url})" if url else span
    return part


def _line(line: Line, links: SiteLinks | None) -> str:
    return "".join(_part(part, links) for part in line)


def _entries(entries: Sequence[Entry], links: SiteLinks | None) -> list[str]:
    lines: list[str] = []
    for entry in entries:
        lines.append(f"- **{code(entry.nodeid)}** on {code(entry.device)}")
        for title, link in entry.links:
            if not link:
                lines.append(f"  - **{title}:** not measured")
                continue
            lines.append(f"  - **{title}:** {_line(link[0], links)}")
            lines.extend(f"    - {_line(line, links)}" for line in link[1:])
    return [*lines, ""]


def _change(change: Change) -> str:
    if change.delta is None:
        return "-"
    relative = "" if change.relative is None else f" ({change.relative:+.1%})"
    return f"{change.delta:+.4g}{relative}"


def _tolerance(change: Change) -> str:
    """``1.5% (spread ±0.04% over 3 recordings on 1 host)``: what a noisy metric was judged within."""
    if change.tolerance is None:
        return "-"
    return f"{change.tolerance:.1%}" + (f" ({change.spread.describe()})" if change.spread else "")


def _change_rows(rows: Iterable[tuple[CaseComparison, Change]]) -> list[str]:
    lines = ["| test | device | metric | baseline → now | change |", "|---|---|---|---|---|"]
    for verdict, change in rows:
        lines.append(
            f"| {code(verdict.case.nodeid, cell=True)} | {code(verdict.case.device_slug, cell=True)} | "
            f"{code(change.metric, cell=True)} | {value_text(change.metric, change.old)} → "
            f"{value_text(change.metric, change.new)} | {_change(change)} |"
        )
    return lines


def device_time_block(run: RunComparison, every_row: bool = True) -> list[str]:
    """Every test's device time per token against its baseline (``every_row``; else the tests whose device time
    did not stay unchanged), regressions first, with the tolerance it was judged within and the recorded spread
    that set it."""
    order = {Status.REGRESSION: 0, Status.IMPROVEMENT: 1, "not compared": 2, Status.UNCHANGED: 3}
    rows = sorted(
        (
            (v, c)
            for v in run.cases
            for c in v.comparison.changes
            if c.metric == DEVICE_TIME and (every_row or c.status != Status.UNCHANGED)
        ),
        key=lambda pair: (order.get(pair[1].status, 2), pair[0].case.nodeid),
    )
    if not rows:
        return []
    lines = [
        "**Device time per token** (judged against the baseline)",
        "",
        "| test | device | baseline → now | change | judged within | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for verdict, change in rows:
        lines.append(
            f"| {code(verdict.case.nodeid, cell=True)} | {code(verdict.case.device_slug, cell=True)} | "
            f"{value_text(change.metric, change.old)} → {value_text(change.metric, change.new)} | {_change(change)} | "
            f"{_tolerance(change)} | {said(change.status, cell=True)} |"
        )
    return [*lines, ""]


def joined_block(run: RunComparison, links: SiteLinks | None = None) -> list[str]:
    """Each test the ranks of a launch measured, with what their records joined say (the collectives' waits and
    straggler)."""
    lines: list[str] = []
    for verdict in run.cases:
        for title, found in joined_links(verdict.case, verdict.comparison):
            lines.append(f"- {code(verdict.case.nodeid)} on {code(verdict.case.device_slug)}: **{title}**")
            lines.extend(f"  - {_line(line, links)}" for line in found)
    return ["**Across ranks** (each test's ranks joined)", "", *lines, ""] if lines else []


def _pairs(verdicts: Sequence[CaseComparison], status: str) -> list[tuple[CaseComparison, Change]]:
    return [(v, c) for v in verdicts for c in v.comparison.of(status)]


def _listing(title: str, tests: Sequence[tuple[str, str]]) -> list[str]:
    items = [f"- {code(nodeid)} on {code(device)}" for device, nodeid in tests]
    return [title, "", *items, ""]


def summary_line(run: RunComparison) -> str:
    """The run in one line: tests, devices, what judged them."""
    devices = ", ".join(code(d) for d in run.devices) or "no device"
    named = {
        Status.REGRESSION: "regressed",
        Status.IMPROVEMENT: "improved",
        Status.UNCHANGED: Status.UNCHANGED,
        "new": "new",
        "not compared": "not compared",
    }
    counts = {word: len(run.with_status(status)) for status, word in named.items()}
    files = sorted({Path(v.comparison.file).name for v in run.cases if v.comparison.status not in ("new",)})
    files = [f for f in files if not f.startswith("history:")]
    judged = f"judged against {', '.join(code(f) for f in files)}" if files else "no baseline to judge them against"
    if run.histories:
        from ..judge.history import describe

        histories = "; ".join(said(describe(h)) for _, h in sorted(run.histories.items()))
        judged = f"judged against the default branch's {histories}" + (
            f" and {', '.join(map(code, files))}" if files else ""
        )
    host = "host timings judged" if any(v.comparison.host_timings for v in run.cases) else "host timings not judged"
    rest = ", ".join(f"{n} {status}" for status, n in counts.items() if n)
    missing = f", {len(run.missing)} missing" if run.missing else ""
    if run.rejudged:
        missing += (
            f", {plural(len(run.rejudged), 'test')} the run failed against its own baseline and this one "
            "finds not regressed"
        )
    return f"{plural(len(run.cases), 'test')} on {devices}, {judged}: {rest or 'none compared'}{missing}; {host}."


def unknown_lines(run: RunComparison) -> list[str]:
    """Per results file of another version, what in it this version does not know and read without."""
    return [
        f"⚠️ {code(Path(path).name)} was written by another version of syncguard: this one does not know "
        f"{', '.join(kind + ' ' + code(name) for kind, _, name in (p.partition(' ') for p in parts))}; read without "
        "them (not judged).\n"
        for path, parts in sorted(run.unknown.items())
    ]


def history_lines(run: RunComparison) -> list[str]:
    """Where the default branch's history could not be read: said, with why."""
    if run.history_unavailable is None:
        return []
    return [
        f"⚠️ The default branch's history could not be read ({code(run.history_unavailable)}): judged against "
        "the baselines folder instead.\n"
    ]


def stale_lines(run: RunComparison) -> list[str]:
    """The tests of this run that the default branch's last run left out (failed, skipped): each judged against its
    last good run, said."""
    from ..judge.history import levels

    lines = []
    judged = {c.key for c in run.cases}
    for slug, found in sorted(run.histories.items()):
        stale = [(n, why, commit) for n, (why, commit) in sorted(levels(found).stale.items()) if (slug, n) in judged]
        for nodeid, why, commit in stale[:10]:
            lines.append(
                f"⚠️ The default branch's last run left out {code(nodeid)} ({said(why)}): judged against "
                f"its last good run ({code(commit[:12])}).\n"
            )
        if len(stale) > 10:
            lines.append(f"⚠️ ... and {plural(len(stale) - 10, 'more test')} the last run left out.\n")
    return lines


def _new_value(item: Loosened) -> str:
    return "removed" if item.new is None else value_text(item.metric, item.new)


def trend_block(run: RunComparison) -> list[str]:
    """Each regressed test judged against a history: its regressed metric (device time first, else the one that
    moved most: syncs 0 -> 15 before operators +2%) over the last runs of the default branch and this run, as a
    chart GitHub draws; with what the history held."""
    from ..judge.history import describe
    from .charts import mermaid

    lines: list[str] = []
    for verdict in run.with_status(Status.REGRESSION):
        history = run.histories.get(verdict.case.device_slug)
        regressed = [c.metric for c in verdict.comparison.of(Status.REGRESSION)]
        if history is None or not regressed:
            continue
        name = DEVICE_TIME if DEVICE_TIME in regressed else max(regressed, key=lambda m: _moved(verdict, m))
        now = verdict.case.metrics.get(name)
        chart = mermaid(history, verdict.case.nodeid, name, now) if now is not None else []
        if chart:
            held = describe(history, verdict.case.nodeid, name)
            lines += [
                f"{code(verdict.case.nodeid)}: {code(name)} over the default branch's last runs, then this run "
                f"({code(held)})",
                "",
                *chart,
                "",
            ]
    return ["#### Trend", "", *lines] if lines else []


def _moved(verdict: CaseComparison, name: str) -> float:
    """How far a metric moved against its baseline, relative (a count from 0 moved without bound)."""
    change = next(c for c in verdict.comparison.changes if c.metric == name)
    if change.old is None or change.new is None:
        return 0.0
    return abs(change.new - change.old) / abs(change.old) if change.old else float("inf")


def loosened_block(loosened: Sequence[Loosened]) -> list[str]:
    """The baseline values this change loosens (test, metric, base's value -> head's), said above the fold."""
    if not loosened:
        return []
    rows = [
        f"| {code(item.nodeid, cell=True)} | {code(item.device, cell=True)} | {code(item.metric, cell=True)} | "
        f"{value_text(item.metric, item.old)} → {_new_value(item)} |"
        for item in loosened
    ]
    return [
        f"### ⚠️ This change loosens its own baselines ({plural(len(loosened), 'value')})",
        "",
        "Judged against the base's baseline files; a reviewer approves these as the new level:",
        "",
        "| test | device | metric | base → head |",
        "|---|---|---|---|",
        *rows,
        "",
    ]


def sections(
    run: RunComparison,
    ab: ABReport | None = None,
    links: SiteLinks | None = None,
    every_row: bool = True,
    full_report: str | None = None,
) -> list[list[str]]:
    """The report's blocks in order of importance (each a list of lines): what a reviewer must read first, then
    what is collapsed. The headline and every section's count come from one :class:`.verdict.Verdict`. Without
    ``every_row`` (a comment), the collapsed rows of tests that passed unchanged are counted, not listed: they are
    in ``full_report``."""
    verdict = Verdict.of(run, ab)
    blocks: list[list[str]] = [
        [verdict.headline(), "", summary_line(run), "", *unknown_lines(run), *history_lines(run), *stale_lines(run)]
    ]
    if run.loosened:
        blocks.append(loosened_block(run.loosened))
    budgets = budget_entries(run)
    if budgets:
        blocks.append([f"### ❌ Failed budgets ({plural(len(budgets), 'test')})", "", *_entries(budgets, links)])
    regressions = regression_entries(run, ab)
    if regressions:
        title = f"### ❌ Regressions ({plural(len(regressions), 'test')})"
        if run.accepted is not None:
            title = f"### ⚠️ Regressions accepted as intended, {run.accepted} ({plural(len(regressions), 'test')})"
        blocks.append([title, "", *_entries(regressions, links)])
        blocks.append(trend_block(run))
    other = [v for v in run.failed_tests if not v.case.broken]
    if other:
        blocks.append(
            [
                f"### ❌ Failed tests ({plural(len(other), 'test')})",
                "",
                *(line for v in other for line in _failed_test(v.case, links)),
                "",
            ]
        )
    if ab is not None:
        folded = frozenset(entry.nodeid for entry in regressions)
        blocks.append(ab_lines(ab, accepted=run.accepted is not None, folded=folded))
    blocks.append(_details(run, every_row, full_report))
    return blocks


def _failed_test(case: RunCase, links: SiteLinks | None) -> list[str]:
    """A test that failed in the run: its verdict, and of a test the ranks of a launch measured, each rank's."""
    head = f"- {code(case.nodeid)} on {code(case.device_slug)}: {said(case.verdict)}"
    if not case.ranks:
        return [head]
    return [head, *(f"  - {_line(line, links)}" for line in rank_lines(case))]


def _details(run: RunComparison, every_row: bool = True, full_report: str | None = None) -> list[str]:
    """Everything else, collapsed: device time of every test, improvements, new and missing tests, timings not
    judged, the environment, and every test's verdict; without ``every_row``, of the tests that passed unchanged
    only their count (their rows are in ``full_report``)."""
    inside: list[str] = [*device_time_block(run, every_row), *joined_block(run)]
    improved = _pairs(run.with_status(Status.IMPROVEMENT), Status.IMPROVEMENT)
    if improved:
        inside += [
            "**Improvements** (record them with `pytest --syncguard --syncguard-update-baselines` on the same "
            "GPU model)",
            "",
            *_change_rows(improved),
            "",
        ]
    new = [(v.case.device_slug, v.case.nodeid) for v in run.with_status("new")]
    if new:
        inside += _listing("**New tests** (no baseline entry)", new)
    if run.missing:
        inside += _listing("**In the baselines, not in this run**", run.missing)
    host = _pairs(run.cases, "not judged") if every_row else []
    if host:
        inside += [
            "**Host timings, not judged** (time, tokens/s, gaps, busy fraction against a baseline: judged "
            "A/B on one runner, or with --syncguard-judge-host-timings where this runner recorded the "
            "baseline)",
            "",
            *_change_rows(host),
            "",
        ]
    if run.environment:
        inside += ["**Environment differs from the baseline's**", ""]
        for device, changes in sorted(run.environment.items()):
            what = ", ".join(f"{code(k)} {code(old)} → {code(new)}" for k, (old, new) in sorted(changes.items()))
            inside.append(f"- {code(device)}: {what}")
        inside.append("")
    shown = [v for v in run.cases if every_row or not _plain(v)]
    if shown:
        inside += ["| test | device | verdict | baseline |", "|---|---|---|---|"]
        inside += [
            f"| {code(v.case.nodeid, cell=True)} | {code(v.case.device_slug, cell=True)} | "
            f"{said(v.case.verdict, cell=True)} | {said(v.comparison.status, cell=True)} |"
            for v in shown
        ]
    if len(shown) < len(run.cases):
        where = f"the full report {code(full_report)}" if full_report else "the full report"
        inside += [
            *([""] if inside else []),
            f"{plural(len(run.cases) - len(shown), 'test')} passed unchanged: their device time, host timings and "
            f"verdicts are in {where}.",
        ]
    unchanged = len(run.with_status(Status.UNCHANGED))
    every = "device time and verdict of every test" if every_row else "the rest"
    summary = f"Details: {plural(unchanged, 'test')} unchanged, {every}"
    return [f"<details><summary>{summary}</summary>", "", *inside, "", "</details>", ""]


def _plain(verdict: CaseComparison) -> bool:
    """A test that passed unchanged against its baseline: nothing in it for a reviewer to read."""
    return (
        verdict.case.outcome == "passed" and not verdict.case.broken and verdict.comparison.status == Status.UNCHANGED
    )


def ab_lines(report: ABReport, accepted: bool = False, folded: frozenset[str] = frozenset()) -> list[str]:
    """The A/B of a change on one runner: its verdict, then per test that did not stay unchanged its counts, what
    changed in them, and each timing's head/base ratio with its interval; collapsed where nothing regressed. An
    ``accepted`` change's regressions are marked ⚠️, not ❌ (a failure or a test missing on the head still is). The
    tests ``folded`` into the report's entries (:func:`.chain.ab_link`) are named, not repeated."""
    from .ab import failure_text

    regressed = report.with_verdict(Status.REGRESSION)
    failed = report.failed_in.get("head", {})
    missing = report.only_in.get("base", ())
    stopped = report.stopped or "no test compared"
    if not report.tests and not report.failed_in and not missing:
        # A <summary> is raw HTML, where a code span is no code span: run-supplied text goes there only harmless.
        title = f"A/B on one runner: {stopped if harmless(stopped) else 'stopped, see below'}"
    else:
        verdict = f"{plural(len(regressed), 'regression')} in {plural(len(report.tests), 'test')}"
        raised = [n for n, how in failed.items() if {"failed", "error"} & set(how)]
        unmeasured = len(failed) - len(raised) + len(missing)
        not_compared = [f"{plural(len(raised), 'test')} failed on the head"] if raised else []
        not_compared += [f"{plural(unmeasured, 'test')} not measured on the head"] if unmeasured else []
        if not_compared:
            verdict = f"{'; '.join(not_compared)}; {verdict} compared"
        if report.unreached:
            verdict += f"; {plural(len(report.unreached), 'test')} not A/B-tested"
        undecided = report.unreached or report.with_verdict("inconclusive")
        mark = "❌" if (regressed and not accepted) or failed or missing else "⚠️" if undecided or regressed else "✅"
        title = f"{mark} A/B on one runner: {verdict}"
    lines = [
        *([f"Stopped: {code(stopped)}", ""] if not harmless(stopped) else []),
        *(f"- **failed on the head** (not compared): {code(failure_text(n, how))}" for n, how in failed.items()),
        *(f"- **measured on the base, not on the head** (not compared): {code(n)}" for n in missing),
        *(
            f"- failed on the base (not compared): {code(failure_text(n, how))}"
            for n, how in report.failed_in.get("base", {}).items()
        ),
        *([""] if report.failed_in or missing else []),
    ]
    if not report.tests and not report.rounds:  # nothing was timed: no intervals to speak of
        lines += [f"Head {code(report.head)} against base {code(report.base)}: no round run.", ""]
    else:
        lines += _rounds_lines(report)
    lines += _ab_rows(report, folded)
    if regressed or failed or missing or report.unreached:
        return [f"### {title}", "", *lines, ""]
    return [f"<details><summary>{title}</summary>", "", *lines, "", "</details>", ""]


def _rounds_lines(report: ABReport) -> list[str]:
    """How the A/B's rounds ran and how a timing was judged."""
    from .ab import rounds_text

    return [
        f"Head {code(report.head)} against base {code(report.base)} on "
        f"{code(report.device) if report.device else 'no device'}: {plural(report.rounds, 'round')} interleaved.",
        "",
        "<details><summary>How the rounds ran and how a timing was judged</summary>",
        "",
        f"{rounds_text(report, said)}; head/base with {report.confidence:.0%} intervals (exact signed-rank"
        + ("; Student's t below 6 rounds" if report.held else "")
        + ("; the hull of each pair of processes' interval" if report.processes > 1 else "")
        + "); a "
        "regression or improvement lies wholly beyond "
        + (
            f"±{report.min_effect:.0%}."
            if report.min_effect is not None
            else "each metric's minimum effect (device time ±1%, host timings ±3%)."
        ),
        "",
        "</details>",
        "",
    ]


def _ab_rows(report: ABReport, folded: frozenset[str] = frozenset()) -> list[str]:
    """Per test that did not stay unchanged, its counts and timings; the unchanged, the tests of one side, those not
    A/B-tested and those judged against the baseline. A test ``folded`` into an entry above is only named."""
    from .ab import ratio_text, verdict_note

    lines: list[str] = []
    rows: list[str] = []
    quiet: list[str] = []
    above = [test.nodeid for test in report.tests if test.nodeid in folded]
    if above:
        lines += [f'In the entries above ("in the A/B"): {", ".join(code(n) for n in above)}', ""]
    for test in report.tests:
        if test.nodeid in folded:
            continue
        cells = [
            f"| {code(test.nodeid, cell=True)} | {code(c.metric, cell=True)} | {value_text(c.metric, c.base)} → "
            f"{value_text(c.metric, c.head)} (exact) | {said(c.status, cell=True)} |"
            for c in test.counts
        ]
        cells += [
            f"| {code(test.nodeid, cell=True)} | {code(name, cell=True)} | {ratio_text(v)} | "
            f"{said(v.verdict + verdict_note(v, name), cell=True)} |"
            for name, v in sorted(test.timings.items(), key=lambda item: timing_order(item[0]))
            if v.verdict != Status.UNCHANGED
        ]
        cells += [
            f"| {code(test.nodeid, cell=True)} | {code(name, cell=True)} | | {said(why, cell=True)} |"
            for name, why in sorted(test.unmeasured.items())
        ]
        if not cells or (test.verdict == Status.UNCHANGED and not test.unmeasured):
            quiet.append(test.nodeid)
            continue
        rows.extend(cells)
        rows.extend(
            f"| {code(test.nodeid, cell=True)} | what changed | {code(line, cell=True)} | |"
            for line in test.explanation.lines()
        )
    if rows:
        lines += ["| test | metric | head/base [interval] or base → head | verdict |", "|---|---|---|---|", *rows, ""]
    if quiet:
        lines += [f"{plural(len(quiet), 'test')} unchanged: {', '.join(code(n) for n in quiet)}", ""]
    if ids := report.only_in.get("head"):
        lines.append(f"Measured only in the head, not compared: {', '.join(code(i) for i in ids)}")
    if report.unreached:
        lines.append(
            f"⚠️ Not A/B-tested, undecided (the time budget ran out first): "
            f"{', '.join(code(nodeid) for nodeid in report.unreached)}"
        )
    if report.judged_by_baseline:
        files = ", ".join(code(Path(f).name) for f in sorted(set(report.judged_by_baseline.values())))
        tests = ", ".join(code(nodeid) for nodeid in report.judged_by_baseline)
        lines.append(f"Judged against the baseline ({files}), not A/B-tested: {tests}")
    return lines


def render(
    run: RunComparison,
    limit: int = sys.maxsize,
    full_report: str | None = None,
    ab: ABReport | None = None,
    links: SiteLinks | None = None,
    every_row: bool = True,
) -> tuple[str, bool]:
    """The Markdown (with the A/B report ``ab`` when given), cut to ``limit`` bytes of UTF-8 at line ends if needed;
    returns (text, truncated). Without ``every_row`` (a comment) the tests that passed unchanged are counted, their
    rows left to ``full_report``."""
    lines = [line for block in sections(run, ab, links, every_row, full_report) for line in block]
    text = "\n".join(lines) + "\n"
    if _bytes(text) <= limit:
        return text, False
    where = f" The full report is {code(full_report)}." if full_report else ""
    kept: list[str] = []
    size = 0
    for index, line in enumerate(lines):
        note = f"\n_Report truncated: {len(lines) - index} more lines left out to fit a comment.{where}_\n"
        if size + _bytes(line) + 1 + _bytes(note) + len(_CLOSE) * _open(kept) > limit:
            if kept and kept[-1].startswith("<details>"):
                kept.pop()
            kept.extend(["", "</details>"] * _open(kept))
            return "\n".join(kept) + "\n" + note, True
        kept.append(line)
        size += _bytes(line) + 1
    return text, False


#: What closes a collapsed block that a cut leaves open.
_CLOSE = "\n\n</details>"


def _bytes(text: str) -> int:
    """A forge counts a comment's size; counted here in UTF-8 bytes, never less than its characters."""
    return len(text.encode("utf-8"))


def _open(lines: Sequence[str]) -> int:
    """How many collapsed blocks are open at the end of ``lines``."""
    return sum(k.startswith("<details>") for k in lines) - sum(k == "</details>" for k in lines)
