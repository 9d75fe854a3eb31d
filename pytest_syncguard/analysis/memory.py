"""CUDA caching-allocator numbers of a region, from two readings of ``torch.cuda.memory_stats()`` (pure
arithmetic over the stats dicts, no torch)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

#: Counters whose change over the region is reported (each device malloc/free can itself synchronize).
_DELTAS = {
    "alloc_retries": "num_alloc_retries",
    "ooms": "num_ooms",
    "device_mallocs": "num_device_alloc",
    "device_frees": "num_device_free",
}


@dataclass(frozen=True)
class MemoryStats:
    """The allocator in one region, on one device (bytes and counts)."""

    DERIVED: ClassVar[tuple[str, ...]] = ("fragmentation",)

    device: int
    allocated_peak: int
    reserved_peak: int
    inactive_split_peak: int
    alloc_retries: int
    ooms: int
    device_mallocs: int
    device_frees: int
    expandable_segments: bool

    @property
    def fragmentation(self) -> float:
        """1 - allocated_peak / reserved_peak: the share of the reserved peak that never held live tensors at
        the allocated peak (0 when nothing was reserved). It holds with and without expandable segments."""
        if self.reserved_peak <= 0:
            return 0.0
        return 1.0 - self.allocated_peak / self.reserved_peak


def region_stats(
    device: int, before: Mapping[str, Any], after: Mapping[str, Any], *, expandable_segments: bool
) -> MemoryStats:
    """The region's numbers: peaks read at exit (they were reset at entry), counters as exit minus entry."""
    deltas = {name: int(after.get(key, 0)) - int(before.get(key, 0)) for name, key in _DELTAS.items()}
    return MemoryStats(
        device=device,
        allocated_peak=int(after.get("allocated_bytes.all.peak", 0)),
        reserved_peak=int(after.get("reserved_bytes.all.peak", 0)),
        inactive_split_peak=int(after.get("inactive_split_bytes.all.peak", 0)),
        expandable_segments=expandable_segments,
        **deltas,
    )


def expandable_segments_on(alloc_conf: str) -> bool:
    """Whether a ``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF`` value turns expandable segments on."""
    for option in alloc_conf.split(","):
        key, _, value = option.partition(":")
        if key.strip() == "expandable_segments":
            return value.strip().lower() == "true"
    return False
