"""A run's verdicts as a Markdown PR comment: a one-line verdict, regressions first, then improvements, new
tests, tests missing from the run and environment changes, the rest in collapsible details.

Everything that comes from the run (test ids, metric text, file names) is escaped: ASCII punctuation is
backslash-escaped (no Markdown, no HTML), ``@`` and ``#`` get a zero-width space (no mentions, no issue
links), and control characters and newlines are dropped. The comment is cut to fit GitHub's limit, with a
note that points to the full report.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ..comparison import Change
from ..metrics import DEVICE_TIME, metric, timing_order
from .run import CaseComparison, RunComparison

if TYPE_CHECKING:
    from ..ab import ABReport

#: GitHub refuses comment bodies over 65,536 characters; leave room for the hidden marker.
COMMENT_LIMIT = 65_536 - 512
_ZWSP = "\u200b"
_PUNCTUATION = set(string.punctuation) - {"@", "#"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
MAX_TEXT = 300
#: Lists of new or missing tests longer than this are collapsed.
LONG_LIST = 20


def escape(text: object) -> str:
    """Run-supplied text made inert in GitHub Markdown (tables included)."""
    cleaned = _CONTROL.sub(" ", str(text))[:MAX_TEXT]
    out = []
    for char in cleaned:
        if char in _PUNCTUATION:
            out.append("\\" + char)
        elif char in "@#":
            out.append(char + _ZWSP)
        else:
            out.append(char)
    return "".join(out)


def _value(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    spec = metric(name)
    return escape(spec.format(value) if spec else f"{value:g}")


def _change(change: Change) -> str:
    if change.delta is None:
        return "-"
    relative = "" if change.relative is None else f" ({change.relative:+.1%})"
    return escape(f"{change.delta:+.4g}{relative}")


def _change_rows(rows: Iterable[tuple[CaseComparison, Change]]) -> list[str]:
    lines = ["| test | device | metric | baseline → now | change |", "|---|---|---|---|---|"]
    for verdict, change in rows:
        lines.append(
            f"| {escape(verdict.case.nodeid)} | {escape(verdict.case.device_slug)} | {escape(change.metric)} | "
            f"{_value(change.metric, change.old)} → {_value(change.metric, change.new)} | {_change(change)} |"
        )
    return lines


def _tolerance(change: Change) -> str:
    """``1.5% (spread ±0.04% over 3 recordings on 1 host)``: what a noisy metric was judged within."""
    if change.tolerance is None:
        return "-"
    return escape(f"{change.tolerance:.1%}" + (f" ({change.spread.describe()})" if change.spread else ""))


def device_time_block(run: RunComparison) -> list[str]:
    """Every test's device time per token against its baseline, regressions first, with the tolerance it was
    judged within and the recorded spread that set it: the gate's most sensitive timing, shown first."""
    order = {"regression": 0, "improvement": 1, "not compared": 2, "unchanged": 3}
    rows = sorted(
        ((v, c) for v in run.cases for c in v.comparison.changes if c.metric == DEVICE_TIME),
        key=lambda pair: (order.get(pair[1].status, 2), pair[0].case.nodeid),
    )
    if not rows:
        return []
    lines = [
        "### Device time per token",
        "",
        "| test | device | baseline → now | change | judged within | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for verdict, change in rows:
        lines.append(
            f"| {escape(verdict.case.nodeid)} | {escape(verdict.case.device_slug)} | "
            f"{_value(change.metric, change.old)} → {_value(change.metric, change.new)} | {_change(change)} | "
            f"{_tolerance(change)} | {escape(change.status)} |"
        )
    return [*lines, ""]


def _pairs(verdicts: Sequence[CaseComparison], status: str) -> list[tuple[CaseComparison, Change]]:
    return [(v, c) for v in verdicts for c in v.comparison.of(status)]


def _listing(title: str, tests: Sequence[tuple[str, str]]) -> list[str]:
    """A list of tests; a long one collapsed."""
    items = [f"- {escape(nodeid)} on {escape(device)}" for device, nodeid in tests]
    if len(items) <= LONG_LIST:
        return [title, "", *items, ""]
    return [title, "", f"<details><summary>{len(items)} tests</summary>", "", *items, "", "</details>", ""]


def headline(run: RunComparison) -> str:
    regressed = run.with_status("regression")
    counts = (
        f"{len(run.cases)} tests on {', '.join(escape(d) for d in run.devices) or 'no device'}: "
        f"{len(regressed)} regressed, {len(run.with_status('improvement'))} improved, "
        f"{len(run.with_status('new'))} new, {len(run.missing)} missing"
    )
    failed = len(run.failed_tests)
    if failed:
        counts += f", {failed} failed their budgets"
    if regressed:
        return f"**❌ syncguard: {len(regressed)} regressions** ({counts})"
    if failed:
        return f"**❌ syncguard: {failed} tests failed** ({counts})"
    return f"**✅ syncguard: no regressions** ({counts})"


def ab_lines(report: ABReport) -> list[str]:
    """The A/B of a change on one runner: its verdict, then per test that did not stay unchanged its counts, what
    changed in them, and each timing's head/base ratio with its interval; the unchanged tests collapsed."""
    from ..ab import failure_text, judged_text, ratio_text, rounds_text, verdict_note

    regressed = report.with_verdict("regression")
    failed = report.failed_in.get("head", {})
    mark = "❌" if regressed or failed else "✅"
    verdict = f"{len(regressed)} regressions in {len(report.tests)} tests"
    if failed:
        verdict = f"{len(failed)} tests failed on the head; {verdict} compared"
    lines = [
        f"### {mark} A/B on one runner: {verdict}",
        "",
        *(f"- **failed on the head** (not compared): {escape(failure_text(n, how))}" for n, how in failed.items()),
        *(
            f"- failed on the base (not compared): {escape(failure_text(n, how))}"
            for n, how in report.failed_in.get("base", {}).items()
        ),
        *([""] if report.failed_in else []),
        f"Head {escape(report.head)} against base {escape(report.base)} on {escape(report.device)}: "
        f"{escape(rounds_text(report))}; head/base with "
        f"{report.confidence:.0%} intervals (exact signed-rank); a regression or improvement lies wholly beyond "
        + (
            f"±{report.min_effect:.0%}."
            if report.min_effect is not None
            else "each metric's minimum effect (device time ±1%, host timings ±3%)."
        ),
        "",
        "| test | metric | base → head | head/base [interval] | verdict |",
        "|---|---|---|---|---|",
    ]
    quiet: list[str] = []
    for test in report.tests:
        rows = [
            f"| {escape(test.nodeid)} | {escape(c.metric)} | {_value(c.metric, c.base)} → {_value(c.metric, c.head)} "
            f"| exact | {escape(c.status)} |"
            for c in test.counts
        ]
        rows += [
            f"| {escape(test.nodeid)} | {escape(name)} | | {escape(ratio_text(v))} | {escape(v.verdict)}"
            f"{escape(verdict_note(v, name))} |"
            for name, v in sorted(test.timings.items(), key=lambda item: timing_order(item[0]))
            if v.verdict != "unchanged"
        ]
        rows += [f"| {escape(test.nodeid)} | {escape(name)} | | | {escape(why)} |" for name, why in
                 sorted(test.unmeasured.items())]  # fmt: skip
        if not rows or (test.verdict == "unchanged" and not test.unmeasured):
            quiet.append(test.nodeid)
            continue
        lines.extend(rows)
        lines.extend(
            f"| {escape(test.nodeid)} | what changed | {escape(line)} | | |" for line in test.explanation.lines()
        )
    lines.append("")
    if quiet:
        lines += [f"<details><summary>{len(quiet)} tests unchanged</summary>", ""]
        lines += [f"- {escape(nodeid)}" for nodeid in quiet] + ["", "</details>", ""]
    for side, ids in sorted(report.only_in.items()):
        lines.append(f"Measured only in the {escape(side)}, not compared: {', '.join(escape(i) for i in ids)}")
    if report.judged_by_baseline:
        lines.append(f"Judged against the baseline, not A/B-tested: {escape(judged_text(report))}")
    return lines


def _count_regressed(verdict: CaseComparison) -> bool:
    return any((spec := metric(c.metric)) is not None and spec.counted for c in verdict.comparison.of("regression"))


def sections(run: RunComparison, ab: ABReport | None = None) -> list[list[str]]:
    """The report's blocks in order of importance (each a list of lines)."""
    blocks: list[list[str]] = [[headline(run), ""]]
    device_time = device_time_block(run)
    if device_time:
        blocks.append(device_time)
    regressed = _pairs(run.with_status("regression"), "regression")
    if regressed:
        blocks.append(["### Regressions", "", *_change_rows(regressed), ""])
        explained = [v for v in run.with_status("regression") if v.comparison.explanation]
        if explained:
            lines = ["What changed in the counts:", ""]
            for v in explained:
                lines.append(f"- {escape(v.case.nodeid)} on {escape(v.case.device_slug)}:")
                lines.extend(f"  - {escape(line)}" for line in v.comparison.explanation.lines())
            blocks.append([*lines, ""])
        unexplained = [v.case.nodeid for v in run.with_status("regression") if not v.comparison.explanation
                       and v.case.details is None and _count_regressed(v)]  # fmt: skip
        if unexplained:
            blocks.append([
                f"What changed in the counts of {', '.join(map(escape, unexplained))}: not in a JUnit file, which "
                "carries no sync sites or counters' contributors; the run's results document (pytest --syncguard "
                "--syncguard-json, read by syncguard report in its place) says which sites and operators moved.",
                "",
            ])  # fmt: skip
    failed = run.failed_tests
    if failed:
        lines = ["### Failed tests", "", "| test | device | verdict |", "|---|---|---|"]
        lines.extend(
            f"| {escape(v.case.nodeid)} | {escape(v.case.device_slug)} | {escape(v.case.verdict)} |" for v in failed
        )
        blocks.append([*lines, ""])
    if ab is not None:
        blocks.append([*ab_lines(ab), ""])
    improved = _pairs(run.with_status("improvement"), "improvement")
    if improved:
        blocks.append(
            [
                "### Improvements",
                "",
                *_change_rows(improved),
                "",
                "Record them with `pytest --syncguard --syncguard-update-baselines` on the same GPU model.",
                "",
            ]
        )
    new = [(v.case.device_slug, v.case.nodeid) for v in run.with_status("new")]
    if new:
        blocks.append(_listing("### New tests (no baseline entry)", new))
    if run.missing:
        blocks.append(_listing("### In the baselines, not in this run", run.missing))
    host = _pairs(run.cases, "not judged")
    if host:
        blocks.append(
            [
                "<details><summary>Host timings, not judged against the baseline (recorded on another runner; "
                "judged A/B on one runner)</summary>",
                "",
                *_change_rows(host),
                "",
                "</details>",
                "",
            ]
        )
    if run.environment:
        lines = ["### Environment differs from the baseline's", ""]
        for device, changes in sorted(run.environment.items()):
            what = ", ".join(f"{escape(k)} {escape(old)} → {escape(new)}" for k, (old, new) in sorted(changes.items()))
            lines.append(f"- {escape(device)}: {what}")
        blocks.append([*lines, ""])
    details = ["<details><summary>All measured tests</summary>", "", "| test | device | verdict | baseline |"]
    details.append("|---|---|---|---|")
    details.extend(
        f"| {escape(v.case.nodeid)} | {escape(v.case.device_slug)} | {escape(v.case.verdict)} | "
        f"{escape(v.comparison.status)} |"
        for v in run.cases
    )
    blocks.append([*details, "", "</details>", ""])
    return blocks


def render(
    run: RunComparison, limit: int = COMMENT_LIMIT, full_report: str | None = None, ab: ABReport | None = None
) -> tuple[str, bool]:
    """The Markdown (with the A/B report ``ab`` when given), cut to ``limit`` characters at line ends if needed;
    returns (text, truncated)."""
    lines = [line for block in sections(run, ab) for line in block]
    text = "\n".join(lines) + "\n"
    if len(text) <= limit:
        return text, False
    where = f" The full report is {escape(full_report)}." if full_report else ""
    kept: list[str] = []
    size = 0
    for index, line in enumerate(lines):
        note = f"\n_Report truncated: {len(lines) - index} more lines left out to fit a GitHub comment.{where}_\n"
        if size + len(line) + 1 + len(note) > limit:
            if kept and kept[-1].startswith("<details>"):
                kept.pop()
            opened = sum(k.startswith("<details>") for k in kept) - sum(k == "</details>" for k in kept)
            kept.extend(["", "</details>"] * opened)
            return "\n".join(kept) + "\n" + note, True
        kept.append(line)
        size += len(line) + 1
    return text, False
