"""A pytest plugin that writes each measured test's counters run by run (``-p devtools.run_counts`` from the
repository root, with ``SYNCGUARD_RUN_COUNTS=DIR``): one JSON line per test to ``DIR/<xdist worker or main>.jsonl``,
``{"nodeid", "worker", "parts": [[{counter: value, ...} per run] per part]}``, the values a test's count is made
from (:func:`pytest_syncguard.analysis.counts.total`). How the runs of the allocator's counts were looked at under
pytest-xdist (docs/explanation/gate.md)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_syncguard.guard import SyncGuard


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield
    guard = getattr(item, "funcargs", {}).get("syncguard")
    folder = os.environ.get("SYNCGUARD_RUN_COUNTS")
    if not isinstance(guard, SyncGuard) or not folder or not guard.measurements:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    parts = [
        [dict(run.values) | {f"{name} not counted": why for name, why in run.unmeasured.items()} for run in runs]
        for m in guard.measurements
        for runs in m._count_runs()
    ]
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / f"{worker}.jsonl", "a") as file:
        file.write(json.dumps({"nodeid": item.nodeid, "worker": worker, "parts": parts}) + "\n")
