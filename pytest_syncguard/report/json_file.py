"""The ``--syncguard-json`` results file (schema-versioned)."""

from __future__ import annotations

import json
import platform
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import __version__
from ..files import write_atomically
from ..result import MeasuredTest

SCHEMA = "pytest-syncguard/results"
SCHEMA_VERSION = 1


def results_document(results: Iterable[MeasuredTest]) -> dict[str, Any]:
    import torch

    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "syncguard": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "tests": [r.to_dict() for r in sorted(results, key=lambda r: r.nodeid)],
    }


def write_results(path: Path, results: Iterable[MeasuredTest]) -> None:
    """Write the document atomically: a reader sees the old file or the whole new one."""
    write_atomically(path, json.dumps(results_document(results), indent=2, sort_keys=True) + "\n")
