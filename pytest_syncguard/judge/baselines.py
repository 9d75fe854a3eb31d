"""Baselines per device model: ``<dir>/<device-slug>.json``, one entry per test node id, and the comparison
of a test's metrics with its entry. Beside the metrics, a file keeps each test's details (sync sites, largest
contributors to the itemized counters), which explain a change of its counts, and the history of its calibrated
metrics (device time per token): the recordings of its current level, each with the GPU it was measured on, whose
median is the entry's value and whose spread sets the tolerance it is judged within (schema version 3; files of
versions 1 and 2, without details or history, are read as they are).

An update judges a test's new value of a calibrated metric against its level (:func:`level_after`): within it, it
joins the level while the level still takes runs; beyond it, it is an outlier kept aside, and :data:`CONFIRM` in a
row on one side (the code or the environment changed it) start a new level, which the update's notes name. ``syncguard
baselines FILE --reset-history`` empties the histories.

A baseline file is only written by :func:`update` (``--syncguard-update-baselines``): under a file lock, read,
merged with the tests that ran (others untouched), written to a temporary file and renamed over the old one,
so that concurrent pytest-xdist workers lose nothing and a reader never sees half a file. A file that is not
a baseline of this schema is an error naming it, and is never overwritten.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import stat
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import Timeout

from ..analysis.explain import Details
from ..codec import CodecError, decode, encode, loads
from ..document import upgrades
from ..document.comparison import Comparison, Spread
from ..environment import fingerprint, fingerprint_changes, host_id, is_slug, slug_for
from ..files import held_lock, lock_path, write_atomically
from ..metrics import metric, rounded, value_problem
from .comparison import calibrated_tolerance, compare, within_band

if TYPE_CHECKING:
    from ..document.measured import MeasuredTest
    from ..metrics import Metrics

SCHEMA = "pytest-syncguard/baselines"
SCHEMA_VERSION = 3
LOCK_TIMEOUT_S = 120.0
#: A baseline file of any size up to this is read (the H100 file of 17 tests with their details and histories is
#: 314 kB: 18.5 kB a test).
SMALL_FILE_BYTES = 64 << 20
#: Beyond :data:`SMALL_FILE_BYTES` the limit follows the suite: at most this much a test it holds (a file from a
#: history of 20,000 tests is about 410 MB), ...
PER_TEST_BYTES = 256 << 10
#: ... and never more than this, whatever it holds (what reading it may cost in memory).
MAX_FILE_BYTES = 2 << 30
#: The most recordings a calibrated metric's history keeps; an update beyond it drops the oldest.
HISTORY_LIMIT = 10


class BaselineError(Exception):
    """A baseline file that cannot be used (corrupt, foreign, a newer schema); the message names it."""


@dataclass(frozen=True)
class Recording:
    """One update's value of a calibrated metric, and the GPU it was measured on (:func:`.environment.host_id`)."""

    value: float
    host: str = ""


#: Per node id, per calibrated metric: its recordings, oldest first.
History = dict[str, dict[str, tuple[Recording, ...]]]


#: A metric's recordings judge a new value against those of its own host (the GPU that measured it: GPUs of one
#: model differ by a part of a percent each, steadily) where they hold at least this many, with at least this many
#: degrees of freedom within hosts to measure the spread there (a history of the default branch, not a few
#: recordings made by hand).
SAME_HOST_RECORDINGS = 10
SAME_HOST_DEGREES = 6


def _successive_sd(groups: Iterable[Sequence[float]]) -> tuple[float, int]:
    """The standard deviation of values from their successive differences within each group, in recording order
    (``sqrt(sum(d**2) / 2 / degrees)``, von Neumann's estimate): a slow creep of the values adds its step, not its
    whole run, and a host's offset stays out where each group is one host's. Also its degrees of freedom."""
    squares, degrees = 0.0, 0
    for values in groups:
        squares += sum((b - a) ** 2 for a, b in itertools.pairwise(values)) / 2
        degrees += max(len(values) - 1, 0)
    return ((squares / degrees) ** 0.5 if degrees else 0.0), degrees


def _sd(values: Sequence[float]) -> float:
    """The sample standard deviation, in floats (:func:`statistics.stdev` works in exact fractions: slow)."""
    mean = math.fsum(values) / len(values)
    return float((math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5)


def spread_of(recordings: Sequence[Recording]) -> Spread:
    """How far a metric's recordings lie apart: the standard deviation of successive recordings
    (:func:`_successive_sd`) relative to their median."""
    values = [r.value for r in recordings]
    middle = statistics.median(values)
    sd = _successive_sd([values])[0] / abs(middle) if middle else 0.0
    return Spread(len(values), len({r.host for r in recordings if r.host}), sd if len(values) >= 2 else None)


def reference_of(recordings: Sequence[Recording], host: str = "") -> tuple[float, Spread]:
    """The value a new recording made on ``host`` is judged against, and the spread that calibrates its tolerance:
    the mean of that host's recordings and the spread within hosts (successive recordings of each host), where the
    recordings allow it (:data:`SAME_HOST_RECORDINGS`, :data:`SAME_HOST_DEGREES`) and ``host`` made some; else all
    recordings' median and their spread."""
    middle = statistics.median(r.value for r in recordings)
    overall = middle, spread_of(recordings)
    groups: dict[str, list[float]] = {}
    for recording in recordings:
        if recording.host:
            groups.setdefault(recording.host, []).append(recording.value)
    sd, degrees = _successive_sd(groups.values())
    if not middle or len(recordings) < SAME_HOST_RECORDINGS or degrees < SAME_HOST_DEGREES:
        return overall
    within = sd / abs(middle)
    if host and host in groups:
        mine = groups[host]
        return statistics.fmean(mine), Spread(len(recordings), len(groups), within, on_host=len(mine))
    if len(groups) < 2:
        return overall
    # A host the recordings never saw has an offset of its own: each host counts once, whatever it recorded.
    between = _sd([statistics.fmean(values) / middle for values in groups.values()])
    spread = overall[1]
    wider = max(spread.relative_sd or 0.0, (between**2 + within**2) ** 0.5)
    return middle, Spread(spread.recordings, spread.hosts, wider, new_host=True)


@dataclass(frozen=True)
class Baseline:
    """One baseline file: the device slug it is for, the environment it was recorded in, and per test node id
    the metrics recorded."""

    path: Path
    device: str
    fingerprint: dict[str, str | None]
    tests: dict[str, dict[str, float]]
    details: dict[str, Details] = field(default_factory=dict)
    """Per node id: what explains a change of its counts (absent in version 1 files)."""
    history: History = field(default_factory=dict)
    """Per node id: the recordings of its calibrated metrics (absent before version 3)."""

    def spreads(self, nodeid: str) -> dict[str, Spread]:
        """The spread of each calibrated metric's level (its outliers out) of a test that has recordings."""
        return {name: spread_of(split(name, kept)[0]) for name, kept in self.history.get(nodeid, {}).items() if kept}

    def reference(self, nodeid: str, host: str = "") -> tuple[dict[str, float] | None, dict[str, Spread]]:
        """A test's entry as a run on ``host`` is judged against it, and the spread of each calibrated metric: a
        metric whose recordings judge by host (:func:`reference_of`) has its host's value. None: no entry."""
        entry = self.tests.get(nodeid)
        if entry is None:
            return None, {}
        entry, spreads = dict(entry), {}
        for name, kept in self.history.get(nodeid, {}).items():
            if kept:
                value, spreads[name] = reference_of(split(name, kept)[0], host)
                if spreads[name].on_host and name in entry:
                    entry[name] = rounded(value)
        return entry, spreads


def path_for(directory: Path, slug: str) -> Path:
    """The baseline file of a device slug in ``directory``; a slug that is no slug (``../x/y`` from an untrusted
    JUnit file) is an error, never a path outside it."""
    if not is_slug(slug):
        raise BaselineError(f"{slug!r} is not a device slug (lowercase letters, digits and '-')")
    return directory / f"{slug}.json"


def read(path: Path) -> Baseline | None:
    """The baseline in ``path``; None when there is no such file. Only a regular file is read (a FIFO would hang the
    reader, a device exhaust its memory, and a symlink a pull request commits could point anywhere on the runner), of
    at most :data:`MAX_FILE_BYTES`, and beyond :data:`SMALL_FILE_BYTES` of at most :data:`PER_TEST_BYTES` a test it
    holds (:func:`parse`)."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BaselineError(f"{path}: cannot read the baseline file: {exc}") from exc
    if stat.S_ISLNK(found.st_mode) or not stat.S_ISREG(found.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(found.st_mode) else "not a regular file"
        raise BaselineError(f"{path}: {what}; a baseline is a regular file (it was left as it is)")
    if found.st_size > MAX_FILE_BYTES:
        raise BaselineError(
            f"{path}: {found.st_size} bytes, more than a baseline file holds ({MAX_FILE_BYTES >> 20} MB); it was left "
            "as it is"
        )
    try:
        with path.open("rb") as source:
            raw = source.read(MAX_FILE_BYTES + 1)
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BaselineError(f"{path}: not UTF-8 text ({exc}); fix or delete it, it was left as it is") from exc
    except OSError as exc:
        raise BaselineError(f"{path}: cannot read the baseline file: {exc}") from exc
    return parse(text, path)


def parse(text: str, path: Path) -> Baseline:
    """The baseline that ``text`` (the content of ``path``, a file or a commit's blob) holds; :class:`BaselineError`
    names ``path`` and what is wrong (a text over :data:`SMALL_FILE_BYTES` holding fewer tests than one per
    :data:`PER_TEST_BYTES` among it)."""
    try:
        data = loads(text, constants=False)
    except (json.JSONDecodeError, ValueError, RecursionError) as exc:
        raise BaselineError(f"{path}: not valid JSON ({exc}); fix or delete it, it was left as it is") from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise BaselineError(f"{path}: not a pytest-syncguard baseline file (schema {SCHEMA!r} expected)")
    version = data.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise BaselineError(f"{path}: schema_version must be a whole number >= 1, got {version!r}")
    if version > SCHEMA_VERSION:
        raise BaselineError(
            f"{path}: baseline schema version {version!r}, this syncguard reads up to {SCHEMA_VERSION}: upgrade "
            "pytest-syncguard"
        )
    tests = data.get("tests")
    if not isinstance(tests, dict) or not all(
        isinstance(entry, dict) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in entry.values())
        for entry in tests.values()
    ):
        raise BaselineError(f"{path}: 'tests' must map node ids to {{metric: number}}")
    size = len(text) if 4 * len(text) <= SMALL_FILE_BYTES else len(text.encode("utf-8"))  # UTF-8: 1 to 4 bytes a char
    if size > SMALL_FILE_BYTES and size > PER_TEST_BYTES * len(tests):
        raise BaselineError(
            f"{path}: {size} bytes for {len(tests)} tests: beyond {SMALL_FILE_BYTES >> 20} MB a baseline file holds at "
            f"most {PER_TEST_BYTES >> 10} kB a test; fix or delete it, it was left as it is"
        )
    for nodeid, entry in tests.items():  # as a results or JUnit file's values are checked (metrics.value_problem)
        problem = next((p for name, v in entry.items() if (p := value_problem(name, float(v))) is not None), None)
        if problem is not None:
            raise BaselineError(f"{path}: {nodeid}: {problem}; fix or delete it, it was left as it is")
    fingerprint = data.get("fingerprint") or {}
    if not isinstance(fingerprint, dict):
        raise BaselineError(f"{path}: 'fingerprint' must be an object")
    raw_details = data.get("details") or {}
    if not isinstance(raw_details, dict):
        raise BaselineError(f"{path}: 'details' must map node ids to details")
    details = {}
    for nodeid, raw in raw_details.items():
        try:
            details[str(nodeid)] = decode(Details, upgrades.details(raw), "details")
        except CodecError as exc:
            raise BaselineError(f"{path}: details of {nodeid}: not valid ({exc})") from exc
    try:
        history = decode(History, data.get("history") or {}, "history")
    except CodecError as exc:
        raise BaselineError(f"{path}: not valid ({exc})") from exc
    return Baseline(path, str(data.get("device", path.stem)), fingerprint, tests, details, history)


def of_device(baseline: Baseline | None, slug: str) -> Baseline | None:
    """``baseline`` as the file of GPU model ``slug``: :class:`BaselineError` where it was recorded on another (a file
    copied or renamed from another model's is no baseline of this one)."""
    if baseline is not None and baseline.device != slug:
        raise BaselineError(
            f"{baseline.path}: recorded on {baseline.device!r}, not {slug!r} as its name says: a "
            "baseline file is named by the slug of its device (syncguard device)"
        )
    return baseline


def document(
    device: str,
    fingerprint: Mapping[str, str | None],
    tests: Mapping[str, Mapping[str, float]],
    details: Mapping[str, Details] | None = None,
    history: History | None = None,
) -> str:
    """The file's text: keys sorted, one metric per line, so that merges and reviews stay simple."""
    data = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "device": device,
        "fingerprint": dict(fingerprint),
        "tests": {nodeid: dict(sorted(tests[nodeid].items())) for nodeid in sorted(tests)},
        "details": {nodeid: encode(d) for nodeid, d in sorted((details or {}).items()) if nodeid in tests},
        "history": {nodeid: encode(h) for nodeid, h in sorted((history or {}).items()) if nodeid in tests and h},
    }
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"


@dataclass
class Written:
    """What an update wrote: how many entries, and the histories it started again (``node id: metric``)."""

    path: Path
    entries: int = 0
    restarted: list[str] = field(default_factory=list)


def record(
    results: Iterable[MeasuredTest], file_of: Callable[[MeasuredTest], Path | None], host: str | None = None
) -> list[tuple[str | None, Written]]:
    """Write measured tests into their baseline files (``file_of`` a result; None: not written), one update per
    file, each test's calibrated metrics recorded as measured on its own host (or ``host``): what each update
    wrote, or why it could not (the message, with an empty :class:`Written`)."""
    by_file: dict[Path, dict[str, MeasuredTest]] = {}
    for result in results:
        path = file_of(result)
        if path is not None and result.outcome is None and result.error is None:
            by_file.setdefault(path, {})[result.nodeid] = result
    done: list[tuple[str | None, Written]] = []
    for path, tests in sorted(by_file.items()):
        last = next(reversed(tests.values()))
        fingerprint = last.comparison.fingerprint if last.comparison is not None else {}
        entries = {nodeid: t.metrics.values for nodeid, t in tests.items()}
        details = {nodeid: t.details() for nodeid, t in tests.items()}
        try:
            done.append((None, update(path, last.device_slug, entries, fingerprint, details, host or last.host)))
        except BaselineError as exc:
            done.append((str(exc), Written(path)))
    return done


def update(
    path: Path,
    device: str,
    entries: Mapping[str, Mapping[str, float]],
    fingerprint: Mapping[str, str | None],
    details: Mapping[str, Details] | None = None,
    host: str = "",
) -> Written:
    """Write ``entries`` (node id -> metrics) and their ``details`` into the baseline at ``path``, keeping every
    other test's entry; each calibrated metric's value joins its history as measured on ``host``
    (:func:`recorded`)."""
    written = Written(path, len(entries))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with held_lock(path, LOCK_TIMEOUT_S):
            current = of_device(read(path), device)
            tests = dict(current.tests) if current is not None else {}
            kept = dict(current.details) if current is not None else {}
            history = dict(current.history) if current is not None else {}
            for nodeid, metrics in entries.items():
                tests[nodeid], history[nodeid], restarted = recorded(metrics, history.get(nodeid, {}), host)
                written.restarted.extend(f"{nodeid}: {name}" for name in restarted)
                kept.pop(nodeid, None)
            kept.update({nodeid: d for nodeid, d in (details or {}).items() if nodeid in entries})
            write_atomically(path, document(device, fingerprint, tests, kept, history))
    except Timeout as exc:
        raise BaselineError(f"{path}: could not lock {lock_path(path)} within {LOCK_TIMEOUT_S:.0f} s") from exc
    except (OSError, ValueError) as exc:  # ValueError: a metric that is not a finite number
        raise BaselineError(f"{path}: cannot write the baseline file: {exc}") from exc
    return written


def recorded(
    metrics: Mapping[str, float],
    earlier: Mapping[str, tuple[Recording, ...]],
    host: str,
    limit: int = HISTORY_LIMIT,
    parts: dict[str, tuple[tuple[Recording, ...], tuple[Recording, ...]]] | None = None,
) -> tuple[dict[str, float], dict[str, tuple[Recording, ...]], list[str]]:
    """A test's new entry, the recordings of its calibrated metrics and which of them started a new level: each new
    value joins its metric's level by :func:`level_after`. The entry's value is the level's median; a calibrated
    metric this run did not measure keeps its recordings and its value. ``parts`` (a replay's, by metric): each
    metric's level and outliers as :func:`level_after` left them, used and updated in place of splitting its
    recordings again."""
    entry = dict(metrics)
    history = {name: kept for name, kept in earlier.items() if name not in metrics}
    restarted: list[str] = []
    for name, value in metrics.items():
        if not _calibrated(name):
            continue
        known = parts.get(name) if parts is not None else None
        before = known if known is not None else split(name, earlier.get(name, ()))
        level, outliers, started = _after(name, *before, Recording(value, host), limit)
        if parts is not None:
            parts[name] = (level, outliers)
        history[name] = (*level, *outliers)
        restarted += [name] if started else []
        entry[name] = rounded(statistics.median(r.value for r in level))
    return entry, history, restarted


#: Recordings beyond a level's tolerance, on one side, in a row, that start a new level (a change merged on purpose);
#: fewer are outliers (a glitch, a busy host, a run of another length): kept aside, out of the level's statistics,
#: and dropped by the next run within it.
CONFIRM = 3
#: The first runs of a host that joins a level after its first :data:`HISTORY_LIMIT` (or the history's window)
#: that the level takes, so that the host is judged on its own runs too.
HOST_RUNS = 5
#: A level holds at most this many windows' recordings, whatever the number of hosts.
MAX_WINDOWS = 4


def level_after(
    name: str, kept: tuple[Recording, ...], new: Recording, limit: int = HISTORY_LIMIT
) -> tuple[tuple[Recording, ...], tuple[Recording, ...], bool]:
    """A calibrated metric's level and outliers after ``new``, and whether it started a new level.

    The recordings are a level, then the outliers beyond it since (:func:`split`). A level is fixed by its first
    runs: its first ``limit`` recordings, and the first :data:`HOST_RUNS` of each host that joins later; a run after
    them is judged against it and not added, so that neither a creep of small steps nor one run far off moves it
    (its spread comes from successive recordings, :func:`spread_of`). A run beyond the level's tolerance (judged as a
    pull request on its host is, :func:`reference_of`) is an outlier; :data:`CONFIRM` in a row on one side start a
    new level of those of them that agree (within the metric's ``min_tolerance`` of their median); a run within the
    level drops the outliers before it."""
    return _after(name, *split(name, kept), new, limit)


def _after(
    name: str, level: tuple[Recording, ...], outliers: tuple[Recording, ...], new: Recording, limit: int
) -> tuple[tuple[Recording, ...], tuple[Recording, ...], bool]:
    """:func:`level_after` of recordings already split into their level and outliers."""
    if not level:
        return (new,), (), False
    side = _beyond(name, level, new.value, new.host)
    if side == 0:
        hosts = [r.host for r in level]
        room = len(level) < limit or (hosts.count(new.host) < HOST_RUNS and len(level) < MAX_WINDOWS * limit)
        return ((*level, new) if room else level), (), False
    outliers = (
        (*outliers, new) if outliers and _beyond(name, level, outliers[0].value, outliers[0].host) == side else (new,)
    )
    if len(outliers) < CONFIRM:
        return level, outliers, False
    return _agreeing(name, outliers), (), True


def split(name: str, kept: Sequence[Recording]) -> tuple[tuple[Recording, ...], tuple[Recording, ...]]:
    """A metric's recordings as :func:`level_after` keeps them: its level, and the outliers recorded since (at most
    :data:`CONFIRM` - 1, each beyond the level on one side: the rule that kept them finds them again)."""
    kept = tuple(kept)
    for count in range(min(CONFIRM - 1, len(kept) - 1), 0, -1):
        level, outliers = kept[:-count], kept[-count:]
        sides = {_beyond(name, level, r.value, r.host) for r in outliers}
        if len(sides) == 1 and 0 not in sides:
            return level, outliers
    return kept, ()


def _agreeing(name: str, recordings: Sequence[Recording]) -> tuple[Recording, ...]:
    """The recordings that lie within the metric's ``min_tolerance`` of their median (all, where none would)."""
    spec = metric(name)
    middle = statistics.median(r.value for r in recordings)
    within = (spec.min_tolerance or 0.0) if spec is not None else 0.0
    agreeing = tuple(r for r in recordings if abs(r.value - middle) <= within * abs(middle))
    return agreeing or tuple(recordings)


def _calibrated(name: str) -> bool:
    spec = metric(name)
    return spec is not None and spec.min_tolerance is not None


def _beyond(name: str, kept: Sequence[Recording], value: float, host: str) -> int:
    """1 or -1 where ``value``, measured on ``host``, lies above or below the tolerance ``kept`` calibrates; 0
    within it, or where ``kept`` calibrates none."""
    spec = metric(name)
    if not kept or spec is None:
        return 0
    middle, within = _band(name, kept, host)
    if within is None or within_band(name, middle, value, within):
        return 0
    return 1 if value > middle else -1


#: The bands computed, by (metric, the level's identity, host): the level held with its band keeps its identity.
_BANDS: dict[tuple[str, int, str], tuple[Sequence[Recording], float, float | None]] = {}


def _band(name: str, kept: Sequence[Recording], host: str) -> tuple[float, float | None]:
    """The value a recording on ``host`` is judged against and the tolerance around it that ``kept`` calibrates,
    computed once per level and host: a level fixed by its first runs judges every later run against the same band,
    so replaying a history costs a lookup per run, not a level's statistics."""
    found = _BANDS.get((name, id(kept), host))
    if found is not None and found[0] is kept:
        return found[1], found[2]
    middle, spread = reference_of(kept, host)
    within = calibrated_tolerance(name, spread)
    if len(_BANDS) >= 1 << 16:
        _BANDS.clear()
    _BANDS[name, id(kept), host] = (kept, middle, within)
    return middle, within


def reset_history(path: Path, nodeids: Sequence[str] = ()) -> int:
    """Empty the histories of ``nodeids`` (all tests when none) in the baseline at ``path``, keeping every value;
    returns how many tests had one. The next update starts each again from its value."""
    try:
        with held_lock(path, LOCK_TIMEOUT_S):
            current = read(path)
            if current is None:
                raise BaselineError(f"{path}: no such baseline file")
            unknown = [n for n in nodeids if n not in current.tests]
            if unknown:
                raise BaselineError(f"{path}: no entry for {', '.join(unknown)}")
            chosen = set(nodeids or current.history)
            history = {n: h for n, h in current.history.items() if n not in chosen}
            emptied = sum(1 for n in chosen if current.history.get(n))
            write_atomically(
                path, document(current.device, current.fingerprint, current.tests, current.details, history)
            )
    except Timeout as exc:
        raise BaselineError(f"{path}: could not lock {lock_path(path)} within {LOCK_TIMEOUT_S:.0f} s") from exc
    except OSError as exc:
        raise BaselineError(f"{path}: cannot write the baseline file: {exc}") from exc
    return emptied


class BaselineStore:
    """The baselines folder of a pytest run: each file read once, each measured test compared with its entry,
    and with ``--syncguard-update-baselines`` the entries of the tests that ran written at the end.

    Under pytest-xdist every worker writes its own tests' entries (under the file's lock) and sends the
    controller what it wrote and what it could not (:meth:`worker_output`, :meth:`add_worker_output`).
    """

    #: The key of :meth:`worker_output` in an xdist worker's ``workeroutput``.
    WORKER_KEY = "syncguard_baselines"

    def __init__(self, directory: Path, tolerance: float | None, *, updating: bool, host_timings: bool = False) -> None:
        self.directory = directory
        self.tolerance = tolerance
        self.updating = updating
        self.host_timings = host_timings
        self._files: dict[Path, Baseline | None] = {}
        #: Entries written per file, the histories started again, and the files that could not be written (this
        #: process's and, on the xdist controller, its workers').
        self.written: Counter[str] = Counter()
        self.restarted: list[str] = []
        self.errors: list[str] = []
        #: The files an update could not write (their tests' rows must not read "updated").
        self.unwritten: set[str] = set()

    def compare(
        self, nodeid: str, device: str, metrics: Metrics, tolerance: float | None = None, details: Details | None = None
    ) -> Comparison:
        """The test's metrics against its entry in the file of ``device``'s model ("cpu" or "cuda"), ``details``
        explaining a change of its counts; raises :class:`BaselineError` naming a file that cannot be read."""
        slug = slug_for(device)
        path = path_for(self.directory, slug)
        if path not in self._files:
            self._files[path] = of_device(read(path), slug)
        baseline = self._files[path]
        entry, spreads = baseline.reference(nodeid, host_id(slug)) if baseline is not None else (None, {})
        environment = fingerprint(device)
        comparison = compare(
            entry,
            metrics,
            device=slug,
            file=str(path),
            tolerance=self.tolerance if tolerance is None else tolerance,
            fingerprint=environment,
            drift=fingerprint_changes(baseline.fingerprint, environment) if baseline is not None else {},
            host_timings=self.host_timings,
            details=(baseline.details.get(nodeid) if baseline is not None else None, details),
            spreads=spreads,
        )
        return replace(comparison, status="updated") if self.updating else comparison

    def write(self, results: Iterable[MeasuredTest]) -> None:
        """Write the entries of the compared tests that ended without a syncguard error, one update per file."""
        compared = [r for r in results if r.comparison is not None and r.error is None]
        for problem, written in record(compared, lambda r: Path(r.comparison.file) if r.comparison else None):
            if problem is not None:
                self.errors.append(problem)
                self.unwritten.add(str(written.path))
            else:
                self.written[str(written.path)] += written.entries
                self.restarted.extend(f"{written.path}: {name}" for name in written.restarted)

    def worker_output(self) -> dict[str, Any]:
        return {
            "written": dict(self.written),
            "restarted": list(self.restarted),
            "errors": list(self.errors),
            "unwritten": sorted(self.unwritten),
        }

    def add_worker_output(self, sent: Mapping[str, Any]) -> None:
        self.written.update(sent["written"])
        self.restarted.extend(sent.get("restarted", ()))
        self.errors.extend(sent["errors"])
        self.unwritten.update(sent.get("unwritten", ()))

    def worker_lost(self, worker: str, error: object) -> None:
        self.errors.append(f"xdist worker {worker} went down ({error}): its tests' entries are lost")

    def notes(self, *, by_workers: bool) -> list[str]:
        """What an update wrote (per file) and what it could not."""
        if not self.updating:
            return []
        by = " by the xdist workers" if by_workers else ""
        notes = [
            f"syncguard: wrote {n} baseline entr{'y' if n == 1 else 'ies'} to {file}{by}"
            for file, n in sorted(self.written.items())
        ]
        notes += [
            f"syncguard: history started again (the value moved beyond its tolerance): {name}"
            for name in sorted(self.restarted)
        ]
        return notes + [f"syncguard: baselines NOT updated: {error}" for error in self.errors]
