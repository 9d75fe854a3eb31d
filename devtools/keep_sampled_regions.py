"""A pytest plugin that keeps what the plugin judges each sampled region from, as test data: its PM samples, the
window, the step events, the counted syncs and the launch log (its graph launches with what each graph holds), one
gzipped JSON file per region in ``$SYNCGUARD_KEEP_REGIONS`` (``region<N>.json.gz``, N counting from 1 in the order
judged).

    SYNCGUARD_KEEP_REGIONS=DIR PYTHONPATH=devtools python -m pytest -p keep_sampled_regions \\
        examples/test_strategies.py -k test_timeline --syncguard --syncguard-timeline=sampled

``python devtools/trim_cause_data.py`` cuts one for tests/data.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pytest_syncguard import instruments

_judge = instruments.judge_sampled_region
_kept = [0]


def as_json(region: Any, warmup_steps: int, syncs: Any, launches: Any, test: str | None) -> dict[str, Any]:
    """The judgement's inputs as plain JSON values."""
    samples, events = region.samples, region.events
    return {
        "test": test,
        "metrics": list(samples.metrics),
        "start_ns": list(samples.start_ns),
        "end_ns": list(samples.end_ns),
        "columns": [list(column) for column in samples.columns],
        "interval_ns": samples.interval_ns,
        "window": list(region.window),
        "events": None
        if events is None
        else {"marker_end_us": events.marker_end_us, "steps_us": list(events.steps_us), "from": events.steps_from},
        "warmup_steps": warmup_steps,
        "syncs": [list(sync) for sync in syncs],
        "launches": None
        if launches is None
        else {
            "returned_ns": list(launches.returned_ns),
            "entered_ns": list(launches.entered_ns),
            "lost": launches.lost,
            "not_logged": launches.not_logged,
            "graphs": [[ns, None if nodes is None else asdict(nodes)] for ns, nodes in launches.graphs()],
        },
    }


def _keeping(region: Any, warmup_steps: int, syncs: Any = (), launches: Any = None) -> Any:
    _kept[0] += 1
    folder = Path(os.environ["SYNCGUARD_KEEP_REGIONS"])
    data = as_json(region, warmup_steps, syncs, launches, os.environ.get("PYTEST_CURRENT_TEST"))
    with gzip.open(folder / f"region{_kept[0]}.json.gz", "wt") as out:
        json.dump(data, out)
    return _judge(region, warmup_steps, syncs, launches)


def pytest_configure(config: Any) -> None:
    if os.environ.get("SYNCGUARD_KEEP_REGIONS"):
        instruments.judge_sampled_region = _keeping
