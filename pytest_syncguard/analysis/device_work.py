"""Exact counts of the device work a region launched, from the CUDA activity of a profiler trace: kernel and
CUDA graph launches (with the kernels the graphs ran), copies each way with their bytes, memsets (pure
functions, no torch).

The host side decides what belongs to a region: a launch counts when its runtime call started inside the
region's window, and device work when the call that launched it (matched by correlation id) did. The copy nodes
of a CUDA graph count with its kernels (``graph_kernels``), whatever kind of record CUPTI gives them; copies
count those the host launched itself. A kernel with
no launch call in the trace was launched through the CUDA driver API (Triton does), whose calls the capture
does not record: it counts as one launch per correlation id when it started on the device inside the window (a
region begins and ends with a device sync, so nothing it launched runs outside it).
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from .counts import RegionCounts, top_items
from .trace_file import GRAPH_LAUNCHES, KERNEL_LAUNCHES, HostCall, Trace

#: Copy direction from the name the profiler gives a memcpy ("Memcpy HtoD (Pageable -> Device)").
_DIRECTIONS = {"HtoD": "h2d", "DtoH": "d2h", "DtoD": "d2d", "PtoP": "d2d"}
GRAPH_LAUNCH_ITEM = "(CUDA graph launch)"


class DeviceTime(NamedTuple):
    """The device's own busy time in a traced region's judged decode steps: the union of its kernels', copies' and
    memsets' intervals over all streams, as the device recorded them (host time does not enter it)."""

    busy_us: float
    judged_steps: int
    steps: int
    """Decode steps seen in the region (0: none were seen, and the time is over the whole region)."""


#: The counters here whose contributors a region keeps besides the launches (by kernel).
ITEMIZED_HERE = ("graph_kernels", "copies_h2d", "copies_d2h", "copies_d2d", "memsets")
#: Every counter the device work gives a region (the timeline signal's counters: ``signals/timeline.py`` declares
#: them, and a test holds the two lists equal).
COUNTED_HERE = ("launches", "graph_launches", *ITEMIZED_HERE, "copy_bytes_h2d", "copy_bytes_d2h", "copy_bytes_d2d")


def _sized(name: str, size: int) -> str:
    """A copy or memset as a contributor: ``Memcpy DtoD (Device -> Device), 256 B``."""
    return f"{name}, {size} B"


def _direction(name: str) -> str | None:
    parts = name.split()
    return _DIRECTIONS.get(parts[1]) if len(parts) > 1 and parts[0] == "Memcpy" else None


def device_work(trace: Trace, window: tuple[float, float]) -> RegionCounts:
    """The launches, copies and memsets of the calls the host made inside ``window`` (host time, us)."""
    start, end = window
    inside: dict[int, HostCall] = {}
    recorded: set[int] = set()
    launches = graph_launches = 0
    for call in trace.host_calls:
        if call.correlation is not None:
            recorded.add(call.correlation)
        if not start <= call.start <= end:
            continue
        if call.correlation is not None:
            inside[call.correlation] = call
        if call.name in KERNEL_LAUNCHES:
            launches += 1
        elif call.name in GRAPH_LAUNCHES:
            graph_launches += 1
    kernels: Counter[str] = Counter()
    values = dict.fromkeys(
        (
            "graph_kernels",
            "copies_h2d",
            "copy_bytes_h2d",
            "copies_d2h",
            "copy_bytes_d2h",
            "copies_d2d",
            "copy_bytes_d2d",
            "memsets",
        ),
        0,
    )
    unrecorded: set[int] = set()
    items: dict[str, Counter[str]] = {name: Counter() for name in ITEMIZED_HERE}
    for op in trace.gpu_ops:
        launch = inside.get(op.correlation) if op.correlation is not None else None
        if launch is None and op.correlation not in recorded and start <= op.start <= end:
            # Work whose host call the trace does not hold (the driver API's: the profiler records the runtime's
            # calls only) counts where the device ran it, inside the window.
            if op.category == "kernel" and op.correlation is not None:
                unrecorded.add(op.correlation)
                kernels[op.name] += 1
            elif (direction := _direction(op.name)) is not None:
                values[f"copies_{direction}"] += 1
                values[f"copy_bytes_{direction}"] += op.bytes
                items[f"copies_{direction}"][_sized(op.name, op.bytes)] += 1
            continue
        if launch is None:
            continue
        if launch.name in GRAPH_LAUNCHES and op.category != "gpu_memset":
            # A graph's copy nodes count with its kernels: CUPTI reports a device-to-device copy node as a kernel
            # (memcpy32_post) in one capture and as a copy in another of the same loop (H100, issue 33). Its memset
            # nodes, which it reports as memsets in both, count as memsets.
            values["graph_kernels"] += 1
            items["graph_kernels"][op.name if op.category == "kernel" else _sized(op.name, op.bytes)] += 1
        elif op.category == "kernel":
            kernels[op.name] += 1
        elif op.category == "gpu_memset":
            values["memsets"] += 1
            items["memsets"][_sized(op.name, op.bytes)] += 1
        elif (direction := _direction(op.name)) is not None:
            values[f"copies_{direction}"] += 1
            values[f"copy_bytes_{direction}"] += op.bytes
            items[f"copies_{direction}"][_sized(op.name, op.bytes)] += 1
    if graph_launches:
        kernels[GRAPH_LAUNCH_ITEM] = graph_launches
    values.update(launches=launches + len(unrecorded) + graph_launches, graph_launches=graph_launches)
    return RegionCounts(values, {"launches": top_items(kernels), **{k: top_items(v) for k, v in items.items()}})


def unreliable_counts(reason: str) -> RegionCounts:
    """No device-work count, for a trace that cannot be trusted: each counter of the timeline says why."""
    return uncounted(f"the GPU timeline is unreliable: {reason}")


def uncounted(reason: str) -> RegionCounts:
    """No device-work count: each counter of the timeline says why."""
    return RegionCounts(unmeasured=dict.fromkeys(COUNTED_HERE, reason))


#: Why a sampled region has no device-work count.
NO_COUNTING_RUN = (
    "device work is counted from the trace of syncguard.measure()'s counting run (repeat >= 2); a sampled "
    "timeline (--syncguard-timeline=sampled) records no launch"
)
