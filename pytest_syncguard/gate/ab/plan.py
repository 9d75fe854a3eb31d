"""``syncguard ab``: base and head of a change measured on one runner, in interleaved rounds, and judged.

Each round runs the same pytest command's tests once in a checkout of the base (a git worktree of ``--base``) and
once in the head (the working directory), in alternating order (base first in odd rounds), each side in one pytest
kept warm across the rounds, or in a new one per round (:mod:`.sides`). Then, per test measured on both sides:

- counts (syncs, operators, launches, ...) are compared exactly, head against base, with what changed (sync sites
  that appeared or grew, the counters' contributors that moved);
- every other metric is judged from its per-round pairs (:mod:`.stats`): head/base with a confidence
  interval and a verdict, regression, improvement, unchanged or inconclusive, against a minimum effect (each
  metric's own unless one is asked for), and what the rounds could resolve where it is inconclusive.

The rounds go where they matter (:class:`Plan`): once a test's verdict is settled it is left out of the next
rounds, and the A/B ends when every test is settled, or its rounds or time are spent.

No torch here: the sides are pytest processes of their own."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...analysis.explain import Explanation, explain
from ...document.ab import (
    ABReport,
    CountChange,
    HeadAgainstBase,
    RatioVerdict,
)
from ...document.measured import MeasuredTest
from ...files import ignored_folder
from ...judge.comparison import count_status
from ...metrics import DEVICE_TIME, metric
from ...render.ab import duration
from ...signals import EXPLAIN
from ...status import JUDGED, MOVED
from .sides import ABError, Side, WarmSide, fresh_sides, hold_at_once, process_name, warm_sides
from .stats import fewest_rounds, judge, rounds_needed

#: The most rounds, unless --rounds says otherwise; a test stops once its verdict is settled.
DEFAULT_ROUNDS = 12
DEFAULT_MIN_EFFECT = 0.03
DEFAULT_CONFIDENCE = 0.95
DEFAULT_PROCESSES = 2
"""Warm pytests per side for held rounds: two pairs, so that one process's own offset is not read as a change."""
#: Judged through another metric (tokens/s is tokens over time): not listed twice.
DERIVED = frozenset({"tokens_per_second"})


#: The signals that stop an A/B at once: Ctrl-C in its terminal, a CI system cancelling its job, its terminal closed.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class ABInterrupted(Exception):
    """The A/B was told to stop (SIGINT or SIGTERM); its running pytest was ended and the base's worktree removed.
    ``finished``: the runs (``round1-base``, ...) whose results are in ``out``; ``running``: the one it stopped."""

    def __init__(self, signum: int, running: str | None = None, finished: Sequence[str] = (), out: Path | None = None):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.running, self.finished, self.out = signum, running, tuple(finished), out

    @property
    def exit_status(self) -> int:
        """The shell's convention for a process ended by a signal: 128 + its number (130 for SIGINT)."""
        return 128 + self.signum

    def lines(self) -> list[str]:
        """What it had done, and where that is, in words."""
        name = signal.Signals(self.signum).name
        done = ", ".join(self.finished) if self.finished else "no run"
        lines = [
            f"syncguard ab: interrupted by {name}"
            + (f" during {self.running}" if self.running else "")
            + "; the base's worktree is removed"
        ]
        lines.append(f"syncguard ab: finished before it: {done}")
        if self.finished and self.out is not None:
            lines.append(f"syncguard ab: partial results (JSON results, JUnit file and log of each run) in {self.out}")
        return lines


@contextmanager
def stopping_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`ABInterrupted` in the block (once: a second signal while the A/B cleans up
    is ignored), and the handlers before it are restored on exit. Outside the main thread, signals cannot be
    caught: the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = False

    def stop(signum: int, frame: object) -> None:
        nonlocal raised
        if not raised:
            raised = True
            raise ABInterrupted(signum)

    previous = {number: signal.signal(number, stop) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


# -- comparing the two sides --------------------------------------------------------------------------------------


def compare_sides(
    base: Sequence[Mapping[str, MeasuredTest]],
    head: Sequence[Mapping[str, MeasuredTest]],
    *,
    min_effect: float | None,
    confidence: float,
    max_rounds: int | None = None,
    host_timings: bool = True,
    counted_rounds: int | None = None,
    early: bool = False,
    processes: int = 1,
) -> tuple[list[HeadAgainstBase], dict[str, tuple[str, ...]]]:
    """Per test measured on both sides, over the rounds that measured it on both: counts exactly, the other
    metrics by paired rounds against ``min_effect`` (None: each metric's own, :func:`min_effect_of`), each noting
    whether ``max_rounds`` rounds could settle it; host timings only with ``host_timings``; counts over the first
    ``counted_rounds`` (None: every round); ``early``: Student's t intervals where the rounds are too few for the
    signed-rank one (:func:`.stats.judge`); ``processes``: the pairs of processes that ran held
    rounds (:func:`pair_of_round`). A test whose call raised in a round of a side is not compared:
    :func:`failures` names it."""
    raised = {nodeid for tests in failures(base, head).values() for nodeid in tests}
    seen_base = (set().union(*base) if base else set()) - raised
    seen_head = (set().union(*head) if head else set()) - raised
    only_in = {
        side: tuple(sorted(ids))
        for side, ids in (("base", seen_base - seen_head), ("head", seen_head - seen_base))
        if ids
    }
    tests = []
    for nodeid in sorted(seen_base & seen_head):
        rounds = [
            (i, b[nodeid], h[nodeid])
            for i, (b, h) in enumerate(zip(base, head, strict=True), 1)
            if nodeid in b and nodeid in h
        ]
        if not rounds:  # measured on each side, never in the same round
            continue
        paired = [(x, y) for _, x, y in rounds]
        tests.append(
            _head_against_base(
                nodeid,
                paired,
                min_effect,
                confidence,
                [i for i, _, _ in rounds],
                max_rounds,
                host_timings,
                counted_rounds,
                early,
                processes,
            )
        )
    return tests, only_in


def failures(
    base: Sequence[Mapping[str, MeasuredTest]], head: Sequence[Mapping[str, MeasuredTest]]
) -> dict[str, dict[str, dict[str, tuple[int, ...]]]]:
    """Per side, the tests whose call raised in one of its rounds: node id -> how (its verdict) -> the rounds."""
    found: dict[str, dict[str, dict[str, tuple[int, ...]]]] = {}
    for side, rounds in (("base", base), ("head", head)):
        how: dict[str, dict[str, list[int]]] = {}
        for number, results in enumerate(rounds, 1):
            for nodeid, test in results.items():
                if test.error is not None or test.outcome is not None:
                    how.setdefault(nodeid, {}).setdefault(test.verdict, []).append(number)
        if how:
            found[side] = {
                nodeid: {v: tuple(n) for v, n in verdicts.items()} for nodeid, verdicts in sorted(how.items())
            }
    return found


def _suite_results(results: Path, device: str | None, elsewhere: str) -> list[MeasuredTest]:
    """The measured tests of the suite's results file; ValueError names what is wrong with the file, or the other
    devices than ``device`` (a slug; None: any) that measured them, with why that matters (``elsewhere``)."""
    from ...document import file as results_file

    try:
        tests = results_file.read(results)
    except results_file.ResultsError as exc:
        raise ValueError(str(exc)) from exc
    others = sorted({t.device_slug for t in tests if device is not None and t.device_slug != device})
    if others:
        raise ValueError(f"measured on {', '.join(others)}, this runner is {device}: {elsewhere}")
    return tests


def judged_by_baseline(results: Path, device: str | None = None) -> dict[str, str]:
    """The tests of a results file (``pytest --syncguard-json``) whose device time was judged against a baseline
    entry there: node id -> the baseline file. ValueError names what is wrong with the file, results measured on
    another device than ``device`` (a slug; None: any) included."""
    tests = _suite_results(results, device, "a baseline of another GPU model judges nothing here")
    return {
        t.nodeid: t.comparison.file
        for t in tests
        if t.comparison is not None
        and any(c.metric == DEVICE_TIME and c.status in JUDGED for c in t.comparison.changes)
    }


def baselines_changed(judged: Mapping[str, str], base: Path, head: Path) -> set[str]:
    """The tests of ``judged`` (node id -> its baseline file, as the head's run named it) whose entry the head's
    file loosens against the same file of the base's checkout: a change cannot pass by writing its own baseline."""
    from ...judge.baselines import Baseline, BaselineError, read
    from ...judge.loosened import loosened

    found: set[str] = set()
    for file in sorted(set(judged.values())):
        head_file = (head / file).resolve()
        try:
            relative = head_file.relative_to(head.resolve())
        except ValueError:
            continue  # a baselines folder outside the checkout is the same file for both sides
        try:
            was, now = read(base / relative), read(head_file)
        except BaselineError as exc:
            raise ABError(f"--skip-judged: {exc}") from None
        if was is None:
            continue  # the base had no baseline: the head's file is the first, and its tests were judged by it
        changed = {item.nodeid for item in loosened(was, now or Baseline(head_file, was.device, {}, {}))}
        found |= {n for n, f in judged.items() if f == file and n in changed}
    return found


def min_effect_of(name: str, asked: float | None) -> float:
    """The smallest relative change a metric's A/B calls a regression or improvement: the one asked for, else the
    metric's own (device time resolves far less than a host timing), else :data:`DEFAULT_MIN_EFFECT`."""
    if asked is not None:
        return asked
    spec = metric(name)
    return spec.ab_min_effect if spec is not None and spec.ab_min_effect is not None else DEFAULT_MIN_EFFECT


def _head_against_base(
    nodeid: str,
    paired: Sequence[tuple[MeasuredTest, MeasuredTest]],
    min_effect: float | None,
    confidence: float,
    numbers: Sequence[int] | None = None,
    max_rounds: int | None = None,
    host_timings: bool = True,
    counted_rounds: int | None = None,
    early: bool = False,
    processes: int = 1,
) -> HeadAgainstBase:
    """One test over its paired rounds (numbered ``numbers``, default 1, 2, ...): each metric over the rounds that
    measured it on both sides (a count over the first ``counted_rounds`` only, where given: the rounds that
    counted), and why a metric was not, or not in every round."""
    numbers = list(numbers) if numbers is not None else list(range(1, len(paired) + 1))
    b, h = [x for x, _ in paired], [y for _, y in paired]
    counts: list[CountChange] = []
    timings: dict[str, RatioVerdict] = {}
    unmeasured: dict[str, str] = {}
    for name in sorted(set().union(*(m.metrics.values for m in (*b, *h)))):
        spec = metric(name)
        if spec is None or name in DERIVED or (spec.host and not host_timings):
            continue
        measured = [
            (x, y, n) for (x, y), n in zip(paired, numbers, strict=True) if name in x.metrics and name in y.metrics
        ]
        both = [(x, y) for x, y, _ in measured]
        if len(both) < len(paired) and not (spec.counted and both):  # a count is exact: one round that counted it
            unmeasured[name] = _unmeasured(name, paired, numbers, len(both))
        if not both:
            continue
        if spec.counted:
            judged = [(x, y) for x, y, n in measured if counted_rounds is None or n <= counted_rounds] or both
            old = {x.metrics[name] for x, _ in judged}
            new = {y.metrics[name] for _, y in judged}
            if len(old) > 1 or len(new) > 1:
                counts.append(CountChange(name, max(old), max(new), "varies"))
            elif new != old:
                (was,), (now,) = old, new
                counts.append(CountChange(name, was, now, count_status(name, was, now)))
        else:
            pairs = [(x.metrics[name], y.metrics[name]) for x, y in both]
            blocks = [pair_of_round(n, processes) for _, _, n in measured]
            timings[name] = judge(
                pairs,
                higher_is_better=spec.higher_is_better,
                max_rounds=max_rounds,
                min_effect=min_effect_of(name, min_effect),
                confidence=confidence,
                early=early,
                blocks=blocks,
                processes=processes,
            )
    moved = [c.metric for c in counts if c.status in MOVED]
    explanation = explain(b[0].details(), h[0].details(), moved, EXPLAIN) if moved else Explanation()
    return HeadAgainstBase(nodeid, tuple(counts), timings, explanation, unmeasured)


def _unmeasured(
    name: str, paired: Sequence[tuple[MeasuredTest, MeasuredTest]], numbers: Sequence[int], judged: int
) -> str:
    """Why a metric was not judged over every round: ``measured on the head only``, or the rounds that lacked it."""
    on_base = any(name in x.metrics for x, _ in paired)
    on_head = any(name in y.metrics for _, y in paired)
    if not (on_base and on_head):
        return "measured on the base only" if on_base else "measured on the head only"
    if not judged:
        return "never measured by both sides in the same round"
    missing = [n for n, (x, y) in zip(numbers, paired, strict=True) if name not in x.metrics or name not in y.metrics]
    rounds = f"round{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
    return f"not measured by a side in {rounds}: judged over the other {judged}"


# -- running the rounds --------------------------------------------------------------------------------------------


def _git(directory: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True, timeout=300)
    except FileNotFoundError as exc:
        raise ABError("git is not installed: give the base as a checkout with --base-dir") from exc
    except subprocess.TimeoutExpired as exc:
        raise ABError(f"git {' '.join(args)} took over 300 s") from exc
    if done.returncode != 0:
        said = done.stderr.strip()[:500] or f"exit status {done.returncode}, no message"
        raise ABError(f"git {' '.join(args)} in {directory} failed: {said}")
    return done.stdout.strip()


@contextmanager
def worktree(repository: Path, ref: str) -> Iterator[tuple[Path, str]]:
    """A detached worktree of ``ref`` (a clean checkout of it), removed afterwards, also when making it failed or
    was interrupted (git leaves such a worktree locked: it is removed with the lock); yields (folder, commit)."""
    try:
        _git(repository, "rev-parse", "--show-toplevel")
    except ABError:
        raise ABError(
            f"--base {ref}: {repository} is not in a git repository: run it in the head's checkout, or give "
            "the base as a checkout with --base-dir"
        ) from None
    try:
        commit = _git(repository, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except ABError as exc:
        raise ABError(f"--base {ref}: no such commit in {repository}") from exc
    top = Path(_git(repository, "rev-parse", "--show-toplevel")).resolve()
    parent = Path(tempfile.mkdtemp(prefix="syncguard-ab-"))
    folder = parent / "base"
    try:
        _git(repository, "worktree", "add", "--detach", str(folder), commit)
        # Run from a subfolder of the repository, the base runs from the same subfolder of its checkout.
        where = repository.resolve().relative_to(top)
        if not (folder / where).is_dir():
            raise ABError(
                f"--base {ref}: has no folder {where.as_posix()} (the head runs from it): run the A/B from "
                "the repository's top"
            )
        yield folder / where, commit
    finally:
        # Twice --force: a worktree git left locked (an add cut short) is removed too.
        subprocess.run(
            ["git", "-C", str(repository), "worktree", "remove", "--force", "--force", str(folder)],
            capture_output=True,
            timeout=300,
            check=False,
        )
        shutil.rmtree(parent, ignore_errors=True)
        # A worktree whose folder is gone but which git still lists (a remove cut short) is forgotten too.
        subprocess.run(
            ["git", "-C", str(repository), "worktree", "prune"], capture_output=True, timeout=300, check=False
        )


def describe_checkout(directory: Path) -> str:
    """The commit a checkout is at, marked ``+changes`` when its tracked files differ; the folder without git."""
    try:
        commit = _git(directory, "rev-parse", "HEAD")
        dirty = _git(directory, "status", "--porcelain", "--untracked-files=no")
    except ABError:
        return str(directory)
    return commit[:12] + (" +changes" if dirty else "")


@dataclass
class Progress:
    """Rounds done of the most planned, the tests still running and the time spent, as a line before each run. The
    time counts from ``started``; the pace of the runs, from the first run's start (not the sides' start-up)."""

    rounds: int
    say: Callable[[str], object]
    started: float = field(default_factory=time.monotonic)
    finished: list[str] = field(default_factory=list)
    first_run: float | None = None
    """When the first run started (time.monotonic)."""

    def starting(self, index: int, side: str, running: str) -> None:
        done = len(self.finished)
        now = time.monotonic()
        if self.first_run is None:
            self.first_run = now
        elapsed = now - self.started
        pace = f", {duration(self.per_run())} a run" if done else ""
        self.say(
            f"syncguard ab: round {index} of at most {self.rounds}, {side}, {running} ({done} runs done, "
            f"{duration(elapsed)} elapsed{pace})"
        )

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def per_run(self) -> float:
        """The mean time of a finished run, so far."""
        if not self.finished or self.first_run is None:
            return 0.0
        return (time.monotonic() - self.first_run) / len(self.finished)


@dataclass(frozen=True)
class Plan:
    """How long an A/B may go on: at most ``rounds`` rounds and, if given, ``time_budget`` seconds (a round that
    would end past it, at what the last round took for the tests still running, is not started); a test stops once
    its verdict is settled, judged after each round from ``min_rounds`` on with ``min_effect`` and ``confidence``."""

    rounds: int
    min_effect: float | None
    confidence: float
    time_budget: float | None = None
    timed_runs: int | None = None
    """Timed runs per test in each round after the first, after its traced run (None: as each test asks)."""
    host_timings: bool = True
    """Judge host timings (time, tokens/s, gaps, busy fraction); False: counts and device-side metrics only."""
    processes: int = DEFAULT_PROCESSES
    """Warm pytest processes per side for rounds held test by test: each round is one pair's (a base and a head
    process), the pairs in turn, and a timing's verdict needs every pair to agree (:func:`.stats.judge`)."""

    @property
    def min_rounds(self) -> int:
        return min(self.rounds, rounds_needed(self.confidence))


def pair_of_round(number: int, processes: int) -> int:
    """Which pair of processes (a base and a head process, numbered from 1) runs a held test's round ``number``:
    the first round is the first pair's (their holds), the later ones take the pairs in turn."""
    return 1 if number < 2 else (number - 2) % processes + 1


def base_runs_first(number: int, processes: int) -> bool:
    """Whether the base runs first in a held test's later round ``number``: each pair alternates, its first
    replay base first."""
    return (number - 2) // processes % 2 == 0


def run_rounds(
    sides: Mapping[str, Side],
    plan: Plan,
    out: Path,
    *,
    timeout: float,
    progress: Any,
    started: float | None = None,
    left_out: Sequence[str] = (),
) -> tuple[list[dict[str, MeasuredTest]], list[dict[str, MeasuredTest]], list[str]]:
    """Interleaved rounds (base first in odd ones), each without the tests already settled or ``left_out``, until
    every test is settled or the plan's rounds or time are spent; each side's results per round, and why it
    stopped. The first round measures everything; the later ones the timed runs only, where both sides can
    (:attr:`.ab_sides.Side.times_only`). The time counts from ``started`` (the A/B's start: the sides' start-up is
    spent time, but not a round's pace). An interrupt (:class:`ABInterrupted`) is raised again with the run it
    stopped and the runs finished before it."""
    measured: dict[str, list[dict[str, MeasuredTest]]] = {"base": [], "head": []}
    pace = Progress(plan.rounds, progress, time.monotonic() if started is None else started)
    done: list[str] = list(left_out)
    times_only = all(side.times_only for side in sides.values())
    label = None
    stopped = [f"ran the most rounds ({plan.rounds})"]
    next_round = 0.0
    """What the next round will take: the last one's time, for the share of its tests still running."""
    try:
        for index in range(1, plan.rounds + 1):
            if index > 1 and plan.time_budget is not None:
                per_round = next_round
                if pace.elapsed() + per_round > plan.time_budget:
                    stopped = [
                        f"another round ({duration(per_round)}) would pass the time budget "
                        f"({duration(plan.time_budget)})"
                    ]
                    break
            order = ("base", "head") if index % 2 else ("head", "base")
            round_started, ran = time.monotonic(), 0
            for side in order:
                label = f"round{index}-{side}"
                settled_now = len(done) - len(left_out)
                running = f"{settled_now} tests settled" if settled_now else "every test"
                if left_out:
                    running += f", {len(left_out)} judged against the baseline left out"
                pace.starting(index, side, running)
                results = sides[side].run(
                    label, done, timeout, timings_only=times_only and index > 1, repeat=plan.timed_runs
                )
                if not results:
                    raise ABError(f"{label}: no measured test in its results (logs: {out})")
                measured[side].append(results)
                pace.finished.append(label)
                label = None
                ran = max(ran, len(results))
            newly: list[str] = []
            if index >= plan.min_rounds:
                tests, _ = compare_sides(
                    measured["base"],
                    measured["head"],
                    min_effect=plan.min_effect,
                    confidence=plan.confidence,
                    max_rounds=plan.rounds,
                    host_timings=plan.host_timings,
                    counted_rounds=1 if times_only else None,
                )
                failed = {nodeid for tests in failures(measured["base"], measured["head"]).values() for nodeid in tests}
                newly = [t.nodeid for t in tests if t.settled and t.nodeid not in done]
                newly += sorted(failed - set(done) - set(newly))  # a failure is its verdict: no more rounds
                done.extend(newly)
                if newly:
                    progress(f"syncguard ab: settled after {index} rounds: {', '.join(newly)}")
                if (tests or failed) and all(t.settled for t in tests):
                    stopped = [f"every test settled after {index} rounds"]
                    break
            next_round = (time.monotonic() - round_started) * max(ran - len(newly), 0) / max(ran, 1)
    except ABInterrupted as exc:
        if label is not None:  # what the stopped run wrote on its way out is not a round's results; its log stays
            for suffix in (".json", ".xml"):
                (out / f"{label}{suffix}").unlink(missing_ok=True)
        raise ABInterrupted(exc.signum, label, pace.finished, out) from None
    progress(f"syncguard ab: {stopped[0]}, {duration(pace.elapsed())}")
    return measured["base"], measured["head"], stopped


@dataclass(frozen=True)
class FirstRound:
    """The suite's results of the head on this runner, as the head's first round (``--head-results``)."""

    file: str
    tests: Mapping[str, MeasuredTest]


def first_round_of(results: Path, device: str | None = None) -> FirstRound:
    """The measured tests of the suite's results file (``pytest --syncguard-json``), by node id, for the head's
    first round (``--head-results``). ValueError names what is wrong with the file, results measured on another
    device than ``device`` (a slug; None: any) included."""
    tests = _suite_results(results, device, "another GPU model's run is no round of this A/B")
    return FirstRound(str(results), {t.nodeid: t for t in tests})


@dataclass
class _Costs:
    """What the held tests' rounds took so far, for the time budget's reckoning."""

    first: list[float] = field(default_factory=list)
    """Each test's first round, both sides."""
    later: list[float] = field(default_factory=list)
    """Each later round, both sides."""

    def test(self, rounds: int) -> float:
        """A test's first round and ``rounds`` - 1 later ones, at the mean so far."""
        first = sum(self.first) / len(self.first) if self.first else 0.0
        return first + (rounds - 1) * self.round()

    def round(self) -> float:
        return sum(self.later) / len(self.later) if self.later else 0.0


def run_held(
    sides: Mapping[str, WarmSide],
    plan: Plan,
    tests: Sequence[str],
    out: Path,
    *,
    timeout: float,
    progress: Any,
    started: float,
    head_first: Mapping[str, MeasuredTest] | None = None,
) -> tuple[
    list[dict[str, MeasuredTest]],
    list[dict[str, MeasuredTest]],
    str,
    tuple[str, ...],
    dict[str, tuple[float, float | None]],
]:
    """The rounds test by test: each of ``tests`` held on both sides (set up, warmed up and measured once, as
    pytest would: the first round, counts too), then called again warm on each side in turn until its verdict is
    settled or the plan's rounds are spent; then the next test. A later round costs about the test's measured call
    on each side: no set-up, compilation, graph capture or warm-up again. With :attr:`Plan.processes` pairs of
    processes (``sides`` names them by :func:`.ab_sides.process_name`), the first pair's processes run the first
    round, the others then hold the test at once (warm-ups, no round), and the later rounds take the pairs in turn
    (:func:`pair_of_round`, :func:`base_runs_first`).

    ``head_first`` (the suite's results of the same head on this runner) is the head's first round: its hold is
    then a warm-up with the other pairs', no round. The time budget keeps, for each test not yet run, a first round and
    the fewest rounds a verdict needs at the pace so far: a test goes past them only where that leaves enough;
    tests the budget cannot reach are returned as unreached. Returns each side's results per round, why the rounds
    ended, the tests unreached, and what each test's rounds cost (:attr:`ABReport.costs`)."""
    measured: dict[str, list[dict[str, MeasuredTest]]] = {"base": [], "head": []}
    costs = _Costs()
    spent: dict[str, tuple[float, float | None]] = {}
    stopped = f"each test ran until it settled, or {plan.rounds} rounds"
    unreached: tuple[str, ...] = ()
    finished: list[str] = []
    running: list[str] = []
    cut_short: list[str] = []
    """Tests whose rounds the time budget ended before they settled."""
    fewest = min(plan.rounds, fewest_rounds(plan.confidence, plan.processes, early=True))
    """The fewest rounds that may settle a test (Student's t intervals until the signed-rank ones)."""

    def elapsed() -> float:
        return time.monotonic() - started

    def put(side: str, number: int, nodeid: str, results: Mapping[str, MeasuredTest]) -> None:
        for rounds in measured.values():  # both sides as long: their rounds pair up
            rounds.extend({} for _ in range(number - len(rounds)))
        if nodeid in results:
            measured[side][number - 1][nodeid] = results[nodeid]

    def ask(
        side: str, number: int, nodeid: str, hold: bool, repeat: int | None, timings_only: bool = True, pair: int = 1
    ) -> None:
        """A side's hold (set up, warm up, measure) or replay of the test (``repeat`` timed runs; None: the test's
        own) in its process of ``pair``, its results put in round ``number``."""
        name = process_name(side, pair)
        label = f"t{len(spent) + 1}-round{number}-{name}"
        running[:] = [label]
        if hold:
            results = sides[name].hold(label, nodeid, timeout, timings_only=timings_only, repeat=repeat)
        else:
            results = sides[name].replay(label, nodeid, timeout, repeat=repeat)
        running.clear()
        finished.append(label)
        put(side, number, nodeid, results)

    def warm_up(nodeid: str, names: Sequence[str]) -> None:
        """The processes ``names`` hold the test at once: set-ups and warm-ups, no round."""
        holds = {f"t{len(spent) + 1}-hold-{name}": sides[name] for name in names}
        running[:] = list(holds)
        hold_at_once(holds, nodeid, timeout, repeat=plan.timed_runs)
        running.clear()
        finished.extend(holds)

    def rounds_of(nodeid: str) -> dict[str, list[dict[str, MeasuredTest]]]:
        return {side: [{nodeid: r[nodeid]} if nodeid in r else {} for r in rounds] for side, rounds in measured.items()}

    def cut(nodeid: str) -> bool:
        """Its rounds end here: it failed on a side, or a side did not measure it."""
        own = rounds_of(nodeid)
        if not any(own["base"]) or not any(own["head"]):
            return True
        return any(nodeid in tests for tests in failures(own["base"], own["head"]).values())

    def settled_now(nodeid: str) -> bool:
        own = rounds_of(nodeid)
        found, _ = compare_sides(
            own["base"],
            own["head"],
            min_effect=plan.min_effect,
            confidence=plan.confidence,
            max_rounds=plan.rounds,
            host_timings=plan.host_timings,
            counted_rounds=1,
            early=True,
            processes=plan.processes,
        )
        return all(t.settled for t in found)

    def within_budget(seconds: float, after: int) -> bool:
        """Whether ``seconds`` more leave, within the time budget, a first round and the fewest rounds for each of
        the ``after`` tests still to come."""
        if plan.time_budget is None:
            return True
        return elapsed() + seconds + after * costs.test(fewest) <= plan.time_budget

    try:
        for index, nodeid in enumerate(tests):
            after = len(tests) - index - 1
            if index and not within_budget(0.0, 1):  # not even this test's fewest rounds
                unreached = tuple(tests[index:])
                stopped = (
                    f"the time budget ({duration(plan.time_budget or 0)}) left no time for {len(unreached)} "
                    f"tests, at {duration(costs.test(fewest))} each"
                )
                progress(f"syncguard ab: {stopped}: {', '.join(unreached)}")
                break

            began = time.monotonic()
            progress(
                f"syncguard ab: test {index + 1} of {len(tests)}, {nodeid}: first round ({duration(elapsed())} elapsed)"
            )
            on = {side for side in ("base", "head") if nodeid in sides[side].collected}
            # The first round as the suite runs a test (its counts, budgets and own timed runs): each side's hold.
            if "base" in on:
                ask("base", 1, nodeid, hold=True, timings_only=False, repeat=None)
            suite = head_first is not None and nodeid in head_first
            if suite:
                assert head_first is not None
                put("head", 1, nodeid, head_first)
            elif "head" in on:
                ask("head", 1, nodeid, hold=True, timings_only=False, repeat=None)
            number = 1
            if on == {"base", "head"} and plan.rounds > 1 and not cut(nodeid) and not settled_now(nodeid):
                # The other pairs' processes set the test up and warm it, at once; so does the head's where the
                # suite measured it (its device time, right after a warm-up, would pair with no base run).
                others = [
                    process_name(side, pair) for pair in range(2, plan.processes + 1) for side in ("base", "head")
                ]
                if others or suite:
                    warm_up(nodeid, ["head", *others] if suite else others)
            costs.first.append(time.monotonic() - began)
            later: list[float] = []
            while on == {"base", "head"} and not cut(nodeid) and number < plan.rounds:
                if settled_now(nodeid):  # a count that moved settles it at once: it is exact
                    break
                # The fewest rounds are its due; more only where the tests to come keep theirs.
                if not within_budget(costs.round(), after if number >= fewest else 0):
                    cut_short.append(nodeid)
                    break
                number += 1
                round_began = time.monotonic()
                # Each pair in turn, the base first in its first replay: a process's first replay follows another
                # one's run, never its own hold (the run right after a hold is a warm-up's; on an H100 a CUDA
                # graph's ran 5% slower).
                pair = pair_of_round(number, plan.processes)
                for side in ("base", "head") if base_runs_first(number, plan.processes) else ("head", "base"):
                    ask(side, number, nodeid, hold=False, repeat=plan.timed_runs, pair=pair)
                later.append(time.monotonic() - round_began)
                costs.later.append(later[-1])
            spent[nodeid] = (round(costs.first[-1], 3), round(sum(later) / len(later), 3) if later else None)
            each = f", {sum(later) / len(later):.1f}s a later round" if later else ""
            progress(
                f"syncguard ab: {nodeid}: {number} round{'s' if number != 1 else ''} in "
                f"{duration(time.monotonic() - began)} (the first "
                f"{costs.first[-1]:.1f}s{each})"
            )
    except ABInterrupted as exc:
        for stopped_run in running:  # what a stopped run wrote on its way out is not a round's results
            (out / f"{stopped_run}.json").unlink(missing_ok=True)
        raise ABInterrupted(exc.signum, ", ".join(running) or None, finished, out) from None
    if cut_short and not unreached:
        stopped = f"the time budget ({duration(plan.time_budget or 0)}) ended the rounds of {len(cut_short)} tests"
    for rounds in measured.values():  # as many rounds on each side
        rounds.extend({} for _ in range(max(map(len, measured.values())) - len(rounds)))
    return measured["base"], measured["head"], stopped, unreached, spent


def run(
    *,
    base_ref: str | None,
    base_dir: Path | None,
    head: Path,
    pytest_args: Sequence[str],
    plan: Plan,
    out: Path,
    timeout: float = 3600.0,
    fresh_processes: bool = False,
    progress: Any = print,
    judged: Mapping[str, str] | None = None,
    head_first: FirstRound | None = None,
) -> ABReport:
    """The whole A/B: the base's checkout, its sides (one warm pytest each, or ``fresh_processes``: one per side
    per round), the rounds the ``plan`` allows, the comparison. Warm sides that can hold a test run the rounds
    test by test (:func:`run_held`; ``head_first``, the suite's results of this head on this runner, is then the
    head's first round), else every test once per round (:func:`run_rounds`). Tests in ``judged`` (node id -> the
    baseline file that judged it; warm sides only) are left out. SIGINT or SIGTERM stops it at once
    (:class:`ABInterrupted`), its running pytest ended and the base's worktree removed."""
    if (judged or head_first) and fresh_processes:
        option = "--skip-judged" if judged else "--head-results"
        raise ABError(f"{option} needs warm sides (they say what they collected): leave out --fresh-processes")
    pytest_args = relative_paths(pytest_args, head)
    started = time.monotonic()
    with stopping_on_signals():
        try:
            out = ignored_folder(out.resolve())
        except ValueError as exc:
            raise ABError(f"--out: {exc}") from None
        for earlier in [
            *out.glob("round*-*.*"),
            *out.glob("t*-round*-*.*"),
            *out.glob("t*-hold-*.*"),
            *out.glob("base*.log"),
            *out.glob("head*.log"),
            *out.glob("*.stacks.txt"),
        ]:
            earlier.unlink(missing_ok=True)  # a rerun into the same folder: its rounds only
        if plan.rounds < rounds_needed(plan.confidence):
            progress(
                f"syncguard ab: {plan.rounds} rounds cannot give a {plan.confidence:.0%} interval (needs "
                f"{rounds_needed(plan.confidence)}): every timing will be inconclusive"
            )
        with ExitStack() as stack:
            if base_dir is not None:
                base, base_name = base_dir.resolve(), describe_checkout(base_dir.resolve())
            else:
                assert base_ref is not None
                base, commit = stack.enter_context(worktree(head, base_ref))
                base_name = commit[:12]
            folders = {"base": base, "head": head}
            new = new_in_change(pytest_args, head, base)
            args = {"base": [a for a in pytest_args if a not in new], "head": list(pytest_args)}
            if new:
                said = f"{', '.join(new)} {'is' if len(new) == 1 else 'are'} new in this change"
                if not any(_names_a_path(a, base) for a in args["base"]):
                    progress(f"syncguard ab: the base has none of the tests it selects ({said}): nothing to compare")
                    return _without_rounds(
                        base_name, head, plan, pytest_args, f"the base has none of the tests: {said}"
                    )
                progress(f"syncguard ab: {said}: its tests are the head's only, not compared")
            sides = stack.enter_context(
                fresh_sides(folders, args, out)
                if fresh_processes
                else warm_sides(folders, args, out, timeout, progress, plan.processes)
            )
            collected = {n for side in sides.values() for n in side.collected}
            changed = baselines_changed(judged or {}, base, head)
            if changed:
                progress(
                    f"syncguard ab: the change loosens the baseline entries of {', '.join(sorted(changed))}: "
                    "A/B-tested, not left to the baseline it wrote"
                )
            left_out = {n: f for n, f in (judged or {}).items() if n in collected and n not in changed}
            warm = {name: side for name, side in sides.items() if isinstance(side, WarmSide) and side.can_hold}
            held = len(warm) == len(sides)
            unreached: tuple[str, ...] = ()
            costs: dict[str, tuple[float, float | None]] = {}
            if left_out and collected <= set(left_out):
                base_side: list[dict[str, MeasuredTest]] = []
                head_side: list[dict[str, MeasuredTest]] = []
                stopped = [f"every test it selects ({len(left_out)}) was judged against the baseline: no round run"]
                progress(f"syncguard ab: {stopped[0]}")
            elif held:
                order = [
                    *sides["head"].collected,
                    *(n for n in sides["base"].collected if n not in sides["head"].collected),
                ]
                base_side, head_side, reason, unreached, costs = run_held(
                    warm,
                    plan,
                    [n for n in order if n not in left_out],
                    out,
                    timeout=timeout,
                    progress=progress,
                    started=started,
                    head_first=head_first.tests if head_first else None,
                )
                stopped = [reason]
            else:
                if head_first:
                    progress(
                        "syncguard ab: the base's syncguard cannot hold a test across rounds: every round runs "
                        "both sides, the suite's results are not the head's first round"
                    )
                    head_first = None
                base_side, head_side, stopped = run_rounds(
                    sides, plan, out, timeout=timeout, progress=progress, started=started, left_out=sorted(left_out)
                )
            timed_rounds = len(base_side) > 1 and all(side.times_only for side in sides.values())
            elapsed = time.monotonic() - started
    processes = plan.processes if held else 1
    tests, only_in = compare_sides(
        base_side,
        head_side,
        min_effect=plan.min_effect,
        confidence=plan.confidence,
        max_rounds=plan.rounds,
        host_timings=plan.host_timings,
        counted_rounds=1 if timed_rounds else None,
        early=held,
        processes=processes,
    )
    devices = sorted({m.device_slug for r in (*base_side, *head_side) for m in r.values()})
    return ABReport(
        base_name,
        describe_checkout(head),
        len(base_side),
        plan.min_effect,
        plan.confidence,
        ", ".join(devices),
        tuple(pytest_args),
        tuple(tests),
        only_in,
        stopped[0],
        warm_sides=not fresh_processes,
        elapsed_s=elapsed,
        judged_by_baseline=dict(sorted(left_out.items())),
        timed_rounds=timed_rounds,
        timed_runs=plan.timed_runs if timed_rounds else None,
        host_timings=plan.host_timings,
        failed_in=failures(base_side, head_side),
        held=held and bool(base_side),
        head_first=head_first.file if head_first else "",
        unreached=unreached,
        costs=costs,
        processes=processes,
    )


def _names_a_path(arg: str, folder: Path) -> bool:
    """Whether a pytest argument names a file or folder of ``folder`` (``tests/t.py::test`` included)."""
    return not arg.startswith("-") and bool(arg.partition("::")[0]) and (folder / arg.partition("::")[0]).exists()


def new_in_change(pytest_args: Sequence[str], head: Path, base: Path) -> list[str]:
    """The arguments that name a test file or folder of the head that the base does not have (tests the change
    adds): the base's pytest runs without them, and its tests are the head's only."""
    return [arg for arg in pytest_args if _names_a_path(arg, head) and not _names_a_path(arg, base)]


def _without_rounds(base: str, head: Path, plan: Plan, pytest_args: Sequence[str], stopped: str) -> ABReport:
    """The report of an A/B that ran no round (the base has none of the tests it selects)."""
    return ABReport(
        base,
        describe_checkout(head),
        0,
        plan.min_effect,
        plan.confidence,
        "",
        tuple(pytest_args),
        (),
        stopped=stopped,
        warm_sides=True,
        elapsed_s=0.0,
        host_timings=plan.host_timings,
    )


def relative_paths(pytest_args: Sequence[str], head: Path) -> list[str]:
    """The pytest arguments with each absolute path of a test (``/repo/tests/t.py::test``) made relative to the
    head's folder, so that each side runs its own file; ABError for one outside it (both sides would run it)."""
    found = []
    for arg in pytest_args:
        path, separator, rest = arg.partition("::")
        if arg.startswith("-") or not Path(path).is_absolute():
            found.append(arg)
            continue
        try:
            relative = Path(path).resolve().relative_to(head.resolve())
        except ValueError:
            raise ABError(
                f"{arg}: outside the head's folder {head}: the base would run this very file; give a path "
                "inside the checkout"
            ) from None
        found.append(f"{relative.as_posix() or '.'}{separator}{rest}")
    return found
