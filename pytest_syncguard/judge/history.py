"""The history of a repository's GPU job on its default branch: per GPU model, each push's run a line, and the
baseline a pull request is judged against made from it.

A GPU model's runs are kept in segments of at most :data:`SEGMENT` runs (or :data:`SEGMENT_BYTES`), so that
recording a run and judging a pull request read and write a bounded amount whatever the history's age:

- ``<slug>.jsonl``, the open segment: JSON Lines, a header (schema, version, device, the number of its first run),
  then one line per run, oldest first: its commit, time, host (the GPU that ran it) and, per test, the metrics the
  gate judges: each device-side metric every run, and each count only where it differs from that test's count in
  the segment's run before (forward-filled when read);
- ``<slug>.state.json``, the checkpoint: the level rule's state (:class:`Replay`) after every run before the open
  segment: each test's latest counts, each device-side metric's level (its last :data:`WINDOW` runs and outliers),
  where each level began and how many runs measured it: what judging needs of the older runs;
- ``<slug>.latest.json``, the same state after every run, the open segment's included: a record advances it by its
  run and a report reads it in place of replaying the open segment (where it does not match the open segment, written
  by an earlier version, the open segment is replayed);
- ``<slug>.<first run>.jsonl``, the closed segments, written once when the open segment fills and never read again
  by a record or a judgement: the runs kept for the history page;
- ``<slug>.details.json``, the sync sites and the counters' contributors of each test's latest run, which explain a
  count's change, replaced at each record.

The baseline of a test (:func:`baseline`) is its latest counts, judged exactly, and, of each device-side metric, the
current level of its runs: the checkpoint's state, then the open segment's runs replayed in order through
:func:`.baselines.recorded`, so two runs beyond the tolerance their level calibrates, on one side (a change merged on
purpose), start a new level, which keeps its last :data:`WINDOW` runs. A run is judged against its own host's runs
of the level, within the spread inside hosts, where the level allows it, else across hosts
(:meth:`.baselines.Baseline.reference`); the tolerance narrows as runs accumulate. No torch here."""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..analysis.explain import Details
from ..codec import decode, encode, loads
from ..document.measured import MeasuredTest
from ..environment import is_slug
from ..files import small_regular_file, write_atomically
from ..metrics import metric, rounded, value_problem
from ..words import plural
from .baselines import CONFIRM, Baseline, BaselineError, Recording, path_for, recorded, split

SCHEMA = "pytest-syncguard/history"
#: Version 2: segments and a checkpoint (version 1, one file of every run, is read as an open segment).
SCHEMA_VERSION = 2
READ_VERSIONS = (1, 2)
#: The most runs of an open segment: a record or a judgement reads at most these runs and the checkpoint.
SEGMENT = 200
#: The most bytes of an open segment, whatever its runs: a large suite's runs are large (20,000 tests: more than
#: 1.2 MB a run, 199 of them past :data:`MAX_FILE_BYTES`), so its segments close sooner.
SEGMENT_BYTES = 64 << 20
#: The most runs of a level that set a device-side metric's baseline and tolerance.
WINDOW = 20
#: The largest history file read (a decade of daily runs of a large suite).
MAX_FILE_BYTES = 256 << 20


class HistoryError(BaselineError):
    """A history file that cannot be used; the message names it."""


@dataclass(frozen=True)
class Run:
    """One recorded run of the default branch: where and when, and per test the metrics the gate judges."""

    commit: str
    time: str
    """When it was recorded, ISO 8601 in UTC."""
    host: str
    """The GPU that ran it (:func:`.environment.host_id`), or the runner."""
    tests: Mapping[str, Mapping[str, float]]
    world_size: int = 1
    left_out: Mapping[str, str] = field(default_factory=dict)
    """The tests the run had and did not measure (a failed, skipped or erring call): node id -> why. Each keeps
    the level of its last good run (:func:`baseline`)."""


@dataclass(frozen=True)
class History:
    """The recorded runs of one GPU model, oldest first, each test's counts filled in."""

    device: str
    runs: tuple[Run, ...] = ()
    details: Mapping[str, Details] = field(default_factory=dict)
    """Per test, what explains a change of its counts: its latest run's sync sites and contributors."""
    before: Replay | None = None
    """The level rule's state after the runs before :attr:`runs` (the checkpoint); None where ``runs`` are all."""
    latest: Replay | None = None
    """The level rule's state after :attr:`runs`, where the store holds one that matches them; else None (replayed)."""
    unknown: tuple[str, ...] = ()
    """The fields of its runs this version does not know (a newer version wrote them): read without them, and the
    history is never rewritten by this version (:func:`record`), which would drop them."""

    def series(self, nodeid: str, name: str) -> list[tuple[Run, float]]:
        """The runs held that measured ``name`` of test ``nodeid``, with its value, oldest first."""
        return [(run, run.tests[nodeid][name]) for run in self.runs if name in run.tests.get(nodeid, {})]

    @property
    def first(self) -> int:
        """How many runs came before :attr:`runs` (those of the checkpoint)."""
        return self.before.runs if self.before is not None else 0

    @property
    def count(self) -> int:
        """How many runs the history holds, those before :attr:`runs` included."""
        return self.first + len(self.runs)

    @property
    def hosts(self) -> set[str]:
        """The GPUs that ran any of its runs."""
        earlier = set(self.before.hosts) if self.before is not None else set()
        return earlier | {h for run in self.runs for h in run.host.split(",") if h}

    def replayed(self) -> Replay:
        """The level rule's state after every run: :attr:`latest` where the store holds it, else :attr:`before`
        replayed through :attr:`runs`."""
        return self.latest if self.latest is not None else replay_of(self.before, self.runs)


@dataclass
class Replay:
    """The level rule's state after some runs of a history, oldest first (:meth:`advance` takes the next): what the
    checkpoint holds, so that judging reads only the runs after it. Each field is bounded by the suite, not by the
    runs: a level keeps at most its window's recordings."""

    runs: int = 0
    """How many runs it has taken."""
    hosts: tuple[str, ...] = ()
    tests: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per test, its latest counts and each device-side metric's level median."""
    kept: dict[str, dict[str, tuple[Recording, ...]]] = field(default_factory=dict)
    """Per test and device-side metric, its level's recordings and the outliers since."""
    measured: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per test and metric, how many runs measured it."""
    since: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per test and metric, the number of the run (of those that measured it) where its level begins."""
    good: dict[str, str] = field(default_factory=dict)
    """Per test, the commit of its last run that measured it."""
    last_tests: tuple[str, ...] = ()
    """The tests the last run measured."""
    last_left_out: dict[str, str] = field(default_factory=dict)
    """The tests the last run had and did not measure: node id -> why."""
    closed: dict[str, str] = field(default_factory=dict)
    """The commits of the last closed segment's runs, each with when it was recorded: a job run again after its
    commit's run was closed is not recorded twice (:func:`record`)."""
    last_run: tuple[str, str] = ("", "")
    """The commit and time of the last run taken: a state matches the runs whose count and last run it names."""
    starts: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    """Per test and device-side metric, the runs (numbered from the history's first, 0) where each of its levels
    began, oldest first (the history page draws them): a few numbers a level."""
    recent: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    """Per test and metric, the numbers of the last :data:`.baselines.CONFIRM` runs that measured it (where a level
    that they confirm began)."""

    def advance(
        self, run: Run, parts: dict[str, dict[str, tuple[tuple[Recording, ...], tuple[Recording, ...]]]]
    ) -> None:
        """Take ``run``, the next; ``parts`` (per test, by metric, its level and outliers, split) is the replay's
        cache of :func:`.baselines.split`, updated in place."""
        for nodeid, values in run.tests.items():
            entry, self.kept[nodeid], restarted = recorded(
                values, self.kept.get(nodeid, {}), run.host, limit=WINDOW, parts=parts.setdefault(nodeid, {})
            )
            self.tests[nodeid] = {**self.tests.get(nodeid, {}), **entry}
            self.good[nodeid] = run.commit
            measured, since = self.measured.setdefault(nodeid, {}), self.since.setdefault(nodeid, {})
            recent, starts = self.recent.setdefault(nodeid, {}), self.starts.setdefault(nodeid, {})
            for name in values:
                measured[name] = measured.get(name, 0) + 1
                since.setdefault(name, 1)
                if name in self.kept[nodeid]:
                    last = recent.setdefault(name, [])
                    last[:] = [*last[1 - CONFIRM :], self.runs]
                    starts.setdefault(name, [self.runs])
            for name in restarted:
                since[name] = measured[name] - CONFIRM + 1
                starts[name].append(recent[name][0])
        self.runs += 1
        self.hosts = tuple(sorted({*self.hosts, *(h for h in run.host.split(",") if h)}))
        self.last_tests = tuple(run.tests)
        self.last_left_out = dict(run.left_out)
        self.last_run = (run.commit, run.time)

    def matches(self, first: int, runs: Sequence[Run]) -> bool:
        """Whether this is the state after the ``runs`` that follow the ``first`` runs before them."""
        last = (runs[-1].commit, runs[-1].time) if runs else None
        return self.runs == first + len(runs) and (last is None or self.last_run == last)

    def copy(self) -> Replay:
        """A copy that advancing leaves this one as it is (the recordings are immutable)."""
        return Replay(
            self.runs,
            self.hosts,
            {n: dict(v) for n, v in self.tests.items()},
            {n: dict(v) for n, v in self.kept.items()},
            {n: dict(v) for n, v in self.measured.items()},
            {n: dict(v) for n, v in self.since.items()},
            dict(self.good),
            self.last_tests,
            dict(self.last_left_out),
            dict(self.closed),
            self.last_run,
            {n: {m: list(v) for m, v in names.items()} for n, names in self.starts.items()},
            {n: {m: list(v) for m, v in names.items()} for n, names in self.recent.items()},
        )


def judged(name: str) -> bool:
    """Whether the gate judges metric ``name`` against a baseline: a count, or a device-side metric (host timings
    are judged A/B on one runner, and are not kept)."""
    spec = metric(name)
    return spec is not None and (spec.counted or spec.min_tolerance is not None)


def now() -> str:
    """The time a run is recorded at: ISO 8601 in UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def run_of(results: Iterable[MeasuredTest], commit: str, when: str) -> Run:
    """The run of a job's results, recorded ``when``: each test that finished (a failed or skipped call's numbers
    are partial), with the metrics the gate judges, and the hosts that ran them; the others by name, left out."""
    tests, left_out = {}, {}
    hosts = set()
    for result in results:
        if result.error is not None or result.outcome is not None:
            left_out[result.nodeid] = result.outcome or "error"
            continue
        tests[result.nodeid] = {n: rounded(v) for n, v in sorted(result.metrics.values.items()) if judged(n)}
        hosts.add(result.host)
    return Run(commit, when, ",".join(sorted(h for h in hosts if h)), tests, left_out=left_out)


#: A GPU model's open segment, its details file, its checkpoint and its latest state: ``<slug>.jsonl``,
#: ``<slug>.details.json``, ``<slug>.state.json``, ``<slug>.latest.json``; its closed segments are
#: ``<slug>.<first run, 6 digits or more>.jsonl``.
RUNS_SUFFIX, DETAILS_SUFFIX, STATE_SUFFIX, LATEST_SUFFIX = ".jsonl", ".details.json", ".state.json", ".latest.json"
_SEGMENT_NAME = re.compile(r"(?P<slug>[a-z0-9]+(?:-[a-z0-9]+)*)\.(?P<first>[0-9]{6,})\.jsonl")


def paths(folder: Path, slug: str) -> tuple[Path, Path]:
    """The open segment of GPU model ``slug`` in ``folder``, and its details file."""
    base = path_for(folder, slug)
    return base.with_suffix(RUNS_SUFFIX), base.with_suffix(DETAILS_SUFFIX)


def state_path(folder: Path, slug: str) -> Path:
    """The checkpoint of GPU model ``slug`` in ``folder``: the level rule's state before its open segment."""
    return path_for(folder, slug).with_suffix(STATE_SUFFIX)


def latest_path(folder: Path, slug: str) -> Path:
    """The level rule's state after every run of GPU model ``slug`` in ``folder``."""
    return path_for(folder, slug).with_suffix(LATEST_SUFFIX)


def segment_path(folder: Path, slug: str, first: int) -> Path:
    """The closed segment of GPU model ``slug`` whose first run is run ``first`` (counted from 0)."""
    return folder / f"{slug}.{first:06d}{RUNS_SUFFIX}"


def slug_of(name: str) -> str | None:
    """The GPU model whose history file (open or closed segment, details, checkpoint) is named ``name``; None for
    any other file (a README, a name that is no device slug)."""
    if (closed := _SEGMENT_NAME.fullmatch(name)) is not None:
        return closed["slug"]
    for suffix in (DETAILS_SUFFIX, STATE_SUFFIX, LATEST_SUFFIX, RUNS_SUFFIX):
        if name.endswith(suffix) and is_slug(stem := name.removesuffix(suffix)):
            return stem
    return None


def judging_file(name: str) -> bool:
    """Whether history file ``name`` is one a record or a judgement reads (not a closed segment, which only the
    history page reads)."""
    return slug_of(name) is not None and _SEGMENT_NAME.fullmatch(name) is None


def _checked(path: Path) -> None:
    if not small_regular_file(path, MAX_FILE_BYTES):
        raise HistoryError(f"{path}: not a regular file of at most {MAX_FILE_BYTES >> 20} MB: left as it is")


def _segment(path: Path, slug: str, *, filled: bool = True) -> tuple[int, tuple[Run, ...], list[str]]:
    """A segment file's first run's number, its runs (counts filled in; as stored, each only where it changed, where
    not ``filled``) and the fields of them this version does not know."""
    _checked(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    header = loads(lines[0]) if lines else None
    if not isinstance(header, dict) or header.get("schema") != SCHEMA:
        raise HistoryError(f"{path}: not a pytest-syncguard history (schema {SCHEMA!r} expected)")
    version, first = header.get("schema_version"), header.get("first", 0)
    if version not in READ_VERSIONS or header.get("device") != slug:
        found = f"schema version {version!r} of device {header.get('device')!r}"
        raise HistoryError(f"{path}: {found}; this syncguard reads versions 1 to {SCHEMA_VERSION} of {slug!r}")
    if isinstance(first, bool) or not isinstance(first, int) or first < 0:
        raise HistoryError(f"{path}: its header's first run {first!r} is no run number")
    raw = [loads(line, constants=False) for line in lines[1:]]
    known = {f.name for f in fields(Run)}
    unknown = sorted({key for line in raw if isinstance(line, dict) for key in line} - known)
    stored = (decode(Run, line, f"line {i}") for i, line in enumerate(raw, 2))
    runs = tuple(_filled(stored) if filled else stored)
    for run in runs:
        for nodeid, values in run.tests.items():
            problem = next((p for n, v in values.items() if (p := value_problem(n, v)) is not None), None)
            if problem is not None:
                raise HistoryError(f"{path}: run of {run.commit}: {nodeid}: {problem}")
    return first, runs, unknown


def read(folder: Path, slug: str, *, every_run: bool = False) -> History | None:
    """The history of ``slug`` in ``folder``: its checkpoint and open segment, or with ``every_run`` its closed
    segments' runs too (the history page); None where it has none (a GPU model seen for the first time)."""
    runs_path, details_path = paths(folder, slug)
    if not runs_path.exists():
        return None
    state = state_path(folder, slug)
    try:
        first, runs, unknown = _segment(runs_path, slug)
        before = _state(state)
        if (before.runs if before is not None else 0) != first:
            raise HistoryError(
                f"{runs_path}: its first run is run {first}, its checkpoint {state.name} holds "
                f"{before.runs if before is not None else 'none'}: the files are of different records"
            )
        latest = _state(latest_path(folder, slug))
        if latest is not None and not latest.matches(first, runs):
            latest = None  # written by a version before it, or by hand: the open segment is replayed
        if every_run and first:
            runs, before = _closed(folder, slug, first) + runs, None
        if details_path.exists():
            _checked(details_path)
        details = (
            decode(dict[str, Details], loads(details_path.read_text(encoding="utf-8")), "details")
            if details_path.exists()
            else {}
        )
    except (OSError, ValueError, RecursionError) as exc:  # CodecError and bad JSON are ValueErrors
        if isinstance(exc, HistoryError):
            raise
        raise HistoryError(f"{runs_path}: not readable ({str(exc)[:200]}); fix it on the history branch") from exc
    return History(slug, runs, details, before, latest, tuple(unknown))


def _state(path: Path) -> Replay | None:
    """The level rule's state in ``path``; None where there is no such file."""
    if not path.exists():
        return None
    _checked(path)
    return decode(Replay, loads(path.read_text(encoding="utf-8"), constants=False), path.name)


def _closed(folder: Path, slug: str, until: int) -> tuple[Run, ...]:
    """The runs of the closed segments of ``slug``, oldest first, which must hold runs 0 to ``until`` - 1."""
    return tuple(_closed_runs(folder, slug, until))


def _closed_runs(folder: Path, slug: str, until: int, *, filled: bool = True) -> Iterator[Run]:
    """:func:`_closed`'s runs, read a segment at a time (as stored where not ``filled``)."""
    segments = sorted(
        (int(found["first"]), path)
        for path in folder.iterdir()
        if (found := _SEGMENT_NAME.fullmatch(path.name)) is not None and found["slug"] == slug
    )
    count = 0
    for number, path in segments:
        first, held, _ = _segment(path, slug, filled=filled)
        if first != number or first != count:
            raise HistoryError(f"{path}: holds runs from {first}, after {count} runs: a segment is missing")
        count += len(held)
        yield from held
    if count != until:
        raise HistoryError(f"{folder}: the closed segments of {slug} hold {count} runs, the checkpoint {until}")


def every_run(folder: Path, history: History, *, filled: bool = True) -> Iterator[Run]:
    """Every run of ``history`` (read from ``folder`` without ``every_run``), oldest first: its closed segments',
    read one at a time, then its own; :class:`HistoryError` where a segment is missing. Not ``filled``: each count
    only where it differs from the run before in its segment (a segment's first run has them all), as stored."""
    yield from _closed_runs(folder, history.device, history.first, filled=filled)
    yield from history.runs if filled else compact(history.runs)


def _filled(runs: Iterable[Run]) -> Iterable[Run]:
    """Each run with the counts it left out (unchanged since the test's run before) filled in."""
    last: dict[str, dict[str, float]] = {}
    for run in runs:
        tests = {}
        for nodeid, values in run.tests.items():
            counts = {n: v for n, v in last.get(nodeid, {}).items() if n not in values}
            tests[nodeid] = {**counts, **values}
            last[nodeid] = {n: v for n, v in tests[nodeid].items() if (spec := metric(n)) is None or spec.counted}
        yield Run(run.commit, run.time, run.host, tests, run.world_size, run.left_out)


def compact(runs: Sequence[Run]) -> list[Run]:
    """Each run with a count left out where it equals that test's count in the run before (:func:`_filled` undoes
    it)."""
    last: dict[str, dict[str, float]] = {}
    kept = []
    for run in runs:
        tests = {}
        for nodeid, values in run.tests.items():
            before = last.get(nodeid, {})
            tests[nodeid] = {
                n: v
                for n, v in values.items()
                if not ((spec := metric(n)) is not None and spec.counted and before.get(n) == v)
            }
            last[nodeid] = {**before, **{n: v for n, v in values.items() if (s := metric(n)) is None or s.counted}}
        kept.append(Run(run.commit, run.time, run.host, tests, run.world_size, run.left_out))
    return kept


def segment_text(slug: str, first: int, runs: Sequence[Run]) -> str:
    """A segment file's text: its header (``first``: the number of its first run) and its runs, compacted."""
    header = json.dumps({"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "device": slug, "first": first})
    lines = [header, *(json.dumps(encode(run), sort_keys=True, allow_nan=False) for run in compact(runs))]
    return "\n".join(lines) + "\n"


def replay_of(before: Replay | None, runs: Iterable[Run]) -> Replay:
    """The level rule's state after ``before`` (left as it is; no run where None) and then ``runs``, oldest first."""
    replay = before.copy() if before is not None else Replay()
    parts: dict[str, dict[str, tuple[tuple[Recording, ...], tuple[Recording, ...]]]] = {}
    for run in runs:
        replay.advance(run, parts)
    return replay


def close_segment(
    folder: Path, slug: str, before: Replay | None, runs: Sequence[Run], after: Replay | None = None
) -> Replay:
    """Write ``runs``, the full open segment after the runs of checkpoint ``before``, as a closed segment of
    ``slug`` in ``folder``; the checkpoint past them (``after``, the state after them, where known)."""
    first = before.runs if before is not None else 0
    write_atomically(segment_path(folder, slug, first), segment_text(slug, first, runs))
    replay = after.copy() if after is not None else replay_of(before, runs)
    replay.closed = {run.commit: run.time for run in runs}
    return replay


def write(folder: Path, history: History, *, checkpoint: bool = True) -> None:
    """Write ``history``'s open segment, checkpoint (unless not ``checkpoint``: the file holds it already), latest
    state (replayed where it has none) and details into ``folder`` (each file atomically; the checkpoint before the
    segment that names it, the latest state after)."""
    runs_path, details_path = paths(folder, history.device)
    if history.before is not None and checkpoint:
        write_atomically(state_path(folder, history.device), json.dumps(encode(history.before), sort_keys=True) + "\n")
    write_atomically(runs_path, segment_text(history.device, history.first, history.runs))
    write_atomically(latest_path(folder, history.device), json.dumps(encode(history.replayed()), sort_keys=True) + "\n")
    write_atomically(details_path, json.dumps(encode(dict(sorted(history.details.items()))), sort_keys=True) + "\n")


@dataclass(frozen=True)
class Recorded:
    """What :func:`record` did to one GPU model's history."""

    runs: int
    """The runs it holds now."""
    replaced: str | None = None
    """The time of the run of the same commit that the new one replaced (a job run again), if any."""
    kept: str | None = None
    """The time of the run of the same commit in the last closed segment, which is never rewritten: the new run was
    not recorded."""
    left_out: Mapping[str, str] = field(default_factory=dict)
    """The tests the run had and did not measure: node id -> why (each keeps its last good run's level)."""

    def describe(self, slug: str) -> str:
        """``nvidia-h100-80gb-hbm3: 12 runs (the run of this commit recorded at T replaced; 1 test left out, failed:
        t::a)``."""
        notes = [f"the run of this commit recorded at {self.replaced} replaced"] if self.replaced else []
        if self.kept:
            notes.append(
                f"this commit's run recorded at {self.kept} is in a closed segment: kept, this run not recorded"
            )
        if self.left_out:
            named = ", ".join(f"{why}: {nodeid}" for nodeid, why in sorted(self.left_out.items())[:10])
            more = f" and {len(self.left_out) - 10} more" if len(self.left_out) > 10 else ""
            notes.append(
                f"{plural(len(self.left_out), 'test')} left out, judged against their last good run: {named}{more}"
            )
        return f"{slug}: {plural(self.runs, 'run')}" + (f" ({'; '.join(notes)})" if notes else "")


def record(folder: Path, results: Sequence[MeasuredTest], commit: str, when: str) -> dict[str, Recorded]:
    """Append the run of ``results`` to the history of each GPU model they measured, in ``folder``; a commit has one
    run: a run of a commit the open segment holds replaces it where it stands, and one of a commit the last closed
    segment holds is not recorded (an older commit's run is appended as the newest). An open segment of
    :data:`SEGMENT` runs, or of :data:`SEGMENT_BYTES` with this run, is closed: written to its own file, never
    rewritten, and the checkpoint advanced past it.
    Per model, what was recorded."""
    by_device: dict[str, list[MeasuredTest]] = {}
    for result in results:
        by_device.setdefault(result.device_slug, []).append(result)
    held = {}
    for slug, tests in sorted(by_device.items()):
        if not slug:
            raise HistoryError("a result names no device slug: it was written by a pytest-syncguard before 0.1")
        history = read(folder, slug) or History(slug)
        if history.unknown:
            raise HistoryError(
                f"{paths(folder, slug)[0]}: written by a newer pytest-syncguard (its runs hold "
                f"{', '.join(history.unknown)}, which this version does not know): not rewritten; "
                "upgrade pytest-syncguard"
            )
        run = run_of(tests, commit, when)
        same = next((i for i, r in enumerate(history.runs) if r.commit == commit), None)
        if same is None and history.before is not None and commit in history.before.closed:
            held[slug] = Recorded(history.count, kept=history.before.closed[commit], left_out=dict(run.left_out))
            continue
        details = {**history.details, **{t.nodeid: t.details() for t in tests if t.nodeid in run.tests}}
        if same is None:
            runs = (*history.runs, run)
            latest = history.replayed().copy()
            latest.advance(run, {})
        else:  # a run in the middle replaced: the state after it is replayed from the checkpoint
            runs = (*history.runs[:same], run, *history.runs[same + 1 :])
            latest = replay_of(history.before, runs)
        updated = History(slug, runs, details, history.before, latest)
        held_bytes = paths(folder, slug)[0].stat().st_size if history.runs else 0
        line = len(json.dumps(encode(run), sort_keys=True, allow_nan=False))  # at most its compacted line
        closing = len(runs) >= SEGMENT or held_bytes + line >= SEGMENT_BYTES
        if closing:
            closed = close_segment(folder, slug, history.before, runs, latest)
            updated = History(slug, (), details, closed, closed)
        write(folder, updated, checkpoint=closing)  # the checkpoint moves only when a segment closes
        replaced = history.runs[same].time if same is not None else None
        held[slug] = Recorded(updated.count, replaced, left_out=dict(run.left_out))
    return held


@dataclass(frozen=True)
class Levels:
    """A history replayed through the level rule: the baseline it sets, and where each metric's level begins."""

    baseline: Baseline
    since: Mapping[tuple[str, str], int]
    """(node id, metric) -> the number of the run, among the runs that measured it, where its level begins."""
    stale: Mapping[str, tuple[str, str]]
    """The tests main's last run left out that keep an earlier level: node id -> (why, the last good run's commit)."""


#: The last histories replayed, by identity: a report replays each once, for its baseline, its notes and its charts.
_REPLAYED: dict[int, tuple[History, Levels]] = {}


def levels(history: History) -> Levels:
    """Each test's latest counts, and each device-side metric's current level (the checkpoint's state, then the
    open segment's runs replayed in order through :func:`.baselines.recorded` with a window of :data:`WINDOW`, with
    their hosts), said to come from ``history:<slug>``. A test main's last run left out (failed, skipped) is judged
    against its last good run; one the last run does not name at all was dropped from the suite."""
    cached = _REPLAYED.get(id(history))
    if cached is not None and cached[0] is history:
        return cached[1]
    replay = history.replayed()
    stale = {n: (why, replay.good[n]) for n, why in replay.last_left_out.items() if n in replay.tests}
    last = set(replay.last_tests)
    tests = {nodeid: values for nodeid, values in replay.tests.items() if nodeid in last or nodeid in stale}
    found = Baseline(Path(f"history:{history.device}"), history.device, {}, tests, dict(history.details), replay.kept)
    since = {(nodeid, name): begins for nodeid, names in replay.since.items() for name, begins in names.items()}
    replayed = Levels(found, since, stale)
    if len(_REPLAYED) >= 8:
        _REPLAYED.clear()
    _REPLAYED[id(history)] = (history, replayed)
    return replayed


def level_starts(history: History) -> dict[tuple[str, str], list[int]]:
    """Per (test, device-side metric), the runs where each of its levels began, oldest first, numbered from the
    history's first run (0): the latest state's, else the level rule replayed through the runs held."""
    replay = history.replayed()
    return {(nodeid, name): list(runs) for nodeid, names in replay.starts.items() for name, runs in names.items()}


def baseline(history: History) -> Baseline:
    """The baseline the history sets (:func:`levels`)."""
    return levels(history).baseline


def describe(history: History, nodeid: str | None = None, name: str | None = None) -> str:
    """``history: 12 runs of nvidia-h100-80gb-hbm3 on 4 hosts, gpu_us_per_token judged from run 3`` (where the
    current level of test ``nodeid``'s device-side metrics, or of metric ``name`` alone, begins)."""
    hosts = history.hosts
    text = f"history: {plural(history.count, 'run')} of {history.device}"
    text += f" on {plural(len(hosts), 'host')}" if hosts else ""
    if nodeid is not None:
        replayed = levels(history)
        for metric_name, kept in replayed.baseline.history.get(nodeid, {}).items():
            if name is None or metric_name == name:
                text += f", {metric_name} judged from run {replayed.since.get((nodeid, metric_name), 1)}"
                level, outliers = split(metric_name, kept)
                if outliers:
                    moved = statistics.median(r.value for r in outliers) / statistics.median(r.value for r in level)
                    text += (
                        f" (main's last {plural(len(outliers), 'run')} lie beyond it, {moved - 1:+.1%}: "
                        f"{CONFIRM} in a row start a new level)"
                    )
        if nodeid in replayed.stale:
            why, commit = replayed.stale[nodeid]
            text += f", main's last run {why}: judged against its last good run ({commit[:12]})"
    return text
