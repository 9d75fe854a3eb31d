"""On CUDA, ``--syncguard-timeline=sampled``: a known host pause between device work is measured as the gap it is,
a graph loop's busy fraction against the kernel time a trace gives for the same loop, launches counted exactly
from measure()'s counting run, the gap after a counted sync attributed to it, and the sampler usable after a
capture that detached CUPTI."""

from __future__ import annotations

import json
import re
import statistics

import pytest

pytestmark = pytest.mark.gpu

LOOPS = """
import json
import time
from pathlib import Path

import pytest
import torch

PAUSE_S = 0.003


@pytest.mark.max_gpu_idle_us(1000)
def test_host_pause(syncguard):
    x = torch.zeros(1, device="cuda")
    pauses = []

    def loop():
        for _ in range(10):
            torch.cuda._sleep(200_000)
            x.add_(1)
            torch.cuda.synchronize()  # SYNC: returns as the device goes idle, before each pause
            start = time.perf_counter()
            time.sleep(PAUSE_S)  # PAUSE: the device idles while the host sleeps, as long as the host's clock says
            pauses.append(time.perf_counter() - start)

    # A warm-up run first: the first sync a process records takes the sync probe tens of ms (seen: 22.5 ms).
    # Then the counting run and the two timed (sampled) runs: the last 20 pauses.
    syncguard.measure(loop, tokens=10, repeat=2)
    Path("pauses.json").write_text(json.dumps(pauses))


@pytest.mark.max_launches_per_token(50)
@pytest.mark.min_gpu_busy(0.5)
def test_counted_launches(syncguard):
    x = torch.zeros(4096, 4096, device="cuda")  # 128 MiB read and written a launch: the device is the bound

    def loop():
        for _ in range(10 * 50):
            x.mul_(1.0001)

    syncguard.measure(loop, tokens=10, repeat=3)


@pytest.mark.max_launches_per_token(49)
def test_counted_launches_over(syncguard):
    x = torch.zeros(4096, device="cuda")
    syncguard.measure(lambda: [x.mul_(1.0001) for _ in range(10 * 50)], tokens=10, repeat=2)


@pytest.mark.max_launches_per_token(50)
def test_no_counting_run(syncguard):
    x = torch.zeros(4096, device="cuda")
    with syncguard.generation(tokens=10):
        for _ in range(10 * 50):
            x.mul_(1.0001)
"""


def test_sampled_timeline_measures_a_pause_and_counts_launches_from_the_counting_run(
    pytester: pytest.Pytester,
) -> None:
    written = pytester.makepyfile(test_loops=LOOPS)
    line = next(i for i, text in enumerate(written.read_text().splitlines(), 1) if "# SYNC" in text)
    result = pytester.runpytest_subprocess(
        "--syncguard", "--syncguard-timeline=sampled", "--syncguard-require-gpu", "-v"
    )
    out = result.stdout.str()
    print(out)
    result.assert_outcomes(passed=1, failed=3)
    measured = re.search(r"max_gpu_idle_us: limit 1000 us \(max gap\), measured ([\d.]+) us", out)
    assert measured is not None
    # The host sleeps about 3 ms with the device idle: how long, its own clock says (a fixed 3000-3400 us read
    # 3852.7 on one lent H100 host). Around each pause a sync returns and a launch reaches the device (tens of us
    # each on the lent H100s): each timed region's widest gap is its longest pause, plus that, within a sample at
    # each end. The budget judges the median of the two regions' widest gaps.
    pauses = json.loads((pytester.path / "pauses.json").read_text())
    assert len(pauses) == 40  # warm-up, counting run, two timed runs
    expected = statistics.median([max(pauses[20:30]), max(pauses[30:40])]) * 1e6
    print(f"widest gap {measured.group(1)} us, longest host pauses (median of the timed runs) {expected:.1f} us")
    assert expected - 2 <= float(measured.group(1)) <= expected + 400
    assert "steps: none: no marked step, forward call or graph replay in the region, which is judged whole" in out
    # Each pause began as the counted synchronize returned: the gap is a host sync, named with its call site.
    assert re.search(rf"host sync .*\n\s+explicit synchronize at \S*test_loops.py:{line} in ", out), out
    assert "max_launches_per_token: limit 49 per token, measured 50.0: 500 kernel launches and 0 CUDA graph" in out
    assert re.search(r"test_counted_launches .*PASS", out)
    assert "device work is counted from the trace of syncguard.measure()'s counting run" in out


GRAPH_STEPS = """
import time

import pytest
import torch

STEPS, PAUSED = 12, 7


@pytest.mark.max_gpu_idle_us(1000)
def test_graph_steps(syncguard):
    step = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, device="cuda") for _ in range(8)])
    x = torch.randn(256, 1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        step(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        step(x)

    def loop():
        torch.cuda._sleep(100_000)  # work before the first step, as a prefill: never judged
        for index in range(STEPS):
            graph.replay()
            if index == PAUSED:
                torch.cuda.synchronize()
                time.sleep(0.003)

    syncguard.measure(loop, tokens=STEPS, repeat=2)
"""


@pytest.mark.parametrize("source", ["trace", "sampled"])
def test_a_graph_loop_has_the_same_steps_and_the_pause_in_the_same_step_under_both_sources(
    pytester: pytest.Pytester, source: str
) -> None:
    """Steps from graph replays, the first two left out as warm-up, and the widest gap (a 3 ms host pause after
    replay 7) in step 8, the step whose replay ended it: the same under the trace (graph launches in its records)
    and the sampled source (CUDA events before the first replay and after each, placed by the marker kernel)."""
    pytester.makepyfile(test_steps=GRAPH_STEPS)
    result = pytester.runpytest_subprocess("--syncguard", f"--syncguard-timeline={source}", "-v")
    out = result.stdout.str()
    print(out)
    result.assert_outcomes(failed=1)
    assert "10 steps judged after 2 warm-up; steps: CUDA graph launches" in out
    widest = re.search(r"max_gpu_idle_us: limit 1000 us \(max gap\), measured ([\d.]+) us", out)
    assert widest is not None and 3000 <= float(widest.group(1)) <= 4500
    top = re.search(r"^\s+([\d.]+) us  host sync\s+step (\d+)", out, re.MULTILINE)
    assert top is not None and int(top.group(2)) == 8, out


def test_a_graph_loop_is_as_busy_sampled_as_its_kernel_time_over_its_unprofiled_time() -> None:
    """The same graph loop: busy fraction of the sampled timeline against the kernels' time in a trace (CUPTI's
    records) over the wall time of an unprofiled run; then the sampler after a capture that detached CUPTI."""
    import time

    import torch

    from pytest_syncguard.analysis import gaps, trace_file
    from pytest_syncguard.budgets import GuardOptions
    from pytest_syncguard.capture import CallCapture
    from pytest_syncguard.document.budget import Budget
    from pytest_syncguard.guard import SyncGuard
    from pytest_syncguard.probes.timeline import TIMELINE
    from pytest_syncguard.timeline_source import SAMPLED, TimelineSource

    def _sampled() -> TimelineSource:
        return TimelineSource(SAMPLED, "the test's")

    step = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, device="cuda") for _ in range(8)])
    x = torch.randn(256, 1024, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(stream):
        step(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        step(x)

    def loop() -> None:
        for _ in range(200):
            graph.replay()

    loop()
    torch.cuda.synchronize()
    with TIMELINE.capturing() as files:  # kernel time; this capture also detaches CUPTI when it stops
        loop()
        torch.cuda.synchronize()
    trace = trace_file.load(files[0])
    files[0].unlink()
    timeline = gaps.analyze(trace)
    assert timeline is not None
    walls = []
    for _ in range(3):
        torch.cuda.synchronize()
        began = time.perf_counter()
        loop()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - began)
    kernel_share = timeline.busy_us / 1e6 / sorted(walls)[1]

    guard = SyncGuard("graph", device="cuda")
    capture = CallCapture.of("graph", guard, [Budget("min_gpu_busy", 0.1)], GuardOptions(), source=_sampled)
    with capture.recording():
        guard.measure(loop, tokens=200, repeat=3)
    try:
        assert capture.instrument.problem is None  # type: ignore[attr-defined]
        measurement = capture.with_timelines(guard.measurements[0])
    finally:
        capture.keep(None, failed=False)  # the counting run's trace
    assert measurement.count("launches") == 200
    busy = sorted(t.busy_fraction for t in measurement.gpu_timelines)[1]
    print(f"sampled busy {busy:.3f}, kernel time / unprofiled wall time {kernel_share:.3f}")
    assert len(measurement.gpu_timelines) == 3
    assert busy == pytest.approx(kernel_share, rel=0.10)
