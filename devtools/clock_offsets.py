"""How host wall-clock stamps (``time.time_ns()``) fall on a capture's trace: for each of N marks, the stamp
taken just before a ``record_function`` range (and a launch inside it) against the range's start and the
launch's runtime record in the exported trace (``ts`` in µs + ``baseTimeNanoseconds``). Needs CUDA.

Run: ``python devtools/clock_offsets.py [N]``; prints percentiles of (trace time - stamp) in µs.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch._C._autograd import _disable_profiler, _enable_profiler, _prepare_profiler
from torch._C._profiler import ProfilerActivity, RecordScope
from torch.autograd.profiler import record_function

from pytest_syncguard.probes.timeline import TIMELINE, _config


@contextmanager
def cuda_only() -> Iterator[list[str]]:
    config = _config()
    activities = {ProfilerActivity.CUDA}
    _prepare_profiler(config, activities)
    _enable_profiler(config, activities, {RecordScope.USER_SCOPE})  # type: ignore[call-arg]
    files: list[str] = []
    try:
        yield files
    finally:
        torch.cuda.synchronize()
        result = _disable_profiler()
        result.save("/tmp/cuda_only.trace.json")
        files.append("/tmp/cuda_only.trace.json")


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    pick = [ordered[int(q * (len(ordered) - 1))] for q in (0.0, 0.1, 0.5, 0.9, 1.0)]
    return "min {:.1f}, p10 {:.1f}, median {:.1f}, p90 {:.1f}, max {:.1f}".format(*pick)


def run(name: str, capture: object, n: int) -> None:
    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    stamps = []
    with capture as files:  # type: ignore[attr-defined]
        for i in range(n):
            before = time.time_ns()
            with record_function(f"mark#{i}"):
                x.add_(1)
            stamps.append((before, time.time_ns()))
            time.sleep(0.0002)
    with open(files[0]) as file:
        raw = json.load(file)
    base = raw.get("baseTimeNanoseconds", 0)
    events = raw["traceEvents"]
    marks = {int(e["name"][5:]): e["ts"] for e in events if e.get("name", "").startswith("mark#")}
    launches = sorted(e["ts"] for e in events if e.get("cat") == "cuda_runtime" and e["name"] == "cudaLaunchKernel")
    print(f"{name}: baseTimeNanoseconds {base}; {len(marks)} marks, {len(launches)} launches recorded")
    if marks:
        offsets = [marks[i] + base / 1e3 - stamps[i][0] / 1e3 for i in marks]
        print(f"  range start - stamp before (us): {percentiles(offsets)}")
    # each launch lies between its mark's stamps: trace time of the launch minus the stamp before it
    found, after = [], []
    for before, end in stamps:
        lo, hi = before / 1e3 - base / 1e3 - 5000, end / 1e3 - base / 1e3 + 5000
        near = [t for t in launches if lo <= t <= hi]
        if near:
            closest = min(near, key=lambda t: abs(t - (before / 1e3 - base / 1e3)))
            found.append(closest + base / 1e3 - before / 1e3)
            after.append(end / 1e3 - (closest + base / 1e3))
    if found:
        print(f"  launch record - stamp before (us): {percentiles(found)}")
        print(
            f"  stamp after - launch record (us): {percentiles(after)}; median of stamp spans "
            f"{statistics.median((e - b) / 1e3 for b, e in stamps):.1f}"
        )


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}")
    run("syncguard capture", TIMELINE.capturing(), n)
    run("CUDA activity only", cuda_only(), n)


if __name__ == "__main__":
    main()
