"""On CUDA: the CUDA-call probe counts the host-blocking calls that torch's probe cannot see, made by a C++/CUDA
extension built here and through ctypes, each once and at the line of this file that made it; their asynchronous
counterparts and torch's own syncs count nothing there (torch's probe counts the latter)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_syncguard.probes.cuda_calls import CUDA_CALLS
from pytest_syncguard.probes.syncs import PROBE, SyncRecorder
from pytest_syncguard.probes.timeline import cupti_detached_afterwards

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

SOURCE = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>

static cudaStream_t current() { return at::cuda::getCurrentCUDAStream().stream(); }

int64_t read_length(torch::Tensor lengths) {  // what an attention library's planner does
  int64_t length = 0;
  cudaMemcpy(&length, lengths.data_ptr(), sizeof(length), cudaMemcpyDeviceToHost);
  return length;
}
void synchronize_stream() { cudaStreamSynchronize(current()); }
void copy_to_host(torch::Tensor host, torch::Tensor device) {
  cudaMemcpyAsync(host.data_ptr(), device.data_ptr(), device.nbytes(), cudaMemcpyDeviceToHost, current());
}
void free_outside_the_allocator() {
  void* block = nullptr;
  cudaMalloc(&block, 1 << 20);
  cudaFree(block);
}
void fill_async(torch::Tensor device) { cudaMemsetAsync(device.data_ptr(), 0, device.nbytes(), current()); }
"""
FUNCTIONS = ["read_length", "synchronize_stream", "copy_to_host", "free_outside_the_allocator", "fill_async"]


@pytest.fixture(scope="module")
def extension(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from torch.utils.cpp_extension import load_inline

    build = tmp_path_factory.mktemp("cuda_calls_extension")
    return load_inline("syncguard_cuda_calls", SOURCE, functions=FUNCTIONS, with_cuda=True, build_directory=str(build))


def _runtime() -> ctypes.CDLL:
    """The CUDA runtime torch loaded (the same library, so the same state), as ctypes sees it."""
    torch.cuda.init()
    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "/libcudart" in line})
    assert paths, "no shared libcudart in this process"
    return ctypes.CDLL(paths[0])


def _counted(fn: Callable[[], object]) -> tuple[list[tuple[str, int]], int]:
    """The probe's calls (function, line in this file) and torch's probe's syncs, for one call of ``fn``."""
    torch.cuda.synchronize()
    recorder = SyncRecorder(on_device=True)
    with PROBE.recording(recorder), CUDA_CALLS.counting() as watch:
        fn()
    assert watch.not_counted is None, watch.not_counted
    assert all(site is not None and Path(site.filename) == Path(__file__) for _, site in watch.calls), watch.calls
    return [(name, site.lineno) for name, site in watch.calls if site is not None], recorder.syncs


def _line(fn: Callable[..., object]) -> int:
    """The line of a one-line case's body."""
    return fn.__code__.co_firstlineno + 1


def test_an_extension_reading_a_device_value_with_cudamemcpy_counts_one_sync(extension: Any) -> None:
    lengths = torch.tensor([7], device="cuda")

    def case() -> None:
        assert extension.read_length(lengths) == 7

    assert _counted(case) == ([("cudaMemcpy", _line(case))], 0)


def test_an_extension_synchronizing_its_stream_counts_one_sync(extension: Any) -> None:
    def case() -> None:
        extension.synchronize_stream()

    assert _counted(case) == ([("cudaStreamSynchronize", _line(case))], 0)


def test_device_and_context_synchronizes_through_ctypes_count_one_sync_each() -> None:
    runtime = _runtime()
    driver = ctypes.CDLL("libcuda.so.1")

    def device() -> None:
        runtime.cudaDeviceSynchronize()

    def context() -> None:
        driver.cuCtxSynchronize()

    assert _counted(device) == ([("cudaDeviceSynchronize", _line(device))], 0)
    assert _counted(context) == ([("cuCtxSynchronize", _line(context))], 0)


def test_a_free_outside_the_caching_allocator_counts_one_sync(extension: Any) -> None:
    def case() -> None:
        extension.free_outside_the_allocator()

    assert _counted(case) == ([("cudaFree", _line(case))], 0)


def test_an_asynchronous_copy_counts_only_into_pageable_memory(extension: Any) -> None:
    device = torch.arange(1024, device="cuda")
    pinned = torch.empty(1024, dtype=device.dtype, pin_memory=True)
    pageable = torch.empty(1024, dtype=device.dtype)

    def into_pinned() -> None:
        extension.copy_to_host(pinned, device)

    def into_pageable() -> None:
        extension.copy_to_host(pageable, device)

    assert _counted(into_pinned) == ([], 0)
    assert _counted(into_pageable) == ([("cudaMemcpyAsync", _line(into_pageable))], 0)
    torch.cuda.synchronize()
    assert torch.equal(pageable, device.cpu()) and torch.equal(pinned, device.cpu())


def test_asynchronous_work_counts_nothing(extension: Any) -> None:
    device = torch.ones(1 << 20, device="cuda")
    pinned = torch.empty(1 << 20, pin_memory=True)

    def work() -> None:
        extension.fill_async(device)
        torch.mul(device, 2, out=device)  # a kernel launch
        pinned.copy_(device, non_blocking=True)

    assert _counted(work) == ([], 0)


def test_syncs_torch_counts_are_not_counted_again_at_the_cuda_level() -> None:
    """``.item()`` is a cudaMemcpyAsync and a cudaStreamSynchronize inside torch, ``torch.cuda.synchronize()`` a
    cudaDeviceSynchronize: torch's probe counts each once, the CUDA-call probe none. torch's sync-debug mode, the
    second witness, sees the scalar read (it does not check ``torch.cuda.synchronize()``)."""
    value = torch.ones(1, device="cuda")
    with pytest.warns(UserWarning, match="synchronizing"):
        torch.cuda.set_sync_debug_mode("warn")
        try:
            assert _counted(lambda: value.item()) == ([], 1)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    assert _counted(torch.cuda.synchronize) == ([], 1)


def test_while_a_profiler_capture_holds_cupti_the_probe_says_so_and_counts_again_after() -> None:
    with cupti_detached_afterwards(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
        torch.ones(4, device="cuda").sum()
        with CUDA_CALLS.counting() as watch:
            torch.cuda.synchronize()
    assert watch.calls == [] and watch.not_counted is not None and "subscriber" in watch.not_counted
    torch.ones(4, device="cuda").sum()  # kineto detaches CUPTI on the exit of the first runtime call after a capture
    torch.cuda.synchronize()

    def case() -> None:
        _runtime().cudaDeviceSynchronize()

    assert _counted(case) == ([("cudaDeviceSynchronize", _line(case))], 0)
