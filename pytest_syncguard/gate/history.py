"""The history of a repository's GPU job on its default branch: one file per GPU model, each push's run a line, and
the baseline a pull request is judged against made from it.

A history file (``<slug>.jsonl``) is JSON Lines: a header (schema, version, device), then one line per recorded run
of the default branch, oldest first: its commit, time, host (the GPU that ran it) and, per test, the metrics the gate
judges against a baseline: each device-side metric (device time per token, allocator numbers) every run, and each
count only where it differs from that test's previous recorded count (forward-filled when read). A year of daily runs
of a 17-test suite is about 1 MB. The sync sites and the counters' contributors of each test's latest run, which
explain a count's change, are kept beside it (``<slug>.details.json``), replaced at each record.

The baseline of a test (:func:`baseline`) is its latest counts, judged exactly, and, of each device-side metric, the
current level of its runs: the runs replayed in order through :func:`.baselines.recorded`, so two runs beyond the
tolerance their level calibrates, on one side (a change merged on purpose), start a new level, which keeps its last
:data:`WINDOW` runs. A run is judged against its own host's runs of the level, within the spread inside hosts, where
the level allows it, else across hosts (:meth:`.baselines.Baseline.reference`); the tolerance narrows as runs
accumulate. No torch here."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..analysis.explain import Details
from ..codec import decode, encode
from ..document.measured import MeasuredTest
from ..files import small_regular_file, write_atomically
from ..metrics import metric, rounded, value_problem
from ..words import plural
from .baselines import Baseline, BaselineError, Recording, path_for, recorded

SCHEMA = "pytest-syncguard/history"
SCHEMA_VERSION = 1
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


@dataclass(frozen=True)
class History:
    """The recorded runs of one GPU model, oldest first, each test's counts filled in."""

    device: str
    runs: tuple[Run, ...] = ()
    details: Mapping[str, Details] = field(default_factory=dict)
    """Per test, what explains a change of its counts: its latest run's sync sites and contributors."""

    def series(self, nodeid: str, name: str) -> list[tuple[Run, float]]:
        """The runs that measured ``name`` of test ``nodeid``, with its value, oldest first."""
        return [(run, run.tests[nodeid][name]) for run in self.runs if name in run.tests.get(nodeid, {})]


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
    are partial), with the metrics the gate judges, and the hosts that ran them."""
    tests = {}
    hosts = set()
    for result in results:
        if result.error is not None or result.outcome is not None:
            continue
        tests[result.nodeid] = {n: rounded(v) for n, v in sorted(result.metrics.values.items()) if judged(n)}
        hosts.add(result.host)
    return Run(commit, when, ",".join(sorted(h for h in hosts if h)), tests)


def paths(folder: Path, slug: str) -> tuple[Path, Path]:
    """The history file of GPU model ``slug`` in ``folder``, and its details file."""
    base = path_for(folder, slug)
    return base.with_suffix(".jsonl"), base.with_suffix(".details.json")


def read(folder: Path, slug: str) -> History | None:
    """The history of ``slug`` in ``folder``; None where it has none (a GPU model seen for the first time)."""
    runs_path, details_path = paths(folder, slug)
    if not runs_path.exists():
        return None
    for path in (runs_path, details_path):
        if path.exists() and not small_regular_file(path, MAX_FILE_BYTES):
            raise HistoryError(f"{path}: not a regular file of at most {MAX_FILE_BYTES >> 20} MB: left as it is")
    try:
        lines = runs_path.read_text(encoding="utf-8").splitlines()
        header = json.loads(lines[0]) if lines else None
        if not isinstance(header, dict) or header.get("schema") != SCHEMA:
            raise HistoryError(f"{runs_path}: not a pytest-syncguard history (schema {SCHEMA!r} expected)")
        if header.get("schema_version") != SCHEMA_VERSION or header.get("device") != slug:
            found = f"schema version {header.get('schema_version')!r} of device {header.get('device')!r}"
            raise HistoryError(f"{runs_path}: {found}; this syncguard reads version {SCHEMA_VERSION} of {slug!r}")
        runs = tuple(_filled(decode(Run, json.loads(line), f"line {i}") for i, line in enumerate(lines[1:], 2)))
        details = decode(dict[str, Details], json.loads(details_path.read_text(encoding="utf-8")), "details") if (
            details_path.exists()) else {}  # fmt: skip
    except (OSError, ValueError, RecursionError) as exc:  # CodecError and bad JSON are ValueErrors
        if isinstance(exc, HistoryError):
            raise
        raise HistoryError(f"{runs_path}: not readable ({str(exc)[:200]}); fix it on the history branch") from exc
    for run in runs:
        for nodeid, values in run.tests.items():
            problem = next((p for n, v in values.items() if (p := value_problem(n, v)) is not None), None)
            if problem is not None:
                raise HistoryError(f"{runs_path}: run of {run.commit}: {nodeid}: {problem}")
    return History(slug, runs, details)


def _filled(runs: Iterable[Run]) -> Iterable[Run]:
    """Each run with the counts it left out (unchanged since the test's run before) filled in."""
    last: dict[str, dict[str, float]] = {}
    for run in runs:
        tests = {}
        for nodeid, values in run.tests.items():
            counts = {n: v for n, v in last.get(nodeid, {}).items() if n not in values}
            tests[nodeid] = {**counts, **values}
            last[nodeid] = {n: v for n, v in tests[nodeid].items() if (spec := metric(n)) is None or spec.counted}
        yield Run(run.commit, run.time, run.host, tests, run.world_size)


def _compact(runs: Sequence[Run]) -> list[Run]:
    """Each run with a count left out where it equals that test's count in the run before (:func:`_filled` undoes
    it)."""
    last: dict[str, dict[str, float]] = {}
    compact = []
    for run in runs:
        tests = {}
        for nodeid, values in run.tests.items():
            before = last.get(nodeid, {})
            tests[nodeid] = {n: v for n, v in values.items() if not ((spec := metric(n)) is not None and spec.counted
                                                                     and before.get(n) == v)}  # fmt: skip
            last[nodeid] = {**before, **{n: v for n, v in values.items() if (s := metric(n)) is None or s.counted}}
        compact.append(Run(run.commit, run.time, run.host, tests, run.world_size))
    return compact


def write(folder: Path, history: History) -> None:
    """Write ``history`` into ``folder`` (each file atomically)."""
    runs_path, details_path = paths(folder, history.device)
    header = json.dumps({"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "device": history.device})
    lines = [header, *(json.dumps(encode(run), sort_keys=True, allow_nan=False) for run in _compact(history.runs))]
    write_atomically(runs_path, "\n".join(lines) + "\n")
    write_atomically(details_path, json.dumps(encode(dict(sorted(history.details.items()))), sort_keys=True) + "\n")


def record(folder: Path, results: Sequence[MeasuredTest], commit: str, when: str) -> dict[str, int]:
    """Append the run of ``results`` to the history of each GPU model they measured, in ``folder``: per model, the
    number of runs its history then holds."""
    by_device: dict[str, list[MeasuredTest]] = {}
    for result in results:
        by_device.setdefault(result.device_slug, []).append(result)
    held = {}
    for slug, tests in sorted(by_device.items()):
        if not slug:
            raise HistoryError("a result names no device slug: it was written by a pytest-syncguard before 0.1")
        history = read(folder, slug) or History(slug)
        run = run_of(tests, commit, when)
        details = {**history.details, **{t.nodeid: t.details() for t in tests if t.nodeid in run.tests}}
        updated = History(slug, (*history.runs, run), details)
        write(folder, updated)
        held[slug] = len(updated.runs)
    return held


def baseline(history: History) -> Baseline:
    """The baseline the history sets: each test's latest counts, and each device-side metric's current level (its
    runs replayed through :func:`.baselines.recorded`, the last :data:`WINDOW` of the level kept, with their hosts),
    said to come from ``history:<slug>``."""
    tests: dict[str, dict[str, float]] = {}
    kept: dict[str, dict[str, tuple[Recording, ...]]] = {}
    for run in history.runs:
        for nodeid, values in run.tests.items():
            tests[nodeid], kept[nodeid], _ = recorded(values, kept.get(nodeid, {}), run.host, limit=WINDOW)
    latest = set(history.runs[-1].tests) if history.runs else set()  # a test the suite dropped is not missing
    tests = {nodeid: values for nodeid, values in tests.items() if nodeid in latest}
    return Baseline(Path(f"history:{history.device}"), history.device, {}, tests, dict(history.details), kept)


def describe(history: History, nodeid: str | None = None, name: str | None = None) -> str:
    """``history: 12 runs of nvidia-h100-80gb-hbm3 on 4 hosts, gpu_us_per_token judged from run 3`` (where the
    current level of test ``nodeid``'s device-side metrics, or of metric ``name`` alone, begins)."""
    hosts = {h for run in history.runs for h in run.host.split(",") if h}
    text = f"history: {plural(len(history.runs), 'run')} of {history.device}"
    text += f" on {plural(len(hosts), 'host')}" if hosts else ""
    if nodeid is not None:
        level = baseline(history).history.get(nodeid, {})
        for metric_name, recordings in level.items():
            if name is None or metric_name == name:
                measured = len(history.series(nodeid, metric_name))
                text += f", {metric_name} judged from run {measured - len(recordings) + 1}"
    return text
