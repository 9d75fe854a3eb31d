"""On CUDA: the timeline capture records the device's work and the plugin's annotations and no host operator;
its device-side numbers and counts agree with a capture that records every operator; CUDA graph replays and
``region.step()`` make the steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_syncguard import SyncGuard
from pytest_syncguard.analysis import gaps, trace_file
from pytest_syncguard.budgets import GuardOptions
from pytest_syncguard.capture import CallCapture
from pytest_syncguard.document.budget import Budget
from pytest_syncguard.measurement import Measurement

pytestmark = pytest.mark.gpu
BUDGETS = [Budget("max_gpu_idle_us", 1e9), Budget("max_launches_per_token", 1e9)]


class Step(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(1024, 1024, device="cuda") / 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(8):
            x = torch.tanh(x @ self.w)
        return x


def captured(loop: Any, *, host_ops: bool = False) -> tuple[trace_file.Trace, Measurement]:
    """The trace and measurement of ``loop(guard)`` under the capture a timeline budget makes."""
    torch.cuda.synchronize()
    guard = SyncGuard("capture", device="cuda")
    capture = CallCapture.of("capture", guard, BUDGETS, GuardOptions(warmup_steps=2))
    capture.instrument.host_ops = host_ops  # type: ignore[attr-defined]  # the trace's
    try:
        with capture.recording():
            loop(guard)
        trace = trace_file.load(capture.instrument.trace_files[0])
        return trace, capture.with_timelines(Measurement.combine(guard.measurements))
    finally:
        capture.keep(None, failed=False)


def read_each_step(guard: SyncGuard) -> None:
    torch.manual_seed(0)
    step = Step()
    x = torch.randn(256, 1024, device="cuda")
    with torch.no_grad(), guard.generation(model=step):
        for _ in range(12):
            x = step(x)
            if x.sum().item() > 1e30:  # HOST READ
                break


def test_the_capture_records_no_host_operator_and_agrees_with_one_that_does() -> None:
    read_each_step(SyncGuard("warm-up", device="cuda"))
    trace, measurement = captured(read_each_step)
    assert not any(r.category == "cpu_op" for r in trace.ranges)
    kinds = {r.name.split("#")[0].split(" ")[0] for r in trace.ranges}
    assert {"syncguard.region", "syncguard.step", "syncguard.sync", "syncguard.sentinel"} <= kinds
    assert measurement.unreliable_timeline is None
    (timeline,) = measurement.gpu_timelines
    assert (timeline.steps, timeline.judged_steps, timeline.steps_from) == (12, 10, gaps.FORWARD_STEPS)
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "# HOST READ" in text)
    top = timeline.top_gaps[0]
    assert top.cause == gaps.HOST_SYNC and f"test_gpu_capture.py:{line} in read_each_step" in top.detail

    full_trace, full = captured(read_each_step, host_ops=True)
    assert any(r.category == "cpu_op" for r in full_trace.ranges)
    (full_timeline,) = full.gpu_timelines
    for counter in ("launches", "copies_d2h", "memsets"):  # exact: the same program
        assert measurement.count(counter) == full.count(counter), counter
    assert timeline.gpu_ops == full_timeline.gpu_ops
    # Device time does not depend on how slow the host is.
    print(f"device busy: capture {timeline.busy_us:.0f} us, with host operators {full_timeline.busy_us:.0f} us")
    assert timeline.busy_us == pytest.approx(full_timeline.busy_us, rel=0.05)


def test_a_capture_after_a_profiler_run_that_left_cupti_attached_loses_no_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A torch.profiler run without TEARDOWN_CUPTI leaves CUPTI attached. When a capture started with the variable
    set, kineto detached that CUPTI in a thread that finished while the capture recorded, and the capture lost its
    last kernels (the sentinel's): an H200 run of this file after test_gpu_timeline.py."""
    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    read_each_step(SyncGuard("warm-up", device="cuda"))
    for _ in range(3):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
            torch.randn(64, 64, device="cuda").sum().item()
        _, measurement = captured(read_each_step)
        assert measurement.unreliable_timeline is None
        assert measurement.count("launches") > 0


def test_cuda_graph_replays_are_the_steps_and_the_prefill_is_not_judged() -> None:
    pytest.importorskip("transformers")
    from examples import models
    from examples.strategies import cuda_graph

    model = models.gpt2("cuda", tiny=True)
    prompt = torch.randint(0, 512, (2, 6), generator=torch.Generator().manual_seed(3)).cuda()
    cuda_graph(model, prompt, 12, 512)  # captures the graph

    def loop(guard: SyncGuard) -> None:
        with guard.generation(tokens=12):
            cuda_graph(model, prompt, 12, 512)

    trace, measurement = captured(loop)
    (timeline,) = measurement.gpu_timelines
    replays = sum(1 for c in trace.host_calls if c.name in trace_file.GRAPH_LAUNCHES)
    assert replays == 11 == measurement.count("graph_launches")
    assert (timeline.steps, timeline.judged_steps, timeline.steps_from) == (11, 9, gaps.GRAPH_STEPS)
    # No judged op was launched before the third replay: the eager prefill is out.
    launches = sorted(c.start for c in trace.host_calls if c.name in trace_file.GRAPH_LAUNCHES)
    judged_from = launches[2]
    host = {c.correlation: c.start for c in trace.host_calls if c.correlation is not None}
    window = gaps.regions(trace)[measurement.region_numbers[0]]
    inside = [op for op in trace.gpu_ops if window[0] <= host.get(op.correlation, op.start) <= window[1]]
    assert timeline.gpu_ops == sum(1 for op in inside if host.get(op.correlation, op.start) >= judged_from)


def test_a_loop_that_marks_its_steps_is_judged_by_them() -> None:
    step = Step()
    x = torch.randn(256, 1024, device="cuda")

    def loop(guard: SyncGuard) -> None:
        y = x
        with torch.no_grad(), guard.generation(model=step) as region:
            for _ in range(6):  # two forward calls per marked step
                region.step()
                y = step(step(y))

    _, measurement = captured(loop)
    (timeline,) = measurement.gpu_timelines
    assert (timeline.steps, timeline.judged_steps, timeline.steps_from) == (6, 4, gaps.MARKED_STEPS)


def test_kernels_launched_through_the_driver_have_their_launch_records(tmp_path: Path) -> None:
    """The capture keeps CUDA driver calls: a Triton kernel and cuBLASLt's GEMM kernels (both launched through the
    driver) have their launch records, so the gaps before them get a cause; the launches are counted as often as an
    independent profiler run sees them launched."""
    pytest.importorskip("triton")
    compiled = torch.compile(lambda x: torch.tanh(x) * 2 + 1)  # one Triton kernel per call, no CUDA graph
    x = torch.randn(1 << 16, device="cuda")
    w = torch.randn(1024, 1024, device="cuda")
    compiled(x)  # compiles outside the measurement
    w @ w
    calls = 20

    def loop(guard: SyncGuard) -> None:
        with guard.generation(tokens=calls):
            for _ in range(calls):
                compiled(x)
                w @ w

    trace, measurement = captured(loop)
    launched = {c.correlation for c in trace.host_calls if c.correlation is not None}
    kernels = [op for op in trace.gpu_ops if op.category == "kernel" and "sentinel" not in op.name.lower()]
    unrecorded = [op.name for op in kernels if op.correlation not in launched]
    driver = [c for c in trace.host_calls if c.name.startswith("cuLaunch")]
    print(f"kernels {len(kernels)}, driver launch records {len(driver)}, without a launch record: {unrecorded[:3]}")
    assert not unrecorded
    assert len(driver) >= calls

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        loop(SyncGuard("independent", device="cuda"))
    profile.export_chrome_trace(str(tmp_path / "independent.json"))
    independent = trace_file.load(tmp_path / "independent.json")
    kernels_seen = [op for op in independent.gpu_ops if op.category == "kernel"]
    print(f"launches: capture {measurement.count('launches')}, kernels of the independent run {len(kernels_seen)}")
    assert measurement.count("launches") == len(kernels_seen)
