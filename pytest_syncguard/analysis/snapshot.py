"""The largest allocation sites of a CUDA allocator snapshot (the pickle that https://pytorch.org/memory_viz
opens): pure functions over its ``device_traces``, no torch."""

from __future__ import annotations

import gzip
import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOP_SITES = 5


class SnapshotError(ValueError):
    """A file that is not an allocator snapshot; the message names it."""


@dataclass(frozen=True)
class AllocationSite:
    """The allocations made from one Python call site during the recording."""

    site: str
    """``file:line in function`` of the first frame outside torch and this plugin."""
    allocations: int
    total_bytes: int
    largest_bytes: int


def load(path: Path) -> dict[str, Any]:
    """Read a snapshot written by ``torch.cuda.memory._dump_snapshot``, gzipped or not. It is a pickle: read
    only files this plugin or your own run wrote."""
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb") as handle:
            data = pickle.load(handle)
    except (OSError, pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise SnapshotError(f"{path}: not a readable allocator snapshot ({exc})") from exc
    if not isinstance(data, dict) or "device_traces" not in data:
        raise SnapshotError(f"{path}: not an allocator snapshot (no 'device_traces')")
    return data


def allocation_sites(
    snapshot: Mapping[str, Any], internal: Callable[[str], bool], top: int = TOP_SITES
) -> list[AllocationSite]:
    """Sites of the ``alloc`` actions in the recorded history, largest single allocation first.

    ``internal(filename)`` says whether a frame belongs to torch or the plugin; the site of an allocation is its
    innermost frame for which it says no ("?" when it has none).
    """
    counts: dict[str, list[int]] = {}
    for trace in snapshot.get("device_traces", []):
        for entry in trace:
            if entry.get("action") != "alloc":
                continue
            site = next(
                (
                    f"{f['filename']}:{f['line']} in {f['name']}"
                    for f in entry.get("frames", [])
                    if not internal(f["filename"])
                ),
                "?",
            )
            size = int(entry.get("size", 0))
            numbers = counts.setdefault(site, [0, 0, 0])
            numbers[0] += 1
            numbers[1] += size
            numbers[2] = max(numbers[2], size)
    sites = [AllocationSite(site, n, total, largest) for site, (n, total, largest) in counts.items()]
    sites.sort(key=lambda s: (-s.largest_bytes, -s.total_bytes, s.site))
    return sites[:top]
