"""What the profiler (CUPTI's activity records, through torch.profiler) records for each copy function syncguard's
CUDA-call probe reads, called through ctypes: each host call's name and category, and each device record's name,
category and bytes, with their correlation. Run on a GPU machine: ``python devtools/copy_records.py [OUT.json]``."""

from __future__ import annotations

import ctypes
import json
import sys
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from pytest_syncguard.probes import cupti
from pytest_syncguard.probes.cuda_calls import Memcpy2D

ROWS, WIDTH, PITCH, FLAT = 32, 512, 1024, 4096


def _runtime() -> ctypes.CDLL:
    runtime = cupti.process_library("/libcudart")  # the runtime torch loaded: the same state
    assert runtime is not None, "no shared libcudart in this process"
    return runtime


def main() -> None:
    torch.cuda.init()
    device = torch.zeros(ROWS * PITCH, dtype=torch.uint8, device="cuda")
    pinned = torch.zeros(ROWS * PITCH, dtype=torch.uint8).pin_memory()
    pageable = torch.zeros(ROWS * PITCH, dtype=torch.uint8)
    runtime, driver = _runtime(), ctypes.CDLL("libcuda.so.1")
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    d, p, h = device.data_ptr(), pinned.data_ptr(), pageable.data_ptr()
    host, on_device = 1, 2  # CUmemorytype
    d2h_pinned = Memcpy2D.of((on_device, d), (host, p), WIDTH, ROWS, PITCH)
    d2h_pageable = Memcpy2D.of((on_device, d), (host, h), WIDTH, ROWS, PITCH)
    h2d_pinned = Memcpy2D.of((host, p), (on_device, d), WIDTH, ROWS, PITCH)
    calls: dict[str, Any] = {
        "cudaMemcpy2DAsync": lambda: runtime.cudaMemcpy2DAsync(
            ctypes.c_void_p(d), ctypes.c_size_t(PITCH), ctypes.c_void_p(h), ctypes.c_size_t(PITCH),
            ctypes.c_size_t(WIDTH), ctypes.c_size_t(ROWS), ctypes.c_int(1), stream),
        "cuMemcpyAsync d2h pinned": lambda: driver.cuMemcpyAsync(ctypes.c_uint64(p), ctypes.c_uint64(d),
                                                                  ctypes.c_size_t(FLAT), stream),
        "cuMemcpyAsync h2d pageable": lambda: driver.cuMemcpyAsync(ctypes.c_uint64(d), ctypes.c_uint64(h),
                                                                    ctypes.c_size_t(FLAT), stream),
        "cuMemcpy2D d2h pageable": lambda: driver.cuMemcpy2D_v2(ctypes.byref(d2h_pageable)),
        "cuMemcpy2DAsync h2d pinned": lambda: driver.cuMemcpy2DAsync_v2(ctypes.byref(h2d_pinned), stream),
        "cuMemcpy2DAsync d2h pinned": lambda: driver.cuMemcpy2DAsync_v2(ctypes.byref(d2h_pinned), stream),
    }  # fmt: skip
    found = {}
    for name, call in calls.items():
        assert call() == 0, name  # warm
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(2):
                assert call() == 0, name
            torch.cuda.synchronize()
        path = f"/tmp/{name.replace(' ', '_')}.json"
        prof.export_chrome_trace(path)
        with open(path) as trace:
            events = json.load(trace)["traceEvents"]
        kept = [{"name": e.get("name"), "cat": e.get("cat"), "bytes": (e.get("args") or {}).get("bytes"),
                 "correlation": (e.get("args") or {}).get("correlation")}
                for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver", "gpu_memcpy", "kernel")
                and "Synchronize" not in str(e.get("name"))]  # fmt: skip
        found[name] = kept
        print(name)
        for event in kept:
            print("   ", event)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as out:
            json.dump(found, out, indent=1)


if __name__ == "__main__":
    main()
