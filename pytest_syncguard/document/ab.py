"""The A/B report: each test's head against base, as ``syncguard ab`` writes it and the report, the comment and the
verdict read it (records only: the rounds are :mod:`pytest_syncguard.gate.ab`'s, the text
:mod:`pytest_syncguard.render.ab`'s)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..analysis.explain import Explanation
from ..codec import CodecError, decode, encode, read_document
from ..metrics import metric
from ..status import JUDGED, Status
from . import upgrades

#: Verdicts of a timing A/B.
REGRESSION, IMPROVEMENT, UNCHANGED, INCONCLUSIVE = (
    Status.REGRESSION,
    Status.IMPROVEMENT,
    Status.UNCHANGED,
    Status.INCONCLUSIVE,
)


@dataclass(frozen=True)
class RatioVerdict:
    """Head/base of one metric: ratio estimate, interval, verdict and why."""

    rounds: int
    ratio: float | None
    low: float | None
    high: float | None
    confidence: float | None
    verdict: str
    reason: str = ""
    min_effect: float | None = None
    """The smallest relative change this metric was judged against."""
    resolvable: float | None = None
    """The smallest relative change an interval as wide as this one lies wholly beyond the minimum effect for: what
    these rounds could have called a regression or improvement (None: no interval)."""
    spread: float | None = None
    """Of an inconclusive metric that more rounds cannot settle: the relative half-width its interval would still
    have after the most rounds, wider than the minimum effect (None: more rounds may settle it)."""
    method: str = ""
    """The interval's: "" the exact signed-rank one, "t" Student's t over the rounds' log ratios (fewer rounds than
    the signed-rank one needs; ``early``)."""
    pairs: tuple[float, ...] = ()
    """Of rounds from more than one pair of processes: each pair's head/base estimate (the interval is the hull of
    theirs); empty for one pair."""

    @property
    def undecided(self) -> bool:
        """More rounds may still change it: inconclusive, and not past settling (:attr:`spread`)."""
        return self.verdict == INCONCLUSIVE and self.spread is None


def settled(counts: Sequence[str], timings: Sequence[RatioVerdict]) -> bool:
    """Whether more rounds could not change a test's verdict (``counts``: its counts' statuses): one of its metrics
    is a conclusive regression, or no timing is still undecided."""
    regression = REGRESSION in counts or any(t.verdict == REGRESSION for t in timings)
    return regression or not any(t.undecided for t in timings)


SCHEMA = "pytest-syncguard/ab"


#: Version 2: records by :mod:`.codec` (a changed site's fields under ``site``); version 1 still reads.
SCHEMA_VERSION = 2


MAX_PROCESSES = 8


#: The verdicts of a count or a timing this version knows; any other word (another version wrote it) is read as a
#: regression, never as a pass.
KNOWN_VERDICTS = JUDGED | {Status.VARIES, INCONCLUSIVE}


@dataclass(frozen=True)
class CountChange:
    metric: str
    base: float
    head: float
    status: str
    """regression, improvement or "varies" (the value was not the same in every round of one side)."""


@dataclass(frozen=True)
class HeadAgainstBase:
    """One test, head against base."""

    nodeid: str
    counts: tuple[CountChange, ...]
    timings: Mapping[str, RatioVerdict]
    explanation: Explanation = field(default_factory=Explanation)
    unmeasured: Mapping[str, str] = field(default_factory=dict)
    """Metrics that were not judged over every round it ran, and why (a side did not measure them)."""

    DERIVED: ClassVar[tuple[str, ...]] = ("verdict",)

    @property
    def settled(self) -> bool:
        """More rounds could not change its verdict (:func:`pytest_syncguard.gate.ab.stats.settled`)."""
        return settled([c.status for c in self.counts], list(self.timings.values()))

    @property
    def verdict(self) -> str:
        """The worst of its verdicts; a host timing that this runner cannot resolve (inconclusive past settling)
        gives way to a device-side timing judged conclusively: the test reads as its device verdict, with the host
        timing's note beside it. A verdict word this version does not know reads as a regression."""
        judged = {n for n, v in self.timings.items() if not _is_host(n) and v.verdict != INCONCLUSIVE}
        statuses = {c.status for c in self.counts} | {
            v.verdict
            for n, v in self.timings.items()
            if not (judged and _is_host(n) and v.verdict == INCONCLUSIVE and not v.undecided)
        }
        if statuses - KNOWN_VERDICTS:  # a word of another version this one does not know: never a pass
            return Status.REGRESSION
        for status in (Status.REGRESSION, "varies", Status.IMPROVEMENT, INCONCLUSIVE):
            if status in statuses:
                return status
        return Status.UNCHANGED


@dataclass(frozen=True)
class ABReport:
    base: str
    head: str
    rounds: int
    """The rounds run (a test settled earlier ran fewer: its verdicts say how many)."""
    min_effect: float | None
    """The minimum effect asked for; None: each metric's own (:func:`min_effect_of`)."""
    confidence: float
    device: str
    command: tuple[str, ...]
    tests: tuple[HeadAgainstBase, ...]
    only_in: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Tests measured on one side only ("base" or "head")."""
    stopped: str = ""
    """Why the rounds ended: every test settled, the most rounds run, or the time budget."""
    warm_sides: bool = False
    """Each side was one pytest kept warm across the rounds; False: a pytest per side per round (as every A/B
    before there were warm sides)."""
    elapsed_s: float | None = None
    """Seconds from the A/B's start to the end of its last round (None in reports written before it was kept)."""
    judged_by_baseline: Mapping[str, str] = field(default_factory=dict)
    """Tests the A/B left out because the suite judged their device time against a baseline (node id -> its
    file): their verdict is that comparison's (``--skip-judged``)."""
    timed_rounds: bool = False
    """The rounds after the first measured timed runs only (``--syncguard-timings-only``): the counts are the
    first round's."""
    timed_runs: int | None = None
    """Timed runs per test in those rounds (None: as each test asks)."""
    host_timings: bool = True
    """Host timings were judged; False: counts and device-side metrics only (``--no-host-timings``)."""
    failed_in: Mapping[str, Mapping[str, Mapping[str, tuple[int, ...]]]] = field(default_factory=dict)
    """Per side ("base" or "head"), the tests whose call raised in a round: node id -> how (failed, error or
    skipped) -> the rounds (:func:`failures`). Not compared: on the head, a verdict of its own, the report's
    first."""
    held: bool = False
    """Test by test: each test's rounds ran one after another, its fixtures kept set up on each side, a later round
    its call alone, warm (:func:`run_held`); False: every test once per round."""
    head_first: str = ""
    """The results file whose measurements were the head's first round (the suite's run of the same head on this
    runner, ``--head-results``), or ""."""
    unreached: tuple[str, ...] = ()
    """Tests that the time budget left without a round: not A/B-tested, undecided."""
    costs: Mapping[str, tuple[float, float | None]] = field(default_factory=dict)
    """Per test held: the seconds of its first round on both sides (set-up, warm-up and the measured call), and
    the mean seconds of a later round on both sides (None where it ran none)."""
    processes: int = 1
    """Pairs of processes (a warm base and head pytest each) whose rounds were judged: held rounds take them in
    turn, and a timing's interval is the hull of theirs (:func:`pytest_syncguard.gate.ab.stats.judge`)."""

    def with_verdict(self, verdict: str) -> list[HeadAgainstBase]:
        return [t for t in self.tests if t.verdict == verdict]

    @property
    def regressions(self) -> int:
        """Regressed tests, and tests the base measured that the head did not (failed, errored or skipped in a
        round, or not run at all): what ``--fail-on-regression`` fails on. A head that skips its regressing test
        does not pass."""
        unmeasured = set(self.failed_in.get("head", {})) | set(self.only_in.get("base", ()))
        return len(self.with_verdict(Status.REGRESSION)) + len(unmeasured)


def _is_host(name: str) -> bool:
    spec = metric(name)
    return spec is not None and spec.host


def document(report: ABReport) -> dict[str, Any]:
    """The A/B file's content: the report's record, schema-versioned."""
    data: dict[str, Any] = encode(report)
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, **data}


def read_report(path: Path) -> ABReport:
    """The report of an A/B JSON file; ValueError naming what is wrong on anything else (it may be untrusted)."""
    data, version = read_document(path, SCHEMA, SCHEMA_VERSION, "syncguard A/B report")
    try:
        report = decode(ABReport, upgrades.ab_v1(data) if version == 1 else data)
    except CodecError as exc:
        raise ValueError(f"A/B report is malformed: {exc}") from exc
    problems = [
        f"rounds {report.rounds}: not a number of rounds (0 or more)" if report.rounds < 0 else "",
        f"confidence {report.confidence}: not a probability between 0 and 1" if not 0 < report.confidence < 1 else "",
        f"min_effect {report.min_effect}: not a fraction > 0"
        if report.min_effect is not None and not 0 < report.min_effect < 1e6
        else "",
        f"processes {report.processes}: not a number of pairs of processes (1 to {MAX_PROCESSES})"
        if not 1 <= report.processes <= MAX_PROCESSES
        else "",
    ]
    problems += [f"{test.nodeid}: {problem}" for test in report.tests if (problem := _impossible(test)) is not None]
    if any(problems):
        raise ValueError(f"A/B report is malformed: {'; '.join(p for p in problems if p)}")
    return report


def _impossible(test: HeadAgainstBase) -> str | None:
    """What in a test's A/B no rounds can give (a ratio below zero or not finite, an interval that ends before it
    starts or misses its estimate, rounds below zero, a count below zero), if anything."""
    for change in test.counts:
        if not all(math.isfinite(v) and v >= 0 for v in (change.base, change.head)):
            return f"{change.metric}: {change.base} -> {change.head}: no count"
    for name, timing in test.timings.items():
        numbers = [
            v
            for v in (timing.ratio, timing.low, timing.high, timing.resolvable, timing.spread, *timing.pairs)
            if v is not None
        ]
        if timing.rounds < 0 or not all(math.isfinite(v) and v >= 0 for v in numbers):
            return f"{name}: a ratio, an interval or rounds no A/B can give"
        if timing.low is not None and timing.high is not None and timing.low > timing.high:
            return f"{name}: its interval [{timing.low}, {timing.high}] ends before it starts"
        ratio, low, high = timing.ratio, timing.low, timing.high
        if ratio is not None and low is not None and high is not None and not low <= ratio <= high:
            return f"{name}: its estimate x{timing.ratio} lies outside its interval"
    return None
