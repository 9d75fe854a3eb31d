"""``syncguard ab``: base and head of a change measured on one runner, in interleaved rounds, and judged.

Each round runs the same pytest command once in a checkout of the base (a git worktree of ``--base``) and once in
the head (the working directory), in alternating order (base first in odd rounds), each with ``--syncguard`` and its
own JSON results, JUnit file and log under the output folder; each side imports its own code first (its root, and
its ``src/`` if there is one, lead ``PYTHONPATH``). Then, per test measured on both sides:

- counts (syncs, operators, launches, ...) are compared exactly, head against base, with what changed (sync sites
  that appeared or grew, the counters' contributors that moved);
- every other metric is judged from its per-round pairs (:mod:`.analysis.ab_stats`): head/base with a confidence
  interval and a verdict, regression, improvement, unchanged or inconclusive, against a minimum effect.

No torch here: the rounds are separate pytest processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from . import results_file, upgrades
from .analysis.ab_stats import INCONCLUSIVE, REGRESSION, RatioVerdict, judge, rounds_needed
from .analysis.explain import Explanation, explain
from .codec import CodecError, decode, encode, read_document
from .comparison import count_status
from .metrics import metric
from .result import MeasuredTest

SCHEMA = "pytest-syncguard/ab"
#: Version 2: records by :mod:`.codec` (a changed site's fields under ``site``); version 1 still reads.
SCHEMA_VERSION = 2
DEFAULT_ROUNDS = 6
DEFAULT_MIN_EFFECT = 0.03
DEFAULT_CONFIDENCE = 0.95
#: Judged through another metric (tokens/s is tokens over time): not listed twice.
DERIVED = frozenset({"tokens_per_second"})
#: Exit statuses of a round's pytest that still measured: all passed, or some test failed (a budget, say).
MEASURED_EXITS = (0, 1)


#: The signals that stop an A/B at once: Ctrl-C in its terminal, and a CI system cancelling its job.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: How long a round's pytest gets to end after it is told to (SIGINT), before its process group is killed.
STOP_GRACE_S = 10.0


class ABError(Exception):
    """An A/B run that cannot go on; the message names the side, round, ref or file at fault."""


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
        lines = [f"syncguard ab: interrupted by {name}" + (f" during {self.running}" if self.running else "")
                 + "; the base's worktree is removed"]  # fmt: skip
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

    DERIVED: ClassVar[tuple[str, ...]] = ("verdict",)

    @property
    def verdict(self) -> str:
        statuses = {c.status for c in self.counts} | {v.verdict for v in self.timings.values()}
        for status in ("regression", "varies", "improvement", INCONCLUSIVE):
            if status in statuses:
                return status
        return "unchanged"


@dataclass(frozen=True)
class ABReport:
    base: str
    head: str
    rounds: int
    min_effect: float
    confidence: float
    device: str
    command: tuple[str, ...]
    tests: tuple[HeadAgainstBase, ...]
    only_in: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Tests measured on one side only ("base" or "head"), or not in every round."""

    def with_verdict(self, verdict: str) -> list[HeadAgainstBase]:
        return [t for t in self.tests if t.verdict == verdict]

    @property
    def regressions(self) -> int:
        return len(self.with_verdict("regression"))


def document(report: ABReport) -> dict[str, Any]:
    """The A/B file's content: the report's record, schema-versioned."""
    data: dict[str, Any] = encode(report)
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, **data}


def read_report(path: Path) -> ABReport:
    """The report of an A/B JSON file; ValueError naming what is wrong on anything else (it may be untrusted)."""
    data, version = read_document(path, SCHEMA, SCHEMA_VERSION, "syncguard A/B report")
    try:
        return decode(ABReport, upgrades.ab_v1(data) if version == 1 else data)
    except CodecError as exc:
        raise ValueError(f"A/B report is malformed: {exc}") from exc


# -- reading one side's results ---------------------------------------------------------------------------------


def read_results(path: Path) -> dict[str, MeasuredTest]:
    """The measured tests of a round's results file whose call did not raise, by node id."""
    try:
        tests = results_file.read(path)
    except results_file.ResultsError as exc:
        raise ABError(str(exc)) from exc
    return {t.nodeid: t for t in tests if t.error is None and t.outcome is None}


# -- comparing the two sides --------------------------------------------------------------------------------------


def compare_sides(
    base: Sequence[Mapping[str, MeasuredTest]],
    head: Sequence[Mapping[str, MeasuredTest]],
    *,
    min_effect: float,
    confidence: float,
) -> tuple[list[HeadAgainstBase], dict[str, tuple[str, ...]]]:
    """Per test measured in every round on both sides: counts exactly, the other metrics by paired rounds."""
    every_base = set.intersection(*(set(r) for r in base)) if base else set()
    every_head = set.intersection(*(set(r) for r in head)) if head else set()
    everywhere = every_base & every_head
    seen = set().union(*base, *head)
    only_in = {
        side: tuple(sorted(ids))
        for side, ids in (("base", seen - every_head), ("head", seen - every_base))
        if ids
    }  # fmt: skip
    tests = []
    for nodeid in sorted(everywhere):
        b = [r[nodeid] for r in base]
        h = [r[nodeid] for r in head]
        counts: list[CountChange] = []
        timings: dict[str, RatioVerdict] = {}
        names = set(b[0].metrics.values) & set(h[0].metrics.values)
        for name in sorted(names):
            spec = metric(name)
            if spec is None or name in DERIVED:
                continue
            if not all(name in m.metrics for m in (*b, *h)):
                continue
            if spec.counted:
                old = {m.metrics[name] for m in b}
                new = {m.metrics[name] for m in h}
                if len(old) > 1 or len(new) > 1:
                    counts.append(CountChange(name, max(old), max(new), "varies"))
                elif new != old:
                    (was,), (now,) = old, new
                    counts.append(CountChange(name, was, now, count_status(name, was, now)))
            else:
                pairs = [(x.metrics[name], y.metrics[name]) for x, y in zip(b, h, strict=True)]
                timings[name] = judge(
                    pairs, higher_is_better=spec.higher_is_better, min_effect=min_effect, confidence=confidence
                )
        moved = [c.metric for c in counts if c.status in ("regression", "improvement")]
        explanation = explain(b[0].details(), h[0].details(), moved) if moved else Explanation()
        tests.append(HeadAgainstBase(nodeid, tuple(counts), timings, explanation))
    return tests, only_in


# -- running the rounds --------------------------------------------------------------------------------------------


def _git(directory: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True, timeout=300)
    except FileNotFoundError as exc:
        raise ABError("git is not installed: give the base as a checkout with --base-dir") from exc
    except subprocess.TimeoutExpired as exc:
        raise ABError(f"git {' '.join(args)} took over 300 s") from exc
    if done.returncode != 0:
        raise ABError(f"git {' '.join(args)} in {directory} failed: {done.stderr.strip()[:500]}")
    return done.stdout.strip()


@contextmanager
def worktree(repository: Path, ref: str) -> Iterator[tuple[Path, str]]:
    """A detached worktree of ``ref`` (a clean checkout of it), removed afterwards; yields (folder, commit)."""
    commit = _git(repository, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    parent = Path(tempfile.mkdtemp(prefix="syncguard-ab-"))
    folder = parent / "base"
    _git(repository, "worktree", "add", "--detach", str(folder), commit)
    try:
        yield folder, commit
    finally:
        subprocess.run(["git", "-C", str(repository), "worktree", "remove", "--force", str(folder)],
                       capture_output=True, timeout=300, check=False)  # fmt: skip
        shutil.rmtree(parent, ignore_errors=True)
        # A worktree whose folder is gone but which git still lists (a remove cut short) is forgotten too.
        subprocess.run(["git", "-C", str(repository), "worktree", "prune"], capture_output=True, timeout=300,
                       check=False)  # fmt: skip


def describe_checkout(directory: Path) -> str:
    """The commit a checkout is at, marked ``+changes`` when its tracked files differ; the folder without git."""
    try:
        commit = _git(directory, "rev-parse", "HEAD")
        dirty = _git(directory, "status", "--porcelain", "--untracked-files=no")
    except ABError:
        return str(directory)
    return commit[:12] + (" +changes" if dirty else "")


def side_environment(directory: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a side's pytest: its own code first on ``PYTHONPATH``."""
    first = [str(directory)] + ([str(directory / "src")] if (directory / "src").is_dir() else [])
    rest = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**environ, "PYTHONPATH": os.pathsep.join([*first, *rest])}


def run_side(directory: Path, pytest_args: Sequence[str], out: Path, label: str, timeout: float) -> Path:
    """One side's pytest run of one round; returns its JSON results."""
    results, log, junit = out / f"{label}.json", out / f"{label}.log", out / f"{label}.xml"
    empty = out / "no-baselines"
    empty.mkdir(exist_ok=True)
    command = [
        sys.executable, "-m", "pytest", *pytest_args, "--syncguard", "--syncguard-json", str(results),
        "--syncguard-baselines", str(empty), "-p", "no:cacheprovider", "--rootdir", str(directory),
        "--junitxml", str(junit),
    ]  # fmt: skip
    with log.open("w", encoding="utf-8") as sink:
        # In a session of its own: a Ctrl-C in the terminal reaches the A/B alone, which then ends this run itself
        # (run_until_done), instead of the run ending half-way while the A/B goes on to the next one.
        process = subprocess.Popen(command, cwd=directory, env=side_environment(directory, os.environ), stdout=sink,
                                   stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            returncode = run_until_done(process, timeout)
        except subprocess.TimeoutExpired as exc:
            raise ABError(f"{label}: pytest ran over {timeout:.0f} s (log: {log})") from exc
    if returncode not in MEASURED_EXITS:
        raise ABError(f"{label}: pytest exited {returncode} in {directory} (log: {log})")
    if not results.is_file():
        raise ABError(f"{label}: pytest wrote no results (log: {log})")
    return results


def run_until_done(process: subprocess.Popen[bytes], timeout: float) -> int:
    """Wait for a round's pytest (the leader of its own process group); on a timeout or an interrupt, end its
    whole group first (SIGINT, then SIGKILL after :data:`STOP_GRACE_S`) and re-raise."""
    try:
        return process.wait(timeout=timeout)
    except BaseException:
        end_group(process)
        raise


def end_group(process: subprocess.Popen[bytes]) -> None:
    """End a process and everything it started in its group: SIGINT first (pytest finishes its teardowns), SIGKILL
    after :data:`STOP_GRACE_S`, and SIGKILL to what is left of the group once the leader is gone."""
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    with suppress(subprocess.TimeoutExpired):
        process.wait(timeout=STOP_GRACE_S)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@dataclass
class Progress:
    """Rounds done of planned and the time left at the current pace, as a line before each run."""

    rounds: int
    say: Callable[[str], object]
    started: float = field(default_factory=time.monotonic)
    finished: list[str] = field(default_factory=list)

    def starting(self, index: int, side: str) -> None:
        runs, done = 2 * self.rounds, len(self.finished)
        elapsed = time.monotonic() - self.started
        pace = (
            f", about {_duration(elapsed / done * (runs - done))} left at {_duration(elapsed / done)} a run"
            if done
            else ""
        )
        self.say(
            f"syncguard ab: round {index}/{self.rounds}, {side} ({done}/{runs} runs done, {_duration(elapsed)} "
            f"elapsed{pace})"
        )


def _duration(seconds: float) -> str:
    """``42s``, ``3m05s`` or ``1h02m``."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def run_rounds(
    base: Path, head: Path, pytest_args: Sequence[str], rounds: int, out: Path, *, timeout: float, progress: Any
) -> tuple[list[dict[str, MeasuredTest]], list[dict[str, MeasuredTest]]]:
    """``rounds`` interleaved rounds (base first in odd ones); each side's results per round. An interrupt
    (:class:`ABInterrupted`) is raised again with the run it stopped and the runs finished before it."""
    sides: dict[str, list[dict[str, MeasuredTest]]] = {"base": [], "head": []}
    folders = {"base": base, "head": head}
    pace = Progress(rounds, progress)
    label = None
    try:
        for index in range(1, rounds + 1):
            order = ("base", "head") if index % 2 else ("head", "base")
            for side in order:
                label = f"round{index}-{side}"
                pace.starting(index, side)
                results = read_results(run_side(folders[side], pytest_args, out, label, timeout))
                if not results:
                    raise ABError(f"{label}: no measured test in its results (log: {out / (label + '.log')})")
                sides[side].append(results)
                pace.finished.append(label)
                label = None
    except ABInterrupted as exc:
        if label is not None:  # what the stopped run wrote on its way out is not a round's results; its log stays
            for suffix in (".json", ".xml"):
                (out / f"{label}{suffix}").unlink(missing_ok=True)
        raise ABInterrupted(exc.signum, label, pace.finished, out) from None
    return sides["base"], sides["head"]


def run(
    *,
    base_ref: str | None,
    base_dir: Path | None,
    head: Path,
    pytest_args: Sequence[str],
    rounds: int = DEFAULT_ROUNDS,
    min_effect: float = DEFAULT_MIN_EFFECT,
    confidence: float = DEFAULT_CONFIDENCE,
    out: Path,
    timeout: float = 3600.0,
    progress: Any = print,
) -> ABReport:
    """The whole A/B: the base's checkout, the rounds, the comparison. SIGINT or SIGTERM stops it at once
    (:class:`ABInterrupted`), its running pytest ended and the base's worktree removed."""
    with stopping_on_signals():
        return _run(base_ref, base_dir, head, pytest_args, rounds, min_effect, confidence, out, timeout, progress)


def _run(
    base_ref: str | None,
    base_dir: Path | None,
    head: Path,
    pytest_args: Sequence[str],
    rounds: int,
    min_effect: float,
    confidence: float,
    out: Path,
    timeout: float,
    progress: Any,
) -> ABReport:
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if rounds < rounds_needed(confidence):
        progress(
            f"syncguard ab: {rounds} rounds cannot give a {confidence:.0%} interval (needs "
            f"{rounds_needed(confidence)}): every timing will be inconclusive"
        )
    if base_dir is not None:
        base_dir = base_dir.resolve()
        base_name = describe_checkout(base_dir)
        base_side, head_side = run_rounds(base_dir, head, pytest_args, rounds, out, timeout=timeout, progress=progress)
    else:
        assert base_ref is not None
        with worktree(head, base_ref) as (folder, commit):
            base_name = commit[:12]
            base_side, head_side = run_rounds(folder, head, pytest_args, rounds, out, timeout=timeout,
                                              progress=progress)  # fmt: skip
    tests, only_in = compare_sides(base_side, head_side, min_effect=min_effect, confidence=confidence)
    devices = sorted({m.device_slug for r in (*base_side, *head_side) for m in r.values()})
    return ABReport(
        base_name, describe_checkout(head), rounds, min_effect, confidence, ", ".join(devices), tuple(pytest_args),
        tuple(tests), only_in,
    )  # fmt: skip


def summary_lines(report: ABReport) -> list[str]:
    """The A/B as text: one line per test, the non-unchanged metrics under it."""
    lines = [
        f"syncguard ab: head {report.head} against base {report.base} on {report.device}, {report.rounds} rounds "
        f"interleaved, {report.confidence:.0%} intervals, minimum effect {report.min_effect:.0%}",
    ]
    for test in report.tests:
        lines.append(f"{test.verdict.upper() if test.verdict == REGRESSION else test.verdict:12} {test.nodeid}")
        for c in test.counts:
            lines.append(f"    {c.metric}: {_number(c.base)} -> {_number(c.head)} ({c.status})")
        lines.extend(f"    {line}" for line in test.explanation.lines())
        for name, v in sorted(test.timings.items()):
            lines.append(f"    {name}: {ratio_text(v)} {v.verdict}{f' ({v.reason})' if v.reason else ''}")
    for side, ids in sorted(report.only_in.items()):
        lines.append(f"only measured in every round of the {side} (not compared): {', '.join(ids)}")
    totals = {v: len(report.with_verdict(v)) for v in ("regression", "improvement", "varies", INCONCLUSIVE)}
    lines.append(
        f"syncguard ab: {len(report.tests)} tests, " + ", ".join(f"{n} {verdict}" for verdict, n in totals.items())
    )
    return lines


def ratio_text(v: RatioVerdict) -> str:
    """``x1.031 [0.998, 1.062]`` (head/base, its interval), or ``-`` without one."""
    if v.ratio is None or v.low is None or v.high is None:
        return "-"
    return f"x{v.ratio:.3f} [{v.low:.3f}, {v.high:.3f}]"


def _number(value: float) -> str:
    return f"{int(value)}" if float(value).is_integer() else f"{value:.4g}"
