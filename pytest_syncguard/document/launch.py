"""The processes of one launch (torchrun's ranks) judged as one run: each rank writes its own results document
(``r.rank1.json``) saying which rank of how many wrote it, and :func:`join` makes one test of each test's ranks.

A rank's document is written as it goes (:class:`Launch`: after each test, with the test in flight), so a rank that
died leaves what it finished and the test it died in. A test's joined metrics are its worst rank's, each metric
by its own direction (the most syncs of any rank, the slowest rank's device time): the strictest rank fails a
budget, and a baseline keeps the launch's worst. A rank that failed, erred or left no result fails the test, named.
No torch here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..analysis.counts import Items
from ..metrics import DEVICE_TIME, Metrics, metric, rounded
from ..signals import SIGNALS
from ..status import Status
from .measured import MeasuredTest, RankResult

#: The verdict of a rank that left no result of a test.
MISSING = "missing"
#: How bad a rank's own verdict is, for the comparison a joined test keeps (the worst rank's).
_WORSE: dict[str, int] = {Status.REGRESSION: 3, Status.IMPROVEMENT: 1}


class LaunchError(ValueError):
    """Documents that cannot be one launch's (two of one rank); the message names both files."""


@dataclass(frozen=True)
class Launch:
    """What a results document says of the process of a launch that wrote it."""

    rank: int
    world_size: int
    finished: bool = True
    """The process wrote it at the end of its session; False: it has not (yet), and may have died."""
    in_flight: str | None = None
    """The test the process had started and not finished when it last wrote (None: between tests)."""
    device_slug: str = ""
    """The slug its tests on its GPU are filed under (:func:`..environment.slug_for`): that of a test no rank
    finished."""
    launch_id: str = ""
    """What the processes of its launch share (:func:`..ranks.launch_id`); "": not known (an older version wrote
    it)."""


@dataclass(frozen=True)
class RankDocument:
    """One rank's results document as read: where it came from, what it says of its rank, and its tests."""

    path: str
    launch: Launch
    tests: Sequence[MeasuredTest]
    stopped_at: str | None = None
    """Where its process was when its launcher stopped it (SIGTERM, :func:`..ranks.stopped_at`); None: it was not
    stopped so."""
    versions: tuple[str, str] = ("", "")
    """The syncguard and torch versions that wrote it: the ranks of one launch run one of each."""


def _no_result(rank: int, world: int, document: RankDocument | None, nodeid: str) -> str:
    """Why ``rank`` has no result of ``nodeid``, from what its document says (``document`` None: it has none)."""
    who = f"rank {rank} of {world}"
    if document is None:
        return f"{who} left no results file (it died before writing one, or its file was not given to the report)"
    launch = document.launch
    if launch.in_flight == nodeid:
        if document.stopped_at is not None:
            return (
                f"{who} was stopped during this test by its launcher (SIGTERM: torchrun stops the other ranks when "
                f"one fails), at {document.stopped_at}"
            )
        return (
            f"{who} died during this test (no stop signal: killed or crashed): its results ({document.path}) stop "
            "with it in flight"
        )
    if not launch.finished:
        last = f" (it died during {launch.in_flight})" if launch.in_flight else ""
        return f"{who} did not reach this test: its results ({document.path}) stop before it{last}"
    return f"{who} did not run this test (not collected or deselected there)"


def _said(test: MeasuredTest) -> tuple[str, ...]:
    """What a rank's result has to say: its error, its failed budgets."""
    broken = tuple(c.text for c in test.checks if c.held is False)
    return ((test.error,) if test.error else ()) + broken


def _worst(values: Sequence[float], name: str) -> float:
    spec = metric(name)
    return min(values) if spec is not None and spec.higher_is_better else max(values)


def _metrics(tests: Sequence[MeasuredTest]) -> Metrics:
    """Each metric of any rank, its worst rank's value (and that rank's runs)."""
    values: dict[str, float] = {}
    runs: dict[str, int] = {}
    for name in dict.fromkeys(n for t in tests for n in t.metrics.values):
        having = [t for t in tests if name in t.metrics.values]
        worst = _worst([t.metrics.values[name] for t in having], name)
        values[name] = worst
        runs[name] = next(t.metrics.runs.get(name, 1) for t in having if t.metrics.values[name] == worst)
    return Metrics(values, runs)


def _signals_joined(present: Mapping[int, MeasuredTest], metrics: Metrics) -> tuple[Metrics, dict[str, Any]]:
    """Each signal's records of the ranks joined (:attr:`..signals.base.Kept.join`), with the metrics they add."""
    values, runs = dict(metrics.values), dict(metrics.runs)
    joined: dict[str, Any] = {}
    for signal in SIGNALS:
        if signal.kept is None or signal.kept.join is None:
            continue
        records = {r: t.records[signal.name] for r, t in present.items() if signal.name in t.records}
        found, added = signal.kept.join(records)
        if found is not None:
            joined[signal.name] = found
        values.update({name: rounded(value) for name, value in added.items()})
        runs.update(dict.fromkeys(added, 1))
    return Metrics(values, runs), joined


def _counted_top(tests: Sequence[MeasuredTest]) -> dict[str, Items]:
    """Each itemized counter's largest contributors, those of the rank whose count is the joined one (the largest)."""
    names = dict.fromkeys(name for t in tests for name in t.counted_top)
    return {
        name: max(
            (t for t in tests if name in t.counted_top), key=lambda t: t.metrics.values.get(name, 0.0)
        ).counted_top[name]
        for name in names
    }


def _joined(
    key: tuple[str, str], world: int, present: Mapping[int, MeasuredTest], missing: Mapping[int, str]
) -> MeasuredTest:
    """One test from its ranks' results: the worst rank's metrics, every rank's failed budgets and errors named by
    rank, and each rank's part."""
    ranks = tuple(
        RankResult(r, present[r].verdict, _said(present[r])) if r in present else RankResult(r, MISSING, (missing[r],))
        for r in range(world)
    )
    if not present:  # every rank died in it, or before it
        why = "; ".join(missing[r] for r in sorted(missing))
        return MeasuredTest(
            key[1],
            "",
            None,
            0,
            Metrics({}, {}),
            0,
            {},
            (),
            error=why,
            device_slug=key[0],
            world_size=world,
            ranks=ranks,
        )
    measured = [r for r in sorted(present) if present[r].outcome is None]
    first = present[measured[0] if measured else min(present)]  # a rank that skipped says nothing of the others
    tests = [present[r] for r in sorted(present)]
    checks = tuple(
        replace(c, text=f"rank {r}: {c.text}") for r in sorted(present) for c in present[r].checks if c.held is False
    )
    broke = {c.budget for c in checks}
    checks += tuple(c for c in first.checks if c.held is not False and c.budget not in broke)
    errors = [f"rank {r}: {present[r].error}" for r in sorted(present) if present[r].error]
    errors += [missing[r] for r in sorted(missing)]

    outcomes = [t.outcome for t in tests if t.outcome is not None]
    compared = [t.comparison for t in tests if t.comparison is not None]
    comparison = max(compared, key=lambda c: _WORSE.get(c.status, 2)) if compared else None
    slowest = max(tests, key=lambda t: t.metrics.values.get(DEVICE_TIME, 0.0))
    metrics, joined = _signals_joined(present, _metrics(tests))
    syncing = max(tests, key=lambda t: t.syncs)
    return replace(
        first,
        metrics=metrics,
        checks=checks,
        error="; ".join(errors) or None,
        outcome="failed" if "failed" in outcomes else None if measured else outcomes[0] if outcomes else None,
        comparison=comparison,
        sites=syncing.sites,
        counted_top=_counted_top(tests),
        timeline=slowest.timeline,
        notes=tuple(dict.fromkeys(n for t in tests for n in t.notes)),
        world_size=world,
        ranks=ranks,
        joined=joined,
    )


def _other_launch(one: RankDocument, other: RankDocument) -> str | None:
    """Why two rank documents of one world size are not of one launch, if they say so."""
    ids = one.launch.launch_id, other.launch.launch_id
    if all(ids) and ids[0] != ids[1]:
        return f"launch {ids[0]!r} against {ids[1]!r}"
    for name, mine, theirs in zip(("syncguard", "torch"), one.versions, other.versions, strict=True):
        if mine and theirs and mine != theirs:
            return f"{name} {mine} against {theirs}"
    return None


def join(documents: Sequence[RankDocument]) -> list[MeasuredTest]:
    """One test for each test the ranks of a launch measured, in the order of the ranks' documents: the documents
    of every launch given (one per world size); :class:`LaunchError` where two documents are one rank's."""
    launches: dict[int, dict[int, RankDocument]] = {}
    for document in documents:
        world, rank = document.launch.world_size, document.launch.rank
        other = launches.setdefault(world, {}).get(rank)
        if other is not None:
            raise LaunchError(
                f"{other.path} and {document.path} are both rank {rank} of {world}: give the report one "
                "launch's files at a time"
            )
        for peer in launches[world].values():
            if (problem := _other_launch(peer, document)) is not None:
                raise LaunchError(
                    f"{peer.path} and {document.path} are not one launch's: {problem}; give the report "
                    "one launch's files at a time"
                )
        launches[world][rank] = document
    joined: list[MeasuredTest] = []
    for world, by_rank in sorted(launches.items()):
        keys = dict.fromkeys((t.device_slug, t.nodeid) for r in sorted(by_rank) for t in by_rank[r].tests)
        slug = next((d.launch.device_slug for d in by_rank.values() if d.launch.device_slug), "")
        slug = slug or next(iter(keys), ("unknown", ""))[0]
        # A test every rank died in (or before) is in no rank's tests: the ranks that had it in flight name it.
        keys.update(dict.fromkeys((slug, d.launch.in_flight) for _, d in sorted(by_rank.items()) if d.launch.in_flight))
        found = {r: {(t.device_slug, t.nodeid): t for t in d.tests} for r, d in by_rank.items()}
        for key in keys:
            present = {r: tests[key] for r, tests in found.items() if key in tests}
            missing = {r: _no_result(r, world, by_rank.get(r), key[1]) for r in range(world) if r not in present}
            joined.append(_joined(key, world, present, missing))
    return joined
