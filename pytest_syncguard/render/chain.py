"""A verdict and its chain, in the order a reviewer reads them: a failed budget (its limit, what was measured, its top
sync sites), then each regressed test's chain, most important link first: what changed in the code's behaviour
(sync sites that appeared or grew, counts and their contributors that moved) -> what it did on the GPU (idle time
per token, the widest gap and its cause, busy fraction, device time per token) -> what it cost (tokens per second,
judged A/B or not judged, said which).

Pure data: each line is a sequence of parts, plain text of ours, :class:`Code` (text from the run: an identifier, a
path, a source line), :class:`Word` (a status or cause from the run) or :class:`Site` (a file and line), that the
Markdown comment and the text report render each in their own way (:mod:`.markdown`; :func:`plain` for pytest's
report, :func:`.terminal.consequence_lines`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..analysis.collectives import CollectiveWaits
from ..analysis.explain import Explanation
from ..document.comparison import Change, Comparison
from ..judge.cases import RunCase
from ..judge.run import CaseComparison, RunComparison
from ..metrics import DEVICE_TIME, metric
from ..signals import ITEMIZED
from ..signals.collectives import WAIT_METRIC
from ..status import Status
from ..words import plural

if TYPE_CHECKING:
    from ..document.ab import ABReport

#: How many sites a failed budget and a link of a chain show at most.
SHOWN = 3


@dataclass(frozen=True)
class Code:
    """Text from the run, shown verbatim: never markup, a mention or a link."""

    text: str


@dataclass(frozen=True)
class Site:
    """A call site: ``path:line`` (a link to the line where the repository and commit are known)."""

    path: str
    line: int


@dataclass(frozen=True)
class Word:
    """A word from the run that names something of ours (a status, a cause, a kind): shown as it is where it is one
    (:func:`harmless`), else as :class:`Code`. The run is untrusted: it may hold anything."""

    text: str


Part = str | Code | Site | Word
Line = tuple[Part, ...]


@dataclass(frozen=True)
class Entry:
    """One test's verdict and what explains it, link by link (a link may be empty: not measured)."""

    nodeid: str
    device: str
    verdict: str
    """"failed budget" or "regression"."""
    links: tuple[tuple[str, tuple[Line, ...]], ...]
    """(title, lines) in order: for a budget, ``budget`` and ``top sites``; for a regression, ``regressed``, ``what
    changed``, ``on the GPU`` and ``what it cost``."""


def budget_entries(run: RunComparison) -> list[Entry]:
    """Each test whose budgets failed: every broken budget (limit and measurement), then its top sync sites."""
    entries = []
    for verdict in run.cases:
        case = verdict.case
        if not case.broken:
            continue
        budgets = tuple((Code(text),) for text in case.broken)
        sites = tuple(
            (
                f"{plural(s.count, 'sync')} at ",
                Site(s.path, s.line),
                " in ",
                Code(s.function),
                ": ",
                Code(s.code or s.site),
            )
            if s.path
            else (f"{plural(s.count, 'sync')} at ", Code(s.site))
            for s in case.sites[:SHOWN]
        )
        links = [("budget", budgets)] + ([("top sites", sites)] if sites else []) + _ranks_link(case)
        entries.append(Entry(case.nodeid, case.device_slug, "failed budget", tuple(links)))
    return said_once(entries, "top sites")


def regression_entries(run: RunComparison, ab: ABReport | None = None) -> list[Entry]:
    """Each test that regressed against its baseline: its chain, what changed -> on the GPU -> what it cost (from
    the A/B ``ab`` of the same test where it has one)."""
    entries = []
    for verdict in run.with_status(Status.REGRESSION):
        comparison = verdict.comparison
        changed = behaviour(comparison)
        if not changed and not _counts_regressed(comparison):
            changed = (("no count moved (syncs, operators, launches, copies, recompiles): the change is in time",),)
        elif not changed and verdict.case.details is None:
            changed = (
                (
                    "not in a JUnit file, which carries no sync sites or counters' contributors: report the run's "
                    "results document (pytest --syncguard-json) in its place",
                ),
            )
        links = (
            ("regressed", regressed_lines(comparison)),
            ("what changed", changed),
            ("on the GPU", gpu_lines(verdict)),
            ("what it cost", cost_lines(verdict, ab)),
            *((("in the A/B", found),) if (found := ab_link(ab, verdict.case.nodeid)) else ()),
            *_ranks_link(verdict.case, comparison),
        )
        entries.append(Entry(verdict.case.nodeid, verdict.case.device_slug, Status.REGRESSION, links))
    return said_once(entries, "what changed")


def said_once(entries: list[Entry], title: str) -> list[Entry]:
    """Tests that share one cause (the same link ``title``: the same sync site, the same counts moved) say it once:
    a later test points to the first that said it."""
    first: dict[tuple[Line, ...], str] = {}
    kept = []
    for entry in entries:
        links = []
        for name, lines in entry.links:
            if name == title and lines:
                if lines in first:
                    lines = (("the same as in ", Code(first[lines])),)
                else:
                    first[lines] = entry.nodeid
            links.append((name, lines))
        kept.append(Entry(entry.nodeid, entry.device, entry.verdict, tuple(links)))
    return kept


def ab_link(ab: ABReport | None, nodeid: str) -> tuple[Line, ...]:
    """The A/B's finding for one test, folded into its entry (the A/B's own section then leaves the test out): its
    verdict, the counts that moved from base to head, and its timings' head/base ratios that did not stay unchanged."""
    from .ab import ratio_text

    test = None if ab is None else next((t for t in ab.tests if t.nodeid == nodeid), None)
    if ab is None or test is None:
        if ab is not None and nodeid in ab.unreached:
            return (("not A/B-tested: the time budget ran out first",),)
        return ()
    moved = "; ".join(
        f"{c.metric} {value_text(c.metric, c.base)} → {value_text(c.metric, c.head)}"
        for c in test.counts
        if c.status != Status.UNCHANGED
    )
    timed = "; ".join(
        f"{name} {ratio_text(v)} {v.verdict}"
        for name, v in sorted(test.timings.items())
        if v.verdict != Status.UNCHANGED
    )
    found = ", ".join(part for part in (moved and f"counts {moved}", timed and f"head/base {timed}") if part)
    return (
        (
            Word(test.verdict),
            f" on this runner, head against base{': ' if found else ''}",
            *((Code(found),) if found else ()),
        ),
    )


def rank_lines(case: RunCase) -> tuple[Line, ...]:
    """Each rank of a test the ranks of a launch measured together: its verdict and what it said (its failed
    budgets, its error, why it left no result)."""
    return tuple(
        (f"rank {r.rank} of {case.world_size}: ", Word(r.verdict), *((": ", Code("; ".join(r.said))) if r.said else ()))
        for r in case.ranks
    )


def collective_lines(waits: CollectiveWaits | str, comparison: Comparison | None = None) -> tuple[Line, ...]:
    """A launch's collectives matched: the straggler, the collective the others waited longest at and its call site,
    then each rank's wait and transfer per token (or why they could not be matched); with the test's ``comparison``,
    the longest wait against the baseline's."""
    if isinstance(waits, str):
        return ((Code(waits),),)
    lines: list[Line] = []
    if waits.straggler is not None:
        lines.append(
            (
                f"rank {waits.straggler} is the straggler: the other ranks waited {waits.late_us:.0f} µs per "
                "token for it",
            )
        )
    else:
        lines.append(
            (
                f"no straggler: the ranks arrived within {waits.late_us:.0f} µs per token of each other (under "
                "half the transfers' time: the skew of ranks doing the same work)",
            )
        )
    where: Line = (" ", Code(waits.worst_site)) if waits.worst_site else ()
    of = (
        f"collective {waits.worst + 1} of {waits.per_step} in a step"
        if waits.per_step
        else (f"collective {waits.worst + 1} of {waits.matched}")
    )
    times = f"{waits.worst_times} of {plural(waits.matched // waits.per_step, 'step')}" if waits.per_step else "it"
    lines.append(
        (
            f"longest wait at {of}",
            *where,
            f": {waits.worst_wait_us:.0f} µs (median), rank {waits.worst_last} arriving last in {times}",
        )
    )
    change = next((c for c in comparison.changes if c.metric == WAIT_METRIC), None) if comparison else None
    if change is not None and change.old is not None and change.new is not None:
        lines.append(
            (
                f"longest wait of a rank {change.old:.0f} → {change.new:.0f} µs per token against the baseline "
                f"({change.new - change.old:+.0f} µs, {_judged(change)})",
            )
        )
    lines.extend((Code(said),) for said in waits.said)
    ranks = waits.ranks or tuple(range(len(waits.wait_us)))
    for rank, wait, transfer in zip(ranks, waits.wait_us, waits.transfer_us, strict=False):
        lines.append(
            (
                f"rank {rank}: waiting {wait:.0f} µs, transfer {transfer:.0f} µs per token (split by the ",
                Word(waits.clock),
                ")",
            )
        )
    return tuple(lines)


#: How the chain shows each signal's joined record (:attr:`..signals.base.Kept.join`): its link's title, and its lines
#: given the test's comparison with its baseline.
JOINED: dict[str, tuple[str, Callable[[Any, Comparison | None], tuple[Line, ...]]]] = {
    "collectives": ("collective waits", collective_lines),
}


def joined_links(case: RunCase, comparison: Comparison | None = None) -> list[tuple[str, tuple[Line, ...]]]:
    """A test's links from its ranks' records joined, by signal (titled; a signal the chain shows no way of is left
    out)."""
    return [
        (JOINED[name][0], JOINED[name][1](record, comparison)) for name, record in case.joined.items() if name in JOINED
    ]


def _ranks_link(case: RunCase, comparison: Comparison | None = None) -> list[tuple[str, tuple[Line, ...]]]:
    return ([("ranks", rank_lines(case))] if case.ranks else []) + joined_links(case, comparison)


def _counts_regressed(comparison: Comparison) -> bool:
    return any((spec := metric(c.metric)) is not None and spec.counted for c in comparison.of(Status.REGRESSION))


def regressed_lines(comparison: Comparison) -> tuple[Line, ...]:
    """The metrics that regressed, in one line: baseline -> now, and what a noisy one was judged within."""
    parts: list[Part] = []
    for change in comparison.of(Status.REGRESSION):
        old, new = value_text(change.metric, change.old), value_text(change.metric, change.new)
        within = f", judged within {change.tolerance:.1%}" if change.tolerance is not None else ""
        parts += [*(["; "] if parts else []), Code(change.metric), f" {old} → {new}{_relative(change)}{within}"]
    return (tuple(parts),) if parts else ()


def behaviour(comparison: Comparison) -> tuple[Line, ...]:
    """The sync sites that changed, then the largest contributors of the counts that moved."""
    lines: list[Line] = list(site_lines(comparison.explanation))
    for mover in comparison.explanation.movers[:SHOWN]:
        old = "-" if mover.old is None else str(mover.old)
        new = "-" if mover.new is None else str(mover.new)
        counter = ITEMIZED.get(mover.counter)
        named: Part = f"{counter}: " if counter is not None else Code(mover.counter)
        lines.append((named, *((": ",) if counter is None else ()), Code(mover.item), f" {old} → {new}"))
    return tuple(lines)


def site_lines(explanation: Explanation) -> tuple[Line, ...]:
    lines: list[Line] = []
    for change in explanation.sites:
        site = change.site
        where: Line = (Site(site.path, site.line), " in ", Code(site.function))
        code: Line = (": ", Code(site.code)) if site.code else ()
        lines.append(
            (
                "sync site ",
                Word(change.status),
                " at ",
                *where,
                *code,
                " (",
                Word(site.kind),
                f"): {change.old} → {plural(change.new, 'sync')}",
            )
        )
    return tuple(lines)


def gpu_lines(verdict: CaseComparison) -> tuple[Line, ...]:
    """Idle time per token (from device time and busy fraction, baseline and now), now by cause, the widest gap with
    its cause, busy fraction and device time per token, each said judged or not."""
    changes = {c.metric: c for c in verdict.comparison.changes}
    device, busy = changes.get(DEVICE_TIME), changes.get("busy_fraction")
    lines: list[Line] = []
    idle = _idle_per_token(device, busy)
    if idle is not None:
        old, new = idle
        lines.append((f"idle {new - old:+.0f} µs per token ({old:.0f} → {new:.0f} µs)",))
    timeline = verdict.case.timeline
    by_cause = timeline.idle_us_by_cause if timeline is not None else {}
    total = sum(by_cause.values())
    if total > 0:
        causes: list[Part] = []
        for cause, us in by_cause.items():
            if us > 0:
                causes += [*([", "] if causes else []), Word(cause), f" {us / total:.0%}"]
        lines.append(("idle now by cause: ", *causes, " (every gap of the run the timeline shows)"))
    if timeline is not None and timeline.top_gaps:
        gap = timeline.top_gaps[0]
        lines.append(
            (
                f"widest gap {gap.duration_us:.0f} µs: ",
                Code(gap.cause),
                *((" ", Code(gap.detail)) if gap.detail else ()),
            )
        )
    if busy is not None and busy.old is not None and busy.new is not None:
        lines.append((f"busy fraction {busy.old:.3f} → {busy.new:.3f} ({_judged(busy)})",))
    if device is not None and device.old is not None and device.new is not None:
        within = f" within {device.tolerance:.1%}" if device.tolerance is not None else ""
        lines.append(
            (
                f"device time per token {device.old:.0f} → {device.new:.0f} µs{_relative(device)}: "
                f"{device.status}{within}",
            )
        )
    return tuple(lines)


def cost_lines(verdict: CaseComparison, ab: ABReport | None = None) -> tuple[Line, ...]:
    """Tokens per second: the A/B's judged ratio of time where the A/B measured the test, else against the
    baseline, judged or not."""
    judged = _ab_timing(ab, verdict.case.nodeid)
    if judged is not None:
        return judged
    rate = next((c for c in verdict.comparison.changes if c.metric == "tokens_per_second"), None)
    if rate is None or rate.old is None or rate.new is None or rate.status == "not judged":
        # A host timing against another host's recording, or none kept (a history): no cost this run resolves.
        if "tokens_per_second" not in verdict.case.metrics:
            return ()
        return (
            (
                "tokens/s not judged: a host timing, judged A/B on one runner (`syncguard ab`); this run alone "
                "resolves no cost",
            ),
        )
    return ((f"{rate.old:.0f} → {rate.new:.0f} tokens/s{_relative(rate)} ({_judged(rate)})",),)


def _ab_timing(ab: ABReport | None, nodeid: str) -> tuple[Line, ...] | None:
    from .ab import ratio_text

    if ab is None:
        return None
    test = next((t for t in ab.tests if t.nodeid == nodeid), None)
    if test is None or "seconds" not in test.timings:
        return None
    v = test.timings["seconds"]
    return ((f"time per run {ratio_text(v)}: ", Word(v.verdict), f", judged A/B on this runner ({v.rounds} rounds)"),)


def _idle_per_token(device: Change | None, busy: Change | None) -> tuple[float, float] | None:
    """(baseline, now) of the device's idle time per token: its busy time per token over its busy fraction, less
    the busy time."""
    if device is None or busy is None:
        return None
    values = (device.old, busy.old, device.new, busy.new)
    if any(v is None or v <= 0 for v in values):
        return None
    d_old, b_old, d_new, b_new = (float(v) for v in values if v is not None)
    return d_old * (1 / b_old - 1), d_new * (1 / b_new - 1)


def _judged(change: Change) -> str:
    if change.status == "not judged":
        return "not judged: a host timing, judged A/B on one runner"
    within = f" within {change.tolerance:.1%}" if change.tolerance is not None else ""
    return f"{change.status}{within}"


def _relative(change: Change) -> str:
    return "" if change.relative is None else f" ({change.relative:+.1%})"


def value_text(name: str, value: float | None) -> str:
    """A metric's value as the report shows it, with its unit ("-" for none)."""
    if value is None:
        return "-"
    spec = metric(name)
    return spec.format(value) if spec else f"{value:g}"


def plain(line: Line) -> str:
    return "".join(p if isinstance(p, str) else f"{p.path}:{p.line}" if isinstance(p, Site) else p.text for p in line)
