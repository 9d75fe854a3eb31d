"""The allocator probe: peak stats of the CUDA caching allocator around a region, and its allocation history
(for a snapshot that https://pytorch.org/memory_viz opens) around a test's call."""

from __future__ import annotations

import gc
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from ..analysis.counts import RegionCounts, difference
from ..analysis.memory import MemoryStats, expandable_segments_on, region_stats
from .syncs import PROBE

HISTORY_ENTRIES = 100_000


def _expandable() -> bool:
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF") or ""
    return expandable_segments_on(conf)


@contextmanager
def region_memory(collected: list[MemoryStats]) -> Iterator[None]:
    """Reset the peaks of every visible device at entry; at exit append the stats of the devices the region
    allocated on (the current device at least)."""
    devices = range(torch.cuda.device_count())
    before = {d: torch.cuda.memory_stats(d) for d in devices}
    for d in devices:
        torch.cuda.reset_peak_memory_stats(d)
    try:
        yield
    finally:
        current = torch.cuda.current_device()
        expandable = _expandable()
        for d in devices:
            after = torch.cuda.memory_stats(d)
            used = after.get("allocation.all.allocated", 0) != before[d].get("allocation.all.allocated", 0)
            if used or d == current:
                collected.append(region_stats(d, before[d], after, expandable_segments=expandable))


def settle_allocator() -> None:
    """Give back to the driver all the memory that no live tensor holds, on every device, as torch's own test suite
    does before it compares the allocator's numbers: unreachable objects (tensors in reference cycles) are
    collected, the current device's queued work finishes, cuBLAS's cached workspaces are dropped (one per handle
    and stream, taken by the first matrix multiply after them) and the allocator's cached segments are freed.

    Afterwards the allocator holds only the segments of live tensors, so the next measurement's cudaMalloc count,
    reserved peak and fragmentation do not depend on what earlier tests left cached. Nothing happens in a process
    that has not initialized CUDA (it has cached nothing)."""
    if not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return
    gc.collect()
    # Not a sync of any region that may be open around this test (a nested run): neither the synchronize nor the
    # cudaFree calls that freeing makes, which the CUDA-call probe would count.
    with PROBE.unobserved():
        torch.cuda.synchronize()  # the current device: another one's context is not created for it
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None:
            clear_workspaces()
        torch.cuda.empty_cache()  # every device's cache


#: The allocator's own counts of its driver calls, as the region counters name them.
_DRIVER_CALLS = {"device_mallocs": "num_device_alloc", "device_frees": "num_device_free"}
#: How often a cudaMalloc failed and the allocator freed its cache to try again: the GPU's memory ran out.
_RETRIES = "num_alloc_retries"
_READ = {**_DRIVER_CALLS, _RETRIES: _RETRIES}


def _driver_calls() -> dict[str, int]:
    totals = dict.fromkeys(_READ, 0)
    for device in range(torch.cuda.device_count()):
        stats = torch.cuda.memory_stats(device)
        for name, key in _READ.items():
            totals[name] += int(stats.get(key, 0))
    return totals


def out_of_memory(retries: int) -> str:
    """Why a region's allocator numbers are not the test's when the allocator ran out of memory in it."""
    return (
        f"the GPU's memory ran out during the region ({retries} cudaMalloc retr{'y' if retries == 1 else 'ies'} "
        "after freeing the allocator's cache): what the allocator did then depends on what else holds that GPU's "
        "memory (another process, such as an xdist worker on the same GPU), not on the test alone"
    )


@contextmanager
def driver_calls(found: list[RegionCounts]) -> Iterator[None]:
    """Append to ``found`` how many cudaMalloc and cudaFree calls the caching allocator made during the block, on
    every visible device; or, where a cudaMalloc failed and was retried during it, why they are not counted."""
    before = _driver_calls()
    yield
    grown = difference(_driver_calls(), before)
    if retries := grown.get(_RETRIES, 0):
        found.append(RegionCounts(unmeasured=dict.fromkeys(_DRIVER_CALLS, out_of_memory(retries))))
    else:
        found.append(RegionCounts({name: grown.get(name, 0) for name in _DRIVER_CALLS}))


@contextmanager
def allocation_history() -> Iterator[list[Path]]:
    """Record allocator history during the block; on exit the yielded list holds a snapshot file (the
    caller keeps or removes it). Recording is switched off on every exit path."""
    torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES, stacks="python", clear_history=True)
    snapshots: list[Path] = []
    try:
        yield snapshots
    finally:
        try:
            handle, name = tempfile.mkstemp(prefix="syncguard-", suffix=".memory.pickle")
            os.close(handle)
            torch.cuda.memory._dump_snapshot(name)  # type: ignore[no-untyped-call]
            snapshots.append(Path(name))
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
