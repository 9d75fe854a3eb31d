"""The ``--syncguard-json`` results file (schema-versioned)."""

from __future__ import annotations

import json
import os
import platform
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import __version__
from .results import TestResult

SCHEMA = "pytest-syncguard/results"
SCHEMA_VERSION = 1


def results_document(results: Iterable[TestResult]) -> dict[str, Any]:
    import torch

    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "syncguard": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "tests": [r.to_dict() for r in sorted(results, key=lambda r: r.nodeid)],
    }


def write_results(path: Path, results: Iterable[TestResult]) -> None:
    """Write the document atomically: a reader sees the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results_document(results), indent=2, sort_keys=True) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
