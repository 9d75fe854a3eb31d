"""Cut the data of one idle-cause comparison for tests/data: a sampled region kept by
``devtools/keep_sampled_regions.py`` and a trace of the same loop, each to ``--steps`` decode steps.

- the region: its samples in the share ``[--first, --first + --steps)`` of ``--total`` steps of its time after the
  marker kernel, where the marker began in the samples, its launch, and the launches and syncs of that window;
- the trace (``--trace``, a torch.profiler trace with CUDA driver and runtime records): its events in the same
  share of its kernels' time span (the trace's loop runs the same steps).

    python devtools/trim_cause_data.py REGION.json.gz OUT.json.gz --first 40 --steps 20 --total 100 \\
        [--trace LOOP.trace.json.gz --trace-out OUT.trace.json.gz]
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import Any

from pytest_syncguard.analysis import sampled
from pytest_syncguard.analysis.sampled import StepEvents
from pytest_syncguard.analysis.trace_file import GPU_CATEGORIES, HOST_CATEGORIES, RANGE_CATEGORIES
from pytest_syncguard.probes.sampler import ACTIVE_CYCLES, ELAPSED_CYCLES


def trim_region(data: dict[str, Any], first: int, steps: int, total: int) -> dict[str, Any]:
    """The region's samples within the share ``[first, first + steps)`` of ``total`` steps of its time after the
    marker kernel, with where the marker began in the samples (``marker_ns``), its launch and the launches and
    syncs of that window."""
    metrics = data["metrics"]
    active, elapsed = (data["columns"][metrics.index(name)] for name in (ACTIVE_CYCLES, ELAPSED_CYCLES))
    fractions = sampled.active_fractions(active, elapsed)
    events = data["events"]
    placed = sampled.place_steps(
        data["start_ns"], data["end_ns"], fractions, tuple(data["window"]),
        StepEvents(events["marker_end_us"], tuple(events["steps_us"]), events["from"]), data["interval_ns"],
    )  # fmt: skip
    if isinstance(placed, str):
        raise SystemExit(placed)
    span = data["window"][1] - placed.begin_ns
    begin, until = (placed.begin_ns + span * share // total for share in (first, first + steps))
    keep = [i for i, (a, b) in enumerate(zip(data["start_ns"], data["end_ns"], strict=True)) if b > begin and a < until]
    returned = data["launches"]["returned_ns"]
    entered = data["launches"].get("entered_ns") or returned
    marker = next(i for i, ns in enumerate(returned) if ns >= data["window"][0])
    launches = [marker, *(i for i, ns in enumerate(returned) if begin - 200_000 <= ns <= until)]
    return {
        "test": data["test"],
        "metrics": metrics,
        "start_ns": [data["start_ns"][i] for i in keep],
        "end_ns": [data["end_ns"][i] for i in keep],
        "columns": [[column[i] for i in keep] for column in data["columns"]],
        "interval_ns": data["interval_ns"],
        "window": [begin, until],
        "region_start_ns": data["window"][0],
        "marker_ns": placed.marker_ns,
        "syncs": [sync for sync in data["syncs"] if begin - 200_000 <= sync[0] <= until],
        "launches": [returned[i] for i in launches],
        "entered": [entered[i] for i in launches],
        "graphs": [g for g in data["launches"].get("graphs", ()) if g[0] <= until],
    }


def trim_trace(events: list[dict[str, Any]], first: int, steps: int, total: int) -> list[dict[str, Any]]:
    """The events the analysis reads (and of their arguments, those it reads) that start within the share
    ``[first, first + steps)`` of ``total`` steps of its kernels' time span (its kernels run the steps in order),
    and the launch calls before it of the device work inside."""
    kept = [
        e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES | HOST_CATEGORIES | RANGE_CATEGORIES
    ]
    kernels = [e for e in kept if e["cat"] == "kernel"]
    start, end = min(k["ts"] for k in kernels), max(k["ts"] + k["dur"] for k in kernels)
    low, high = start + (end - start) * first / total, start + (end - start) * (first + steps) / total
    inside = [e for e in kept if low <= e["ts"] <= high]
    # The launches of the device work inside, also those made before it (a host that queues steps ahead).
    launched = {e.get("args", {}).get("correlation") for e in inside if e["cat"] in GPU_CATEGORIES}
    before = [
        e
        for e in kept
        if e["ts"] < low and e["cat"] in HOST_CATEGORIES and e.get("args", {}).get("correlation") in launched
    ]
    read = ("stream", "correlation", "bytes")  # the arguments the analysis reads
    return [
        {key: e[key] for key in ("ph", "cat", "name", "ts", "dur", "tid", "pid") if key in e}
        | {"args": {k: e["args"][k] for k in read if k in e.get("args", {})}}
        for e in before + inside
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("region", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--first", type=int, default=40)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--total", type=int, default=100, help="the steps of the loop (both runs)")
    parser.add_argument("--trace", type=Path)
    parser.add_argument("--trace-out", type=Path)
    args = parser.parse_args()
    with gzip.open(args.region, "rt") as source:
        data = json.load(source)
    with gzip.open(args.out, "wt") as out:
        json.dump(trim_region(data, args.first, args.steps, args.total), out)
    if args.trace and args.trace_out:
        with gzip.open(args.trace, "rt") as source:
            events = json.load(source)["traceEvents"]
        with gzip.open(args.trace_out, "wt") as out:
            json.dump({"traceEvents": trim_trace(events, args.first, args.steps, args.total)}, out)


if __name__ == "__main__":
    main()
