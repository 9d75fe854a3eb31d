"""On CUDA, every exact counter of every strategy equals an independent count of the same code: a second run
under torch.profiler with no plugin in it, read as raw trace events (operators, runtime launch calls, kernels,
copies with their bytes, memsets, cudaMalloc/cudaFree)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from pytest_syncguard import SyncGuard
from pytest_syncguard.analysis.trace_file import GRAPH_LAUNCHES, KERNEL_LAUNCHES, profiler_only
from pytest_syncguard.budgets import GuardOptions
from pytest_syncguard.capture import CallCapture
from pytest_syncguard.document.budget import Budget
from pytest_syncguard.measurement import Measurement

transformers = pytest.importorskip("transformers")
from examples import models  # noqa: E402
from examples.strategies import STRATEGIES  # noqa: E402

pytestmark = pytest.mark.gpu
DIRECTIONS = {"HtoD": "h2d", "DtoH": "d2h", "DtoD": "d2d"}


def truth(run: Any, tmp_path: Path) -> dict[str, int]:
    """The counters of one unmeasured run, from the raw events of its profiler trace."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    path = tmp_path / "truth.trace.json"
    prof.export_chrome_trace(str(path))
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    calls = Counter(e["name"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver"))
    counts = {
        "ops": sum(1 for e in events if e.get("cat") == "cpu_op" and not profiler_only(e["name"])),
        "launches": sum(calls[n] for n in KERNEL_LAUNCHES | GRAPH_LAUNCHES),
        "graph_launches": sum(calls[n] for n in GRAPH_LAUNCHES),
        "kernels": sum(1 for e in events if e.get("cat") == "kernel"),
        "memsets": sum(1 for e in events if e.get("cat") == "gpu_memset"),
        "device_mallocs": calls["cudaMalloc"],
        "device_frees": calls["cudaFree"],
    }
    for short, name in DIRECTIONS.items():
        copies = [e for e in events if e.get("cat") == "gpu_memcpy" and e["name"].split()[1:2] == [short]]
        counts[f"copies_{name}"] = len(copies)
        counts[f"copy_bytes_{name}"] = sum(e["args"]["bytes"] for e in copies)
    return counts


def measured(run: Any) -> Measurement:
    """The plugin's counters of one run, its timeline captured the way a launch budget captures it."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    guard = SyncGuard("counters", device="cuda")
    capture = CallCapture.of("counters", guard, [Budget("max_launches_per_token", 1e9)], GuardOptions())
    assert capture.source is not None
    with capture.recording(), guard.generation(tokens=8):
        run()
    try:
        return capture.with_timelines(Measurement.combine(guard.measurements))
    finally:
        capture.keep(None, failed=False)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_counter_equals_the_profilers_raw_events(name: str, tmp_path: Path) -> None:
    model = models.gpt2("cuda", tiny=True)
    prompt = torch.randint(0, 512, (2, 6), generator=torch.Generator().manual_seed(3)).cuda()

    def run() -> object:
        return STRATEGIES[name](model, prompt, 8, 512)

    run()
    run()  # compiled, captured and warmed
    guard = SyncGuard("uncaptured", device="cuda")
    with guard.generation(tokens=8) as plain:
        run()
    counted = measured(run)
    assert plain.count("ops") == counted.count("ops")  # the plugin's own capture adds no operator
    expected = truth(run, tmp_path)
    got = {n: counted.count(n) for n in expected if n != "kernels"}
    assert got == {n: v for n, v in expected.items() if n != "kernels"}, name
    launched = (counted.count("launches") or 0) - (counted.count("graph_launches") or 0)
    assert launched + (counted.count("graph_kernels") or 0) == expected["kernels"]
    assert counted.count("recompiles") == 0 and counted.count("frames_compiled") == 0
    print(name, {n: counted.count(n) for n in (*expected, "graph_kernels")})


def test_the_stop_flag_poll_runs_no_operator_whether_or_not_its_copy_has_completed() -> None:
    """stream_pingpong runs as many operators when its device falls behind (no poll finds its flag's copy
    complete) as when the device keeps up (polls find it complete): its operator count is the program's, not a
    measure of how far the host runs ahead of the device."""
    model = models.gpt2("cuda", tiny=True)
    prompt = torch.randint(0, 512, (2, 6), generator=torch.Generator().manual_seed(3)).cuda()
    cycles = [1]

    def slow_step(module: object, args: object) -> None:
        torch.cuda._sleep(cycles[0])  # not an operator: the same count either way

    def ops(device_behind: bool) -> int | None:
        cycles[0] = 50_000_000 if device_behind else 1  # tens of ms of device time per step, or none
        torch.cuda.synchronize()
        guard = SyncGuard("poll", device="cuda")
        with guard.generation(tokens=16) as region:
            STRATEGIES["stream_pingpong"](model, prompt, 16, 512)
        torch.cuda.synchronize()
        return region.count("ops")

    hook = model.register_forward_pre_hook(slow_step)
    try:
        ops(device_behind=False)  # warm-up
        assert ops(device_behind=True) == ops(device_behind=False) is not None
    finally:
        hook.remove()
