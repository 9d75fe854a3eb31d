"""Experiment for counting every host-blocking CUDA call (issue 44), on a CUDA machine: what CUPTI's callback API
reports for the syncs a decoding loop makes, whoever makes them, and whether a subscriber can exist beside torch's
profiler.

    python -m devtools.cupti_callbacks [--out FILE]

1. Per case (torch's ``.item()``, ``torch.cuda.synchronize()``, a stream and an event synchronize, ``cudaMalloc``
   and ``cudaFree``, ``cudaDeviceSynchronize`` and ``cuCtxSynchronize`` through ctypes, ``non_blocking`` copies
   into pinned and into pageable memory): every runtime and driver call reported on entry, in order, with its
   domain, callback id and name, whether it came while another reported call was open on the thread (a runtime
   call's own driver calls), and the innermost Python frame outside this file.
2. ``cuptiSubscribe``'s result beside torch.profiler: before a capture, during one, and after it, for a capture
   taken as the plugin takes it (kineto detaching CUPTI when it stops) and for a plain one.
3. (Run before 2.) The cost of a Python callback on one enabled call (``cudaEventQuery``, what ``Event.query()``
   makes): ns per call with and without the subscriber, medians of interleaved rounds.

Nothing here is used by the plugin; it tells how to build the probe. Its results go to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

from pytest_syncguard.probes import cupti
from pytest_syncguard.probes.cuda_calls import CALLBACK, DRIVER, ENTER, RUNTIME, CallbackData
from pytest_syncguard.probes.timeline import cupti_detached_afterwards


def _caller() -> str:
    """The innermost Python frame outside this file and ctypes."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename == __file__ or "ctypes" in frame.f_code.co_filename):
        frame = frame.f_back  # type: ignore[assignment]
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}" if frame else "(no frame)"


class Recorder:
    """A CUPTI subscriber that records every enabled call on entry while ``recording``."""

    def __init__(self, cupti: ctypes.CDLL) -> None:
        self.cupti = cupti
        self.calls: list[dict[str, Any]] = []
        self.recording = False
        self.open = threading.local()
        self.handle = ctypes.c_void_p()
        self.callback = CALLBACK(self._on_call)  # kept: CUPTI calls it for as long as it is subscribed

    def _on_call(self, userdata: object, domain: int, cbid: int, data: int) -> None:
        info = CallbackData.from_address(data)
        depth = getattr(self.open, "depth", 0)
        if info.callbackSite != ENTER:
            self.open.depth = max(depth - 1, 0)
            return
        self.open.depth = depth + 1
        if self.recording:
            name = (info.functionName or b"?").decode()
            self.calls.append({"domain": domain, "cbid": cbid, "name": name, "nested": depth > 0, "at": _caller()})

    def subscribe(self) -> int:
        return int(self.cupti.cuptiSubscribe(ctypes.byref(self.handle), self.callback, None))

    def enable_domains(self) -> None:
        for domain in (DRIVER, RUNTIME):
            self.cupti.cuptiEnableDomain(1, self.handle, domain)

    def unsubscribe(self) -> int:
        return int(self.cupti.cuptiUnsubscribe(self.handle))

    @contextmanager
    def case(self, name: str, found: dict[str, list[dict[str, Any]]]) -> Iterator[None]:
        torch.cuda.synchronize()
        self.calls, self.recording = [], True
        try:
            yield
        finally:
            self.recording = False
            found[name] = self.calls


def torch_runtime() -> ctypes.CDLL:
    """The CUDA runtime torch loaded (a shared libcudart in its process), as ctypes sees it: the same library, so
    the same state."""
    torch.cuda.init()
    runtime = cupti.process_library("/libcudart")
    if runtime is None:
        raise SystemExit("no shared libcudart in this process: ctypes cases need one")
    return runtime


def cases(recorder: Recorder) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    cudart, driver = torch_runtime(), ctypes.CDLL("libcuda.so.1")
    x = torch.ones(1 << 20, device="cuda")
    pinned = torch.empty(1 << 20, pin_memory=True)
    pageable = torch.empty(1 << 20)
    stream, event = torch.cuda.current_stream(), torch.cuda.Event()
    pointer = ctypes.c_void_p()

    def event_synchronize() -> None:
        event.record()
        event.synchronize()

    steps: dict[str, Callable[[], object]] = {
        "item": lambda: x.sum().item(),
        "torch.cuda.synchronize": torch.cuda.synchronize,
        "Stream.synchronize": stream.synchronize,
        "Event.synchronize": event_synchronize,
        "ctypes cudaDeviceSynchronize": cudart.cudaDeviceSynchronize,
        "ctypes cuCtxSynchronize": driver.cuCtxSynchronize,
        "ctypes cudaMalloc": lambda: cudart.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(1 << 20)),
        "ctypes cudaFree": lambda: cudart.cudaFree(pointer),
        "non_blocking copy to pinned": lambda: pinned.copy_(x, non_blocking=True),
        "non_blocking copy to pageable": lambda: pageable.copy_(x, non_blocking=True),
        "kernel launch": lambda: x.add_(1),
    }
    for name, step in steps.items():
        with recorder.case(name, found):
            step()
    torch.cuda.synchronize()
    return found


def beside_the_profiler(recorder: Recorder) -> dict[str, int]:
    """cuptiSubscribe's result before, during and after torch.profiler captures (ours unsubscribed before each):
    first one as the plugin takes it (kineto detaching CUPTI when it stops, ``cupti_detached_afterwards``), then
    a plain one. Kineto subscribes when it initializes (the first capture) and, unless told to detach, keeps its
    subscriber; a second subscriber gets CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (39)."""
    results = {"unsubscribe": recorder.unsubscribe(), "before": recorder.subscribe()}
    for mode, detached in (("detached", True), ("plain", False)):
        recorder.unsubscribe()
        detaching = cupti_detached_afterwards() if detached else nullcontext()
        with detaching, torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
            torch.ones(4, device="cuda").sum()
            results[f"during {mode}"] = recorder.subscribe()
            if results[f"during {mode}"] == 0:
                recorder.unsubscribe()
        torch.cuda.synchronize()
        results[f"after {mode}"] = recorder.subscribe()
    return results


def callback_cost(recorder: Recorder, rounds: int = 7, calls: int = 20000) -> dict[str, float]:
    """ns per ``Event.query()`` with the subscriber's callback on ``cudaEventQuery`` only, and with none."""
    event = torch.cuda.Event()
    event.record()
    torch.cuda.synchronize()
    names = _callback_ids(recorder.cupti, RUNTIME)
    wanted = [cbid for cbid, name in names.items() if name.startswith("cudaEventQuery")]
    subscribed: list[float] = []
    bare: list[float] = []
    for _ in range(rounds):
        for side, into in (("on", subscribed), ("off", bare)):
            if side == "on":
                recorder.subscribe()
                for cbid in wanted:
                    recorder.cupti.cuptiEnableCallback(1, recorder.handle, RUNTIME, cbid)
            start = time.perf_counter_ns()
            for _ in range(calls):
                event.query()
            into.append((time.perf_counter_ns() - start) / calls)
            if side == "on":
                recorder.unsubscribe()
    return {"ns_with_callback": statistics.median(subscribed), "ns_without": statistics.median(bare)}


def _callback_ids(cupti: ctypes.CDLL, domain: int, largest: int = 2000) -> dict[int, str]:
    """The domain's callback ids and their names, as this CUPTI numbers them (cuptiGetCallbackName)."""
    names = {}
    name = ctypes.c_char_p()
    for cbid in range(1, largest):
        if cupti.cuptiGetCallbackName(domain, cbid, ctypes.byref(name)) == 0 and name.value:
            names[cbid] = name.value.decode()
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.ones(1, device="cuda").sum().item()  # context and lazy inits before anything is recorded
    recorder = Recorder(cupti.load())
    report: dict[str, Any] = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
    report["subscribe"] = recorder.subscribe()
    if report["subscribe"] == 0:
        recorder.enable_domains()
        report["cases"] = cases(recorder)
        recorder.unsubscribe()
        report["callback_cost"] = callback_cost(recorder)
        recorder.subscribe()
    # Last: a plain capture leaves kineto subscribed for the rest of the process.
    report["beside_the_profiler"] = beside_the_profiler(recorder)
    for name, calls in report.get("cases", {}).items():
        print(f"{name}:")
        for call in calls:
            kind = "driver " if call["domain"] == DRIVER else "runtime"
            nested = "nested" if call["nested"] else ""
            print(f"    {kind} {call['cbid']:4d} {call['name']:<36} {nested:<6} {call['at']}")
    print("subscribe:", report["subscribe"], "beside the profiler:", report["beside_the_profiler"])
    print("callback cost:", report.get("callback_cost"))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
