"""The collective probe: each collective a region calls (all-reduce, all-gather, ... of torch.distributed, the
functional collectives of DTensor and torch.compile alike), in order, with its Python call site.

How: as the sync probe does for its operators, a kernel at the ``BackendSelect`` dispatch key of each catalogued
``c10d`` and ``_c10d_functional`` operator (:data:`CATALOGUE`): ``dist.all_reduce`` reaches the dispatcher as
``c10d::allreduce_`` whatever the backend (NCCL, gloo), and a functional collective as its own operator, which
calls the ``c10d`` one inside it: that inner call is not counted again. The kernel records the call and
redispatches. The kernels are registered while a counting run's region records (as the operator counter, only
there: the Python kernel costs each collective tens of microseconds, a host-bound tensor-parallel loop 1.6x its
step time, bench/results/h200x2_collective_probe.txt) and only where a process group is initialized (a process
without one can run no collective: it counts 0), and removed on every exit path.

The calls, in order, are what the report pairs with the collectives' kernels of a traced run
(:mod:`..analysis.collectives`) to name each collective's call site.

The collective times: where the region runs on CUDA in a process group of NCCL, torch's own flight recorder keeps
each collective (its group, sequence number, the host's time it was enqueued, its Python stack) and, with
``TORCH_NCCL_ENABLE_TIMING=1``, its time on the device from CUDA events around it. The plugin sets both variables
where the user has not (:func:`..environment.collective_timing`, before any test makes a process group), so that
every region that is not a counting run (a ``generation()`` region, a ``measure()``'s timed runs) keeps its
collectives' times (:data:`REGION_PROBES`): the region's window of wall-clock time selects them from the recorder
once the region's clock has stopped, after torch's watchdog has timed them (up to :data:`WAIT_S`). Such a region
also counts its collectives from the recorder, not with the Python kernel above, so that it runs as it would
without syncguard: two CUDA events per collective (bench/results/h200x2_collective_truth.txt).
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch._C import DispatchKey

from ..analysis.collectives import MAX_KERNELS, TimedCollective, TimedRegion
from ..analysis.counts import RegionCounts, top_items
from ..analysis.sites import Frame
from ..environment import TIMING_VARIABLE
from ..signals.collectives import CALLS, TIMED
from .call_sites import first_user_frame, is_internal_file
from .region import RegionProbe

_DISPATCH_KEY = "BackendSelect"
#: The collective operators, by namespace, and the name each is shown by.
CATALOGUE: dict[str, dict[str, str]] = {
    "c10d": {
        "allreduce_": "all_reduce",
        "allreduce_coalesced_": "all_reduce_coalesced",
        "allgather_": "all_gather",
        "_allgather_base_": "all_gather_into_tensor",
        "allgather_coalesced_": "all_gather_coalesced",
        "allgather_into_tensor_coalesced_": "all_gather_into_tensor_coalesced",
        "reduce_scatter_": "reduce_scatter",
        "_reduce_scatter_base_": "reduce_scatter_tensor",
        "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor_coalesced",
        "broadcast_": "broadcast",
        "reduce_": "reduce",
        "alltoall_": "all_to_all",
        "alltoall_base_": "all_to_all_single",
        "gather_": "gather",
        "scatter_": "scatter",
        "barrier": "barrier",
        "send": "send",
        "recv_": "recv",
    },
    "_c10d_functional": {
        "all_reduce": "all_reduce",
        "all_reduce_": "all_reduce",
        "all_reduce_coalesced": "all_reduce_coalesced",
        "all_reduce_coalesced_": "all_reduce_coalesced",
        "all_gather_into_tensor": "all_gather_into_tensor",
        "all_gather_into_tensor_out": "all_gather_into_tensor",
        "all_gather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
        "reduce_scatter_tensor": "reduce_scatter_tensor",
        "reduce_scatter_tensor_out": "reduce_scatter_tensor",
        "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
        "all_to_all_single": "all_to_all_single",
        "broadcast": "broadcast",
        "broadcast_": "broadcast",
    },
}


class _Inside(threading.local):
    depth = 0


def grouped() -> bool:
    """Whether this process has an initialized process group (collectives can run)."""
    distributed = sys.modules.get("torch.distributed")
    return bool(distributed is not None and distributed.is_available() and distributed.is_initialized())


class CollectiveProbe:
    """Process-wide owner of the collectives' kernels; a region's list of calls attaches to it."""

    def __init__(self) -> None:
        self._calls: list[list[str]] = []
        self._inside = _Inside()
        self._libraries: list[torch.library.Library] = []
        self._labels: dict[tuple[str, Frame | None], str] = {}
        """Each (operation, call site)'s label, made once (a site's path relative to the working directory)."""
        self._lock = threading.Lock()

    @contextmanager
    def recording(self, calls: list[str]) -> Iterator[list[str]]:
        """Each collective of the block, ``op at file:line in function``, appended to ``calls`` in call order."""
        with self._lock:
            if not self._calls:
                self._install()
            self._calls.append(calls)
        try:
            yield calls
        finally:
            with self._lock:
                if calls in self._calls:
                    self._calls.remove(calls)
                if not self._calls:
                    self._uninstall()

    def _kernel(self, op: Any, shown: str) -> Callable[..., Any]:
        after = torch._C._dispatch_keyset_full_after(DispatchKey.BackendSelect)
        redispatch = op._handle.redispatch_boxed
        inside, attached, labels = self._inside, self._calls, self._labels

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            if inside.depth == 0 and attached:
                _, site, _ = first_user_frame(sys._getframe(1))
                label = labels.get((shown, site))
                if label is None:
                    label = labels[(shown, site)] = f"{shown} at {site.shown()}" if site is not None else shown
                for calls in attached:
                    calls.append(label)
            inside.depth += 1
            try:
                return redispatch(keyset & after, *args, **kwargs)
            finally:
                inside.depth -= 1

        return kernel

    def _install(self) -> None:
        try:
            for namespace, ops in CATALOGUE.items():
                library = torch.library.Library(namespace, "IMPL")  # type: ignore[no-untyped-call]
                self._libraries.append(library)
                for name, shown in ops.items():
                    qualified = f"{namespace}::{name}"
                    if not torch._C._dispatch_has_kernel(qualified):
                        continue  # not in this build of torch
                    if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, _DISPATCH_KEY):
                        raise RuntimeError(
                            f"syncguard: {qualified} already has a {_DISPATCH_KEY} kernel; refusing to replace it"
                        )
                    op = getattr(getattr(torch.ops, namespace), name).default
                    library.impl(name, self._kernel(op, shown), _DISPATCH_KEY, with_keyset=True)  # type: ignore[no-untyped-call]
        except BaseException:
            self._uninstall()
            raise

    def _uninstall(self) -> None:
        libraries, self._libraries = self._libraries, []
        for library in libraries:
            library._destroy()  # type: ignore[no-untyped-call]


PROBE = CollectiveProbe()


def filled(number: int, tokens: int | None, calls: list[str]) -> dict[str, Any]:
    """A region's part of the measurement (:data:`..signals.collectives.CALLS`): its tokens and calls in order."""
    return {CALLS: {number: (tokens, tuple(calls))}} if calls else {}


@contextmanager
def counting(found: list[RegionCounts], calls: list[str]) -> Iterator[None]:
    """Record the block's collectives into ``calls``; on exit append their count (``collectives``) and the largest
    call sites to ``found``. A process without a process group counts 0 and installs nothing."""
    if not grouped():
        found.append(RegionCounts({"collectives": 0}))
        yield
        return
    with PROBE.recording(calls):
        yield
    found.append(RegionCounts({"collectives": len(calls)}, {"collectives": top_items(Counter(calls))}))


#: How long a region's end waits for torch's watchdog to time its collectives (it wakes every 100 ms or so), and how
#: often it looks.
WAIT_S, POLL_S = 2.0, 0.02


def _recorded(stacks: bool) -> list[dict[str, Any]] | None:
    """The flight recorder's collectives (oldest first), with their Python stacks if ``stacks``; None where this
    torch has no recorder or no process group of NCCL."""
    dump = getattr(torch._C._distributed_c10d, "_dump_nccl_trace", None) if torch.distributed.is_available() else None
    if dump is None:
        return None
    try:
        entries = pickle.loads(dump(True, stacks, False)).get("entries", [])  # torch's own bytes, of this process
    except Exception:  # no NCCL process group (a gloo one), or a torch whose recorder says nothing
        return None
    return [e for e in entries if not e.get("is_p2p")]


def records_collectives(region: Any) -> bool:
    """Whether the flight recorder gives the region's collectives: a region on CUDA that is not a counting run, in a
    process whose default group is NCCL's, with the recorder's timing on (the counting run keeps the Python kernel,
    whose calls the traced kernels pair with)."""
    if not (region.on_cuda and not region.counting and grouped()):
        return False
    return os.environ.get(TIMING_VARIABLE) == "1" and torch.distributed.get_backend() == "nccl"


def _site(frames: list[dict[str, Any]]) -> str | None:
    for frame in frames:
        filename = str(frame.get("filename", ""))
        if filename and not is_internal_file(filename):
            return Frame(filename, int(frame.get("line", 0)), str(frame.get("name", ""))).shown()
    return None


@contextmanager
def _window(window: list[int]) -> Iterator[None]:
    window.append(time.time_ns())
    try:
        yield
    finally:
        window.append(time.time_ns())


def recorded_in(window: list[int], stacks: bool) -> tuple[list[dict[str, Any]], bool] | None:
    """The recorder's collectives enqueued inside the region's window, and whether its ring had dropped collectives
    that may have been the region's first."""
    entries = _recorded(stacks)
    if entries is None or len(window) < 2:
        return None
    start, end = window
    inside = [e for e in entries if start <= int(e.get("time_created_ns", 0)) <= end]
    lost = bool(entries) and int(entries[0].get("time_created_ns", 0)) > start and int(entries[0]["record_id"]) > 0
    return inside, lost


def _counted(region: Any, window: list[int]) -> None:
    """The region's collectives counted from the recorder, with their call sites, into its counts and calls (as the
    Python kernel would have); where the recorder cannot be read, the count is said not measured, never 0."""
    found = recorded_in(window, stacks=True)
    if found is None:
        region.counts.append(RegionCounts(unmeasured={"collectives": "torch's flight recorder could not be read"}))
        return
    calls = region.collective_calls
    for entry in found[0]:
        shown = str(entry.get("profiling_name", "")).removeprefix("nccl:")
        site = _site(entry.get("frames") or [])
        calls.append(f"{shown} at {site}" if site else shown)
    region.counts.append(RegionCounts({"collectives": len(calls)}, {"collectives": top_items(Counter(calls))}))


def _timed(region: Any, window: list[int]) -> dict[str, Any]:
    """Once the region's clock has stopped: its collectives counted from the recorder with their call sites (into its
    counts and calls, as the Python kernel would have), and its part, their device times, once torch's watchdog has
    timed them (up to :data:`WAIT_S`)."""
    if len(window) < 2:
        return {}
    _counted(region, window)
    deadline = time.monotonic() + WAIT_S
    while True:
        found = recorded_in(window, stacks=False)
        if found is None or not found[0]:
            return {}
        inside, lost = found
        if all(e.get("duration_ms") is not None for e in inside) or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    timed = tuple(
        TimedCollective(
            str(e["process_group"][0]), int(e["collective_seq_id"]), e["time_created_ns"] / 1e3, e["duration_ms"] * 1e3
        )
        for e in inside[:MAX_KERNELS]
        if e.get("duration_ms") is not None
    )
    untimed = sum(1 for e in inside if e.get("duration_ms") is None)
    tokens = region.tokens or region.forward_calls or None
    return {TIMED: {region.number: TimedRegion(tokens, timed, untimed, lost, socket.gethostname())}}


def _recording(region: Any, window: list[int]) -> Any:
    return _window(window)


#: The collectives' own region probe: the window of a region whose collectives the flight recorder gives (outermost,
#: so that it holds every collective of the region), which counts them and keeps their times once the clock stopped.
REGION_PROBES = (
    RegionProbe("collective times", "collectives", 5, records_collectives, _recording, _timed, state=list),
)
