"""The results document: every measured test's :class:`.result.MeasuredTest` as one schema-versioned record,
written and read by :mod:`.codec` alone. It is what ``--syncguard-json`` writes, what an xdist worker sends its
controller (:func:`record`, :func:`from_record`), what ``syncguard ab`` reads of each round and ``syncguard
report`` of a run. Files of schema version 1 still read (:func:`.upgrades.results_v1`)."""

from __future__ import annotations

import json
import platform
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .. import __version__
from ..codec import CodecError, decode, encode, read_document
from ..files import write_atomically
from ..metrics import value_problem
from ..result import MeasuredTest
from . import upgrades

SCHEMA = "pytest-syncguard/results"
SCHEMA_VERSION = 2


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
    result = decode(MeasuredTest, data, where)
    for name, value in result.metrics.values.items():
        problem = value_problem(name, value)
        if problem is not None:
            raise CodecError(f"{where}.metrics: {problem}")
    return result


def document(results: Iterable[MeasuredTest]) -> dict[str, Any]:
    """The file's content: the versions it was measured with, and one record per test in node id order."""
    import torch

    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "syncguard": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "tests": [record(r) for r in sorted(results, key=lambda r: r.nodeid)],
    }


def write(path: Path, results: Iterable[MeasuredTest]) -> None:
    """Write the document atomically: a reader sees the old file or the whole new one."""
    write_atomically(path, json.dumps(document(results), indent=2, sort_keys=True, allow_nan=False) + "\n")


def read(path: Path) -> list[MeasuredTest]:
    """Every test of the results file at ``path``; :class:`ResultsError` names the file and what is wrong."""
    try:
        data, version = read_document(path, SCHEMA, SCHEMA_VERSION, "syncguard results file")
        tests = data.get("tests")
        if not isinstance(tests, list):
            raise CodecError("'tests' must be a list")
        results = [from_record(t, version, f"tests[{i}]") for i, t in enumerate(tests)]
        seen: set[str] = set()
        for i, result in enumerate(results):
            if result.nodeid in seen:
                raise CodecError(f"tests[{i}]: test {result.nodeid!r} is in the file twice")
            seen.add(result.nodeid)
        return results
    except CodecError as exc:
        raise ResultsError(f"{path}: {exc}") from exc
