"""The results document: every measured test's :class:`.measured.MeasuredTest` as one schema-versioned record,
written and read by :mod:`.codec` alone. It is what ``--syncguard-json`` writes, what an xdist worker sends its
controller (:func:`record`, :func:`from_record`), what ``syncguard ab`` reads of each round and ``syncguard
report`` of a run. Files of schema version 1 still read (:func:`.upgrades.results_v1`)."""

from __future__ import annotations

import dataclasses
import json
import platform
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..codec import CodecError, decode, encode, read_document
from ..environment import is_slug
from ..files import write_atomically
from ..metrics import metric, value_problem
from ..ranks import stopped_at
from ..signals import BY_NAME, ITEMIZED, KINDS
from ..version import __version__
from . import upgrades
from .launch import Launch, LaunchError, RankDocument, join
from .measured import MeasuredTest
from .shard import Shard, missing

SCHEMA = "pytest-syncguard/results"
SCHEMA_VERSION = 2
#: The most processes a launch may say it has: a larger world size is a damaged or hostile file.
MAX_WORLD = 4096


class ResultsError(ValueError):
    """A results file that cannot be read; the message names it and where in it."""


def record(result: MeasuredTest) -> dict[str, Any]:
    """A test's results as plain data (with ``syncs``, ``syncs_per_token`` and ``verdict`` for the reader)."""
    data: dict[str, Any] = encode(result)
    return data


def from_record(data: object, version: int = SCHEMA_VERSION, where: str = "test") -> MeasuredTest:
    """The test that a record of ``version`` holds; :class:`.codec.CodecError` names what is wrong, a metric value
    no measurement can have (negative, past any measurement) included."""
    if version == 1 and isinstance(data, Mapping):
        data = upgrades.results_v1(data)
    result = _with_signal_records(decode(MeasuredTest, data, where), where)
    for name, value in result.metrics.values.items():
        problem = value_problem(name, value)
        if problem is not None:
            raise CodecError(f"{where}.metrics: {problem}")
    return result


def _with_signal_records(result: MeasuredTest, where: str) -> MeasuredTest:
    """The test with each signal's record (and joined record) read as the signal's own type
    (:attr:`..signals.base.Signal.kept`); one no signal of this version keeps is left out (:func:`unknown` names it)."""
    records, joined = {}, {}
    for name, data in result.records.items():
        kept = BY_NAME[name].kept if name in BY_NAME else None
        if kept is not None:
            record = decode(kept.record, data, f"{where}.records.{name}")
            if (problem := kept.problem(record)) is not None:
                raise CodecError(f"{where}.records.{name}: {problem}")
            records[name] = record
    for name, data in result.joined.items():
        kept = BY_NAME[name].kept if name in BY_NAME else None
        if kept is not None and kept.joined is not None:
            joined[name] = decode(kept.joined, data, f"{where}.joined.{name}")
            if (problem := kept.joined_problem(joined[name])) is not None:
                raise CodecError(f"{where}.joined.{name}: {problem}")
    return replace(result, records=records, joined=joined)


def document(
    results: Iterable[MeasuredTest], torch: str, launch: Launch | None = None, shard: Shard | None = None
) -> dict[str, Any]:
    """The file's content: the versions it was measured with (``torch``'s given by the writer), the process of a
    launch that wrote it (``launch``, where it is one of several), the shard of a split suite it holds, and one
    record per test in node id order."""
    content = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "syncguard": __version__,
        "torch": torch,
        "python": platform.python_version(),
        "tests": [record(r) for r in sorted(results, key=lambda r: r.nodeid)],
    }
    if launch is not None:
        content["launch"] = encode(launch)
    if shard is not None:
        content["shard"] = encode(shard)
    return content


def write(
    path: Path, results: Iterable[MeasuredTest], torch: str, launch: Launch | None = None, shard: Shard | None = None
) -> None:
    """Write the document atomically: a reader sees the old file or the whole new one."""
    text = json.dumps(document(results, torch, launch, shard), indent=2, sort_keys=True, allow_nan=False)
    write_atomically(path, text + "\n")


def read(path: Path) -> list[MeasuredTest]:
    """Every test of the results file at ``path``; :class:`ResultsError` names the file and what is wrong."""
    return read_with_unknown(path)[0]


def read_with_unknown(path: Path) -> tuple[list[MeasuredTest], list[str]]:
    """Every test of the results file at ``path``, and what in it this version does not know (:func:`unknown`)."""
    tests, strange, _, _ = _read(path)
    return tests, strange


def read_all(paths: Iterable[Path], unknown: dict[str, list[str]] | None = None) -> list[MeasuredTest]:
    """Every test of the results files, those of the ranks of a launch joined into one test each
    (:func:`.launch.join`); what a file holds that this version does not know goes into ``unknown`` under its path.
    :class:`ResultsError` names a file that cannot be read, or two that are one rank's."""
    alone: list[MeasuredTest] = []
    ranked: list[RankDocument] = []
    shards: list[Shard] = []
    for path in paths:
        tests, strange, launch, data = _read(path)
        if (shard := _shard(path, data.get("shard"))) is not None:
            shards.append(shard)
        if strange and unknown is not None:
            unknown[str(path)] = strange
        if launch is None:
            alone.extend(tests)
        else:
            versions = (str(data.get("syncguard") or ""), str(data.get("torch") or ""))
            stopped = stopped_at(path) if not launch.finished else None
            ranked.append(RankDocument(str(path), launch, tests, stopped, versions))
    try:
        found = alone + join(ranked)
    except LaunchError as exc:
        raise ResultsError(str(exc)) from exc
    return found + missing(shards, next((t.device_slug for t in found if t.device_slug), "unknown"))


def _shard(path: Path, data: object) -> Shard | None:
    """A document's shard of a split suite (None: it holds a whole one); :class:`ResultsError` for one that is none."""
    if data is None:
        return None
    try:
        shard = decode(Shard, data, "shard")
    except CodecError as exc:
        raise ResultsError(f"{path}: {exc}") from exc
    if (problem := shard.problem()) is not None:
        raise ResultsError(f"{path}: shard: {problem}")
    return shard


def _read(path: Path) -> tuple[list[MeasuredTest], list[str], Launch | None, dict[str, Any]]:
    try:
        data, version = read_document(path, SCHEMA, SCHEMA_VERSION, "syncguard results file")
        launch = _launch(data.get("launch"))
        tests = data.get("tests")
        if not isinstance(tests, list):
            raise CodecError("'tests' must be a list")
        results = [from_record(t, version, f"tests[{i}]") for i, t in enumerate(tests)]
        seen: set[str] = set()
        for i, result in enumerate(results):
            if result.nodeid in seen:
                raise CodecError(f"tests[{i}]: test {result.nodeid!r} is in the file twice")
            seen.add(result.nodeid)
        return results, unknown(tests), launch, data
    except CodecError as exc:
        raise ResultsError(f"{path}: {exc}") from exc


def _launch(data: object) -> Launch | None:
    """A document's ``launch`` (None: one process wrote it alone); :class:`.codec.CodecError` for a rank that cannot
    be one of its launch."""
    if data is None:
        return None
    launch = decode(Launch, data, "launch")
    if not 1 < launch.world_size <= MAX_WORLD or not 0 <= launch.rank < launch.world_size:
        raise CodecError(
            f"launch: rank {launch.rank} of {launch.world_size} is no rank of a launch (0 <= rank < "
            f"world size, 2 to {MAX_WORLD} processes)"
        )
    if launch.device_slug and not is_slug(launch.device_slug):
        raise CodecError(f"launch.device_slug: {launch.device_slug!r} is no device slug")
    return launch


def unknown(records: Iterable[object]) -> list[str]:
    """What records written by another version hold that this one does not know, each named once: a field of a
    test's record, a metric, a budget's marker, an itemized counter, a signal's record (``field energy_j``, ``metric
    x``). The records read without them (:mod:`..codec` leaves unknown fields out; the gate judges only the metrics
    and budgets it knows): the report says so instead of dropping them silently."""
    fields = {f.name for f in dataclasses.fields(MeasuredTest)} | set(MeasuredTest.DERIVED)
    known = {name for name, signal in BY_NAME.items() if signal.kept is not None}
    found: dict[str, set[str]] = {"field": set(), "metric": set(), "budget": set(), "counter": set(), "record": set()}
    for data in records:
        if not isinstance(data, Mapping):
            continue
        found["field"] |= {str(k) for k in data if k not in fields}
        values = data.get("metrics", {}).get("values", {}) if isinstance(data.get("metrics"), Mapping) else {}
        found["metric"] |= {str(k) for k in values if metric(str(k)) is None} if isinstance(values, Mapping) else set()
        for check in data.get("checks") or ():
            budget = check.get("budget") if isinstance(check, Mapping) else None
            marker = budget.get("marker") if isinstance(budget, Mapping) else None
            if isinstance(marker, str) and marker not in KINDS:
                found["budget"].add(marker)
        for kind in ("records", "joined"):
            kept = data.get(kind)
            found["record"] |= {str(k) for k in kept if k not in known} if isinstance(kept, Mapping) else set()
        counted = data.get("counted_top")
        found["counter"] |= {str(k) for k in counted if k not in ITEMIZED} if isinstance(counted, Mapping) else set()
    return [f"{kind} {name}" for kind, names in found.items() for name in sorted(names)]
