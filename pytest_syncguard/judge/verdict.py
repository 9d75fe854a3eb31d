"""One verdict of a run and every count in it: what the comment's headline, ``syncguard report``'s last line, its
exit status and the sections below the headline all say.

A test fails the run for each reason it has (a failed budget, a regression against its baseline, a failure of its
own, a regression in the A/B, a failure or a skip on the A/B's head, or no measurement on the head at all); it is
counted once however many it has, and each reason counts the tests that have it (so the reasons of one run may
add up to more than its failed tests). A change accepted as intended (``report --accept``) keeps its regressions,
against the baseline and in the A/B, as accepted: said, not failing the run. No torch here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..status import Status
from ..words import plural
from .loosened import Loosened
from .run import RunComparison

if TYPE_CHECKING:
    from ..document.ab import ABReport

#: The reasons a test fails the run, in the order the report shows their sections.
FAILED_BUDGET = "with failed budgets"
REGRESSED = "regressed against the baseline"
FAILED = "failed in the run"
AB_REGRESSED = "regressed in the A/B"
AB_FAILED = "failed on the A/B's head"
AB_UNMEASURED = "not measured on the A/B's head"
REASONS = (FAILED_BUDGET, REGRESSED, FAILED, AB_REGRESSED, AB_FAILED, AB_UNMEASURED)
#: The reasons an intended change accepts (``report --accept``): a budget, a failure or a head that was not measured
#: still fail the run.
ACCEPTABLE = (REGRESSED, AB_REGRESSED)

Key = tuple[str, str]
"""(device slug, node id) of a test; an A/B test's device is the A/B runner's."""


@dataclass(frozen=True)
class Verdict:
    """Which tests fail the run and why, the tests judged, the A/B's undecided tests and the baseline values the
    change loosened."""

    failing: Mapping[Key, tuple[str, ...]]
    """Each failing test and its reasons (in :data:`REASONS` order)."""
    tests: int
    """The tests judged: the run's, and the A/B's that the run did not measure."""
    undecided: tuple[str, ...] = ()
    """Node ids of the A/B's tests whose verdict stayed inconclusive."""
    loosened: tuple[Loosened, ...] = field(default_factory=tuple)
    unread: tuple[str, ...] = ()
    """The files written by another version whose parts this one does not know (read without them, not judged)."""
    history_unread: bool = False
    """The default branch's history was asked for and could not be read: judged without it."""
    accepted: Mapping[Key, tuple[str, ...]] = field(default_factory=dict)
    """The tests whose regressions the change accepts (:attr:`.run.RunComparison.accepted`), and those reasons:
    reported, not failing the run (a failed budget or a failed test still fails it)."""
    accepted_why: str | None = None
    """Why they are accepted."""

    @classmethod
    def of(cls, run: RunComparison, ab: ABReport | None = None) -> Verdict:
        """The verdict of ``run`` with its A/B ``ab``, and the baseline values the run found loosened."""
        reasons: dict[Key, list[str]] = {}

        def fail(key: Key, reason: str) -> None:
            found = reasons.setdefault(key, [])
            if reason not in found:
                found.append(reason)

        for case in run.cases:
            if case.case.broken:
                fail(case.key, FAILED_BUDGET)
            if case.comparison.status == Status.REGRESSION:
                fail(case.key, REGRESSED)
        for case in run.failed_tests:
            if not case.case.broken:
                fail(case.key, FAILED)
        keys = {case.key for case in run.cases}
        undecided: tuple[str, ...] = ()
        if ab is not None:
            device = ab.device
            for test in ab.with_verdict(Status.REGRESSION):
                fail((device, test.nodeid), AB_REGRESSED)
            for nodeid, how in ab.failed_in.get("head", {}).items():
                fail((device, nodeid), AB_FAILED if {"failed", "error"} & set(how) else AB_UNMEASURED)
            for nodeid in ab.only_in.get("base", ()):
                fail((device, nodeid), AB_UNMEASURED)
            keys |= {(device, t.nodeid) for t in ab.tests}
            undecided = tuple(t.nodeid for t in ab.with_verdict("inconclusive")) + tuple(ab.unreached)
            keys |= {(device, nodeid) for nodeid in ab.unreached}
        keys |= set(reasons)
        accepted: dict[Key, tuple[str, ...]] = {}
        if run.accepted is not None:  # an intended change: its regressions are said, and pass
            for key, found in list(reasons.items()):
                if kept := [r for r in found if r not in ACCEPTABLE]:
                    reasons[key] = kept
                else:
                    accepted[key] = tuple(found)
                    del reasons[key]
        ordered = {key: tuple(sorted(found, key=REASONS.index)) for key, found in sorted(reasons.items())}
        return cls(
            ordered,
            len(keys),
            undecided,
            tuple(run.loosened),
            tuple(sorted(run.unknown)),
            run.history_unavailable is not None,
            dict(sorted(accepted.items())),
            run.accepted,
        )

    @property
    def failed(self) -> bool:
        return bool(self.failing)

    def with_reason(self, reason: str) -> list[Key]:
        return [key for key, found in self.failing.items() if reason in found]

    def sentence(self) -> str:
        """The verdict in words: ``4 of 9 tests failed: 3 with failed budgets, 2 regressed against the baseline``,
        or ``no regressions: 9 tests passed``, with what is undecided or loosened after it."""
        if self.failing:
            reasons = ", ".join(f"{len(self.with_reason(r))} {r}" for r in REASONS if self.with_reason(r))
            text = f"{len(self.failing)} of {plural(self.tests, 'test')} failed: {reasons}"
        elif self.accepted:
            text = f"{plural(self.tests, 'test')} passed"
        else:
            text = f"no regressions: {plural(self.tests, 'test')} passed"
        if self.accepted:
            text += "; " if self.failing else ", "
            text += f"{len(self.accepted)} with regressions accepted ({self.accepted_why})"
        if self.undecided:
            text += f"; {plural(len(self.undecided), 'A/B verdict')} undecided"
        if self.loosened:
            text += f"; this change loosens {plural(len(self.loosened), 'baseline value')}"
        if self.unread:
            text += f"; {plural(len(self.unread), 'file')} of another version read in part"
        if self.history_unread:
            text += "; the default branch's history could not be read"
        return text

    def headline(self) -> str:
        """The comment's first line: the sentence, marked failed (❌), to look at (⚠️) or passed (✅)."""
        cautions = self.undecided or self.loosened or self.unread or self.history_unread or self.accepted
        mark = "❌" if self.failing else "⚠️" if cautions else "✅"
        return f"**{mark} syncguard: {self.sentence()}**"

    def exit_status(self, fail_on_regression: bool) -> int:
        """1 where ``--fail-on-regression`` asks for it and a test fails the run, else 0."""
        return 1 if fail_on_regression and self.failing else 0
