"""Baselines per device model: ``<dir>/<device-slug>.json``, one entry per test node id, and the comparison
of a test's metrics with its entry. Beside the metrics, a file keeps each test's details (sync sites, largest
contributors to the itemized counters), which explain a change of its counts (schema version 2; version 1 files,
without details, are read as they are).

A baseline file is only written by :func:`update` (``--syncguard-update-baselines``): under a file lock, read,
merged with the tests that ran (others untouched), written to a temporary file and renamed over the old one,
so that concurrent pytest-xdist workers lose nothing and a reader never sees half a file. A file that is not
a baseline of this schema is an error naming it, and is never overwritten.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock, Timeout

from . import upgrades
from .analysis.explain import Details
from .codec import CodecError, decode, encode
from .comparison import Comparison, compare
from .files import write_atomically

if TYPE_CHECKING:
    from .metrics import Metrics
    from .result import MeasuredTest

SCHEMA = "pytest-syncguard/baselines"
SCHEMA_VERSION = 2
LOCK_TIMEOUT_S = 120.0


class BaselineError(Exception):
    """A baseline file that cannot be used (corrupt, foreign, a newer schema); the message names it."""


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


def path_for(directory: Path, slug: str) -> Path:
    """The baseline file of a device slug in ``directory``; a slug that is no slug (``../x/y`` from an untrusted
    JUnit file) is an error, never a path outside it."""
    from .environment import is_slug

    if not is_slug(slug):
        raise BaselineError(f"{slug!r} is not a device slug (lowercase letters, digits and '-')")
    return directory / f"{slug}.json"


def read(path: Path) -> Baseline | None:
    """The baseline in ``path``; None when there is no such file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise BaselineError(f"{path}: not UTF-8 text ({exc}); fix or delete it, it was left as it is") from exc
    except OSError as exc:
        raise BaselineError(f"{path}: cannot read the baseline file: {exc}") from exc
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except (json.JSONDecodeError, ValueError) as exc:
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
    return Baseline(path, str(data.get("device", path.stem)), fingerprint, tests, details)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a baseline can hold")


def document(
    device: str,
    fingerprint: Mapping[str, str | None],
    tests: Mapping[str, Mapping[str, float]],
    details: Mapping[str, Details] | None = None,
) -> str:
    """The file's text: keys sorted, one metric per line, so that merges and reviews stay simple."""
    data = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "device": device,
        "fingerprint": dict(fingerprint),
        "tests": {nodeid: dict(sorted(tests[nodeid].items())) for nodeid in sorted(tests)},
        "details": {nodeid: encode(d) for nodeid, d in sorted((details or {}).items()) if nodeid in tests},
    }
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"


def update(
    path: Path,
    device: str,
    entries: Mapping[str, Mapping[str, float]],
    fingerprint: Mapping[str, str | None],
    details: Mapping[str, Details] | None = None,
) -> int:
    """Write ``entries`` (node id -> metrics) and their ``details`` into the baseline at ``path``, keeping every
    other test's entry. Returns the number of entries written."""
    lock = FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with lock:
            current = read(path)
            tests = dict(current.tests) if current is not None else {}
            kept = dict(current.details) if current is not None else {}
            tests.update({nodeid: dict(metrics) for nodeid, metrics in entries.items()})
            for nodeid in entries:
                kept.pop(nodeid, None)
            kept.update({nodeid: d for nodeid, d in (details or {}).items() if nodeid in entries})
            write_atomically(path, document(device, fingerprint, tests, kept))
    except Timeout as exc:
        raise BaselineError(f"{path}: could not lock {lock.lock_file} within {LOCK_TIMEOUT_S:.0f} s") from exc
    except (OSError, ValueError) as exc:  # ValueError: a metric that is not a finite number
        raise BaselineError(f"{path}: cannot write the baseline file: {exc}") from exc
    return len(entries)


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
        #: Entries written per file, and the files that could not be written (this process's and, on the
        #: xdist controller, its workers').
        self.written: Counter[str] = Counter()
        self.errors: list[str] = []

    def compare(
        self, nodeid: str, device: str, metrics: Metrics, tolerance: float | None = None, details: Details | None = None
    ) -> Comparison:
        """The test's metrics against its entry in the file of ``device``'s model ("cpu" or "cuda"), ``details``
        explaining a change of its counts; raises :class:`BaselineError` naming a file that cannot be read."""
        from .environment import fingerprint, fingerprint_changes, slug_for

        slug = slug_for(device)
        path = path_for(self.directory, slug)
        if path not in self._files:
            self._files[path] = read(path)
        baseline = self._files[path]
        environment = fingerprint(device)
        comparison = compare(
            baseline.tests.get(nodeid) if baseline is not None else None,
            metrics,
            device=slug,
            file=str(path),
            tolerance=self.tolerance if tolerance is None else tolerance,
            fingerprint=environment,
            drift=fingerprint_changes(baseline.fingerprint, environment) if baseline is not None else {},
            host_timings=self.host_timings,
            details=(baseline.details.get(nodeid) if baseline is not None else None, details),
        )
        return replace(comparison, status="updated") if self.updating else comparison

    def write(self, results: Iterable[MeasuredTest]) -> None:
        """Write the entries of the compared tests that ended without a syncguard error, one update per file."""
        by_file: dict[tuple[str, str], dict[str, Mapping[str, float]]] = {}
        details: dict[str, Details] = {}
        environments: dict[tuple[str, str], Mapping[str, str | None]] = {}
        for result in results:
            comparison = result.comparison
            if comparison is not None and result.error is None:
                key = (comparison.file, comparison.device)
                by_file.setdefault(key, {})[result.nodeid] = result.metrics.values
                details[result.nodeid] = result.details()
                environments[key] = comparison.fingerprint
        for (file, slug), entries in sorted(by_file.items()):
            try:
                self.written[file] += update(Path(file), slug, entries, environments[(file, slug)], details)
            except BaselineError as exc:
                self.errors.append(str(exc))

    def worker_output(self) -> dict[str, Any]:
        return {"written": dict(self.written), "errors": list(self.errors)}

    def add_worker_output(self, sent: Mapping[str, Any]) -> None:
        self.written.update(sent["written"])
        self.errors.extend(sent["errors"])

    def worker_lost(self, worker: str, error: object) -> None:
        self.errors.append(f"xdist worker {worker} went down ({error}): its tests' entries are lost")

    def notes(self, *, by_workers: bool) -> list[str]:
        """What an update wrote (per file) and what it could not."""
        if not self.updating:
            return []
        by = " by the xdist workers" if by_workers else ""
        notes = [f"syncguard: wrote {n} baseline entries to {file}{by}" for file, n in sorted(self.written.items())]
        return notes + [f"syncguard: baselines NOT updated: {error}" for error in self.errors]
