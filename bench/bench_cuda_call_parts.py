"""What the CUDA-call probe (:mod:`pytest_syncguard.probes.cuda_calls`) costs, part by part, and what that bounds
on the suite's strategies (GPT-2 124M, batch 32, prompt 16, 100 new tokens). Needs CUDA.

1. Holding the subscriber (``CudaCallProbe.held``: subscribing, enabling the catalogued callbacks, unsubscribing),
   which a region does before its clock starts and after it stops: median time over repeats.
2. Per call, each loop below timed with and without a counting region inside a held subscriber, interleaved, medians
   of several repeats: a torch sync (``.item()``, whose CUDA calls reach the probe's callback and are torch's), a
   blocking CUDA call made outside torch (``cudaStreamSynchronize`` through ctypes, counted and stamped), and a kernel
   launch (no callback is enabled for it). Each line gives the callbacks CUPTI made per call.
3. Per strategy, one run under a probe that counts its callbacks: callbacks per run, and the cost that part 2's time
   per callback gives them over the run's wall time (the bound the loop pays, without the noise of timing it).

Run from the repository root: ``python -m bench.bench_cuda_call_parts [--strategies a,b] [--calls N]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack

import torch

from bench.bench_timeline_capture import NEW_TOKENS, timed, workload
from examples.strategies import STRATEGIES
from pytest_syncguard.probes import cupti
from pytest_syncguard.probes.cuda_calls import CudaCallProbe
from pytest_syncguard.probes.syncs import PROBE, SyncRecorder

REPEATS = 7


class CountingProbe(CudaCallProbe):
    """The probe, counting the callbacks CUPTI makes into it (entries and exits)."""

    def __init__(self) -> None:
        super().__init__()
        self.callbacks = 0

    def _on_call(self, userdata: object, domain: int, cbid: int, data: int) -> None:
        self.callbacks += 1
        super()._on_call(userdata, domain, cbid, data)


def _region(probe: CudaCallProbe, counted: bool) -> ExitStack:
    """A region as the plugin opens one: the sync probe recording, and with ``counted`` the CUDA-call probe
    counting inside its held subscriber."""
    stack = ExitStack()
    stack.enter_context(PROBE.recording(SyncRecorder(on_device=True)))
    if counted:
        stack.enter_context(probe.held())
        watch = stack.enter_context(probe.counting())
        if watch.not_counted is not None:
            raise SystemExit(f"the CUDA-call probe could not count: {watch.not_counted}")
    return stack


def holding(probe: CudaCallProbe) -> None:
    times = []
    for _ in range(REPEATS * 3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with probe.held():
            pass
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(f"holding the subscriber (subscribe, enable, unsubscribe): {median * 1e6:.0f} us", flush=True)


def per_call(probe: CountingProbe, calls: int) -> float:
    """Part 2; returns the probe's time per callback on a torch sync (what the suite's loops make)."""
    one = torch.ones(1, device="cuda")
    x = torch.zeros(1 << 10, device="cuda")
    torch.cuda.init()
    runtime = cupti.process_library("/libcudart")  # the runtime torch loaded: the same state
    assert runtime is not None, "no shared libcudart in this process"
    loops: dict[str, Callable[[], object]] = {
        "torch sync (.item())": one.item,
        "cudaStreamSynchronize through ctypes": lambda: runtime.cudaStreamSynchronize(None),
        "kernel launch": lambda: x.add_(1),
    }
    per_callback = 0.0
    for name, call in loops.items():
        deltas, callbacks = [], 0
        for repeat in range(REPEATS):
            walls = {}
            for counted in (False, True) if repeat % 2 == 0 else (True, False):
                before = probe.callbacks
                torch.cuda.synchronize()
                with _region(probe, counted):
                    start = time.perf_counter()
                    for _ in range(calls):
                        call()
                    torch.cuda.synchronize()
                    walls[counted] = time.perf_counter() - start
                if counted:
                    callbacks = probe.callbacks - before
            deltas.append((walls[True] - walls[False]) / calls)
        delta = statistics.median(deltas)
        per = callbacks / calls
        print(f"{name:<40} {delta * 1e6:+.2f} us per call, {per:.1f} callbacks per call", flush=True)
        if name.startswith("torch sync") and per:
            per_callback = delta / per
    return per_callback


def bound(probe: CountingProbe, names: list[str], per_callback: float) -> None:
    model, prompt, eos = workload()
    for name in names:
        strategy = STRATEGIES[name]

        def fn(s: Callable[..., object] = strategy) -> object:
            return s(model, prompt, NEW_TOKENS, eos)

        timed(fn)  # warm-up: compiles, captures
        bare = statistics.median(timed(fn) for _ in range(3))
        before = probe.callbacks
        timed(fn, _region(probe, counted=True))
        callbacks = probe.callbacks - before
        print(
            f"{name:<16} {callbacks} callbacks per run ({callbacks / NEW_TOKENS:.1f} per token), run "
            f"{bare * 1e3:.1f} ms: bound {callbacks * per_callback / bare:.2%}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_cuda_call_parts needs CUDA")
    print(f"machine: {torch.cuda.get_device_name()}; torch {torch.__version__}", flush=True)
    probe = CountingProbe()
    holding(probe)
    per_callback = per_call(probe, args.calls)
    print(f"per callback on a torch sync: {per_callback * 1e6:.2f} us", flush=True)
    bound(probe, [n for n in args.strategies.split(",") if n], per_callback)


if __name__ == "__main__":
    main()
