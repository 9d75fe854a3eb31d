"""The CUDA-call probe: host-blocking CUDA runtime and driver calls that torch's own probe does not see (made by
a C++/CUDA extension, ctypes, cuda-python or the driver API), each counted as a sync named by the CUDA function,
with the Python call site that led into the library.

How: a CUPTI subscriber (the callback API) with callbacks enabled for the catalogued functions only
(:data:`BLOCKING`), so no other CUDA call (a kernel launch, an event query) reaches it. CUPTI calls the callback on
the calling thread on entry and on exit; a call reported while another catalogued call is open on the thread (a
runtime function's own driver call) is part of the outer one, and a call made while torch's probe is inside an
operator it judged (``.item()``'s stream synchronize) or while the plugin times a region is torch's or the
plugin's, counted there or not at all. So each blocking call counts once, whoever makes it.

A process has one CUPTI subscriber at most (:mod:`.cupti`), and a profiler capture needs it. So this probe
subscribes before each region it counts starts its clock and unsubscribes after the clock stops
(:meth:`CudaCallProbe.held`), and, as the subscriber's holder, gives it up while the plugin's captures run
(:meth:`.cupti.Subscriber.yielding`, a region around a captured one: a test's whole call around a ``measure()``'s
counting run); where the slot is taken, or there is no CUPTI or no CUDA, it counts nothing and says why
(:attr:`CudaCallWatch.not_counted`).

Each counted call goes to the sync probe's recorders (:meth:`.syncs.SyncProbe.record_cuda_call`) as a sync of kind
"CUDA call outside torch" named by its function, and is stamped on a sampled timeline's clock when it returns. Every
catalogued copy between host and device memory, torch's included, is also kept in the region's watch as a transfer
(its direction, size and call site: :func:`transfer`), which the transfers signal counts (:func:`transfer_counts`); a
copy function whose parameters it does not read (:data:`NOT_READ`: 3D, arrays, symbols, batches) is named where a
region calls it, and that region's transfers are not counted.

Where the native extension loads, its callback is the subscriber's (``native/launches.cpp``): it passes every
callback on to this probe's, except the launch calls (:data:`LAUNCHES`), which it stamps when they are entered and
when they return (a graph launch with the graph it launched) while a sampled run logs them
(:meth:`CudaCallProbe.logging_launches`), for the causes of the sampled timeline's gaps; the asynchronous copies
(:data:`COPY_LAUNCHES`) it stamps and passes on.

What CUPTI reports for each case was measured with ``devtools/cupti_callbacks.py``; the device tests are
tests/test_gpu_cuda_calls.py, the cost bench/bench_cuda_calls.py.
"""

from __future__ import annotations

import ctypes
import enum
import re
import sys
import threading
from array import array
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..analysis.counts import RegionCounts, top_items
from ..analysis.sampled import GraphNodes
from ..analysis.sites import Frame
from ..analysis.trace_file import GRAPH_LAUNCHES
from ..signals import transfers as signal
from . import cupti
from .call_sites import STDLIB, first_user_frame, user_stack
from .sync_ops import SyncKind
from .syncs import PROBE

#: CUpti_CallbackDomain.
DRIVER, RUNTIME = 1, 2
#: CUpti_ApiCallbackSite.
ENTER = 0
#: Callback ids are below this in every CUPTI of CUDA 12 and 13 (cupti_driver_cbid.h, cupti_runtime_cbid.h).
LARGEST_CBID = 2000


class When(enum.Enum):
    """When a catalogued call blocks the host (the CUDA runtime's "API synchronization behavior")."""

    ALWAYS = "always"
    HOST_INVOLVED = "unless both sides are device memory"
    """Synchronous copies: one between device memories does no host-side synchronization."""
    PAGEABLE_HOST = "when its host side is pageable memory"
    """Asynchronous copies: into or out of memory that is not page-locked they are synchronous."""
    NOT_NULL = "unless its pointer is null"
    """Frees: freeing a null pointer does nothing (``cudaFree(0)`` is the idiom that makes a context current:
    cuBLAS makes one when torch creates its handle, at a thread's first matrix product)."""


@dataclass(frozen=True)
class BlockingCall:
    """A CUDA function that can block the host, and where its copy's pointers, kind and size are among its
    parameters (indices of 8-byte slots of the function's parameter struct, as on 64-bit hosts; a free's pointer is
    its ``dst``; a 2D copy's size is ``size`` x ``rows``). A copy whose direction its name says has ``direction``."""

    when: When
    dst: int | None = None
    src: int | None = None
    kind: int | None = None
    size: int | None = None
    rows: int | None = None
    direction: str | None = None
    descriptor: bool = False
    """Its first parameter points at a ``CUDA_MEMCPY2D`` that says both sides' memory types, pointers and size (the
    driver's ``cuMemcpy2D``); the other indices are then unused."""


_SYNC = BlockingCall(When.ALWAYS)
_FREE = BlockingCall(When.NOT_NULL, dst=0)
#: Per domain, the catalogued functions by name, without the version and per-thread-stream suffixes that CUPTI
#: reports (``cuCtxSynchronize_v2``, ``cudaMemcpy_ptds``).
BLOCKING: Mapping[int, Mapping[str, BlockingCall]] = {
    RUNTIME: {
        "cudaDeviceSynchronize": _SYNC,
        "cudaThreadSynchronize": _SYNC,
        "cudaStreamSynchronize": _SYNC,
        "cudaEventSynchronize": _SYNC,
        "cudaFree": _FREE,
        "cudaFreeHost": _FREE,
        "cudaMemcpy": BlockingCall(When.HOST_INVOLVED, dst=0, src=1, kind=3, size=2),
        "cudaMemcpy2D": BlockingCall(When.HOST_INVOLVED, dst=0, src=2, kind=6, size=4, rows=5),
        "cudaMemcpyAsync": BlockingCall(When.PAGEABLE_HOST, dst=0, src=1, kind=3, size=2),
        "cudaMemcpy2DAsync": BlockingCall(When.PAGEABLE_HOST, dst=0, src=2, kind=6, size=4, rows=5),
    },
    DRIVER: {
        "cuCtxSynchronize": _SYNC,
        "cuStreamSynchronize": _SYNC,
        "cuEventSynchronize": _SYNC,
        "cuMemFree": _FREE,
        "cuMemFreeHost": _FREE,
        "cuMemcpyDtoH": BlockingCall(When.ALWAYS, size=2, direction="d2h"),
        "cuMemcpyHtoD": BlockingCall(When.ALWAYS, size=2, direction="h2d"),
        "cuMemcpy": BlockingCall(When.HOST_INVOLVED, dst=0, src=1, size=2),
        "cuMemcpyDtoHAsync": BlockingCall(When.PAGEABLE_HOST, dst=0, size=2, direction="d2h"),
        "cuMemcpyHtoDAsync": BlockingCall(When.PAGEABLE_HOST, src=1, size=2, direction="h2d"),
        "cuMemcpyAsync": BlockingCall(When.PAGEABLE_HOST, dst=0, src=1, size=2),
        "cuMemcpy2D": BlockingCall(When.HOST_INVOLVED, dst=0, src=0, descriptor=True),
        "cuMemcpy2DAsync": BlockingCall(When.PAGEABLE_HOST, dst=0, src=0, descriptor=True),
        "cuMemcpy2DUnaligned": BlockingCall(When.HOST_INVOLVED, dst=0, src=0, descriptor=True),
    },
}

#: The copy functions of the runtime and driver APIs that can move data between host and device memory and whose
#: parameters the probe does not read (3D descriptors, CUDA arrays, symbols, batches): a call of one in a region is
#: said, and that region's transfers are not counted (a budget on them is not measured, never passed). Copies that
#: stay on the devices (``cudaMemcpyPeer``, ``cuMemcpyDtoD``, ``cuMemcpyAtoA``) move nothing across the host's bus.
NOT_READ: Mapping[int, frozenset[str]] = {
    RUNTIME: frozenset(
        {
            "cudaMemcpy3D",
            "cudaMemcpy3DAsync",
            "cudaMemcpyToArray",
            "cudaMemcpyFromArray",
            "cudaMemcpyToArrayAsync",
            "cudaMemcpyFromArrayAsync",
            "cudaMemcpy2DToArray",
            "cudaMemcpy2DFromArray",
            "cudaMemcpy2DToArrayAsync",
            "cudaMemcpy2DFromArrayAsync",
            "cudaMemcpyToSymbol",
            "cudaMemcpyFromSymbol",
            "cudaMemcpyToSymbolAsync",
            "cudaMemcpyFromSymbolAsync",
            "cudaMemcpyBatchAsync",
            "cudaMemcpy3DBatchAsync",
        }
    ),
    DRIVER: frozenset(
        {
            "cuMemcpy3D",
            "cuMemcpy3DAsync",
            "cuMemcpyHtoA",
            "cuMemcpyAtoH",
            "cuMemcpyHtoAAsync",
            "cuMemcpyAtoHAsync",
            "cuMemcpyBatchAsync",
            "cuMemcpy3DBatchAsync",
        }
    ),
}

#: The calls that queue device work which can end an idle gap (a kernel, a CUDA graph, a device-to-device copy,
#: which runs on the SMs), stamped by the launch log (:meth:`CudaCallProbe.logging_launches`) when they are entered
#: and when they return; with them the copies of :data:`COPY_LAUNCHES`, whose direction the log does not read.
#: Memsets run on the copy engine, which the samples do not see end a gap.
LAUNCHES: Mapping[int, frozenset[str]] = {
    RUNTIME: frozenset(
        {"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cudaGraphLaunch", "cudaLaunch"}
    ),
    DRIVER: frozenset(
        {
            "cuLaunchKernel",
            "cuLaunchKernelEx",
            "cuLaunchCooperativeKernel",
            "cuLaunch",
            "cuGraphLaunch",
            "cuMemcpyDtoDAsync",
        }
    ),
}
#: The asynchronous copies of any direction that :data:`BLOCKING` catalogues, stamped as launches too (a
#: device-to-device one is how torch copies between device tensors, graph trees their inputs) and passed on.
COPY_LAUNCHES = frozenset({"cudaMemcpyAsync", "cuMemcpyAsync"})
#: The launch log's kind of a callback (probes/native/launches.cpp).
_LAUNCH, _GRAPH_LAUNCH, _COPY = 1, 2, 3

_SUFFIX = re.compile(r"(_v\d+)*(_ptsz|_ptds)?(_v\d+)*$")


def base_name(function: str) -> str:
    """A CUDA function's name without CUPTI's version and per-thread-stream suffixes."""
    return _SUFFIX.sub("", function)


#: cudaMemcpyKind.
HOST_TO_HOST, HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE, DEFAULT = range(5)
#: CUpointer_attribute CU_POINTER_ATTRIBUTE_MEMORY_TYPE and CUmemorytype CU_MEMORYTYPE_DEVICE.
_MEMORY_TYPE, _DEVICE = 2, 2


class Memory(enum.Enum):
    """What a pointer of a copy points at, as the driver knows it."""

    DEVICE = "device"
    PINNED = "page-locked host"
    PAGEABLE = "pageable host"


#: CUmemorytype.
_HOST_TYPE, _DEVICE_TYPE, _ARRAY_TYPE, _UNIFIED_TYPE = 1, 2, 3, 4


class Memcpy2D(ctypes.Structure):
    """The driver's ``CUDA_MEMCPY2D``, as cuda.h lays it out."""

    _fields_ = (
        ("srcXInBytes", ctypes.c_size_t),
        ("srcY", ctypes.c_size_t),
        ("srcMemoryType", ctypes.c_int),
        ("srcHost", ctypes.c_void_p),
        ("srcDevice", ctypes.c_uint64),
        ("srcArray", ctypes.c_void_p),
        ("srcPitch", ctypes.c_size_t),
        ("dstXInBytes", ctypes.c_size_t),
        ("dstY", ctypes.c_size_t),
        ("dstMemoryType", ctypes.c_int),
        ("dstHost", ctypes.c_void_p),
        ("dstDevice", ctypes.c_uint64),
        ("dstArray", ctypes.c_void_p),
        ("dstPitch", ctypes.c_size_t),
        ("WidthInBytes", ctypes.c_size_t),
        ("Height", ctypes.c_size_t),
    )

    @classmethod
    def of(cls, src: tuple[int, int], dst: tuple[int, int], width: int, height: int, pitch: int) -> Memcpy2D:
        """A copy of ``height`` rows of ``width`` bytes, rows ``pitch`` bytes apart, from ``src`` to ``dst``, each a
        (CUmemorytype, pointer): a host pointer for host memory, a device pointer for the others."""
        copy = cls(
            srcMemoryType=src[0],
            dstMemoryType=dst[0],
            srcPitch=pitch,
            dstPitch=pitch,
            WidthInBytes=width,
            Height=height,
        )
        if src[0] == _HOST_TYPE:
            copy.srcHost = src[1]
        else:
            copy.srcDevice = src[1]
        if dst[0] == _HOST_TYPE:
            copy.dstHost = dst[1]
        else:
            copy.dstDevice = dst[1]
        return copy


def _sides(params: int, memory: Callable[[int], Memory]) -> tuple[Memory, Memory, int]:
    """A ``CUDA_MEMCPY2D`` copy's destination and source memory and its size in bytes: a side of memory type host is
    page-locked or pageable as the driver knows its pointer, device and array memory are the device's, a unified
    pointer is what the driver says it is."""
    copy = Memcpy2D.from_address(ctypes.cast(params, ctypes.POINTER(ctypes.c_size_t))[0])

    def side(kind: int, host: int | None, device: int) -> Memory:
        if kind in (_DEVICE_TYPE, _ARRAY_TYPE):
            return Memory.DEVICE
        found = memory(host or 0) if kind == _HOST_TYPE else memory(device)
        return Memory.PAGEABLE if kind == _HOST_TYPE and found is Memory.DEVICE else found

    dst = side(copy.dstMemoryType, copy.dstHost, copy.dstDevice)
    src = side(copy.srcMemoryType, copy.srcHost, copy.srcDevice)
    return dst, src, copy.WidthInBytes * copy.Height


def blocks(call: BlockingCall, params: int, memory: Callable[[int], Memory]) -> bool:
    """Whether one call of ``call``, whose parameter struct is at address ``params``, blocks the host;
    ``memory(pointer)`` says what a copy's pointer points at."""
    if call.when is When.ALWAYS:
        return True
    fields = ctypes.cast(params, ctypes.POINTER(ctypes.c_size_t))
    if call.when is When.NOT_NULL:
        return call.dst is not None and fields[call.dst] != 0
    if call.descriptor:
        sides = _sides(params, memory)[:2]
        if call.when is When.HOST_INVOLVED:
            return any(side is not Memory.DEVICE for side in sides)
        return Memory.PAGEABLE in sides
    # An enum parameter is an int in its 8-byte slot: the slot's other half is padding.
    kind = ctypes.c_int.from_address(params + 8 * call.kind).value if call.kind is not None else DEFAULT
    if kind == DEFAULT:  # the pointers say where each side is
        found = [memory(fields[index]) for index in (call.dst, call.src) if index is not None]
        if call.when is When.HOST_INVOLVED:
            return any(side is not Memory.DEVICE for side in found)
        return Memory.PAGEABLE in found
    host_sides = {HOST_TO_DEVICE: (call.src,), DEVICE_TO_HOST: (call.dst,), HOST_TO_HOST: (call.dst, call.src)}
    host = host_sides.get(kind, ())  # device to device: none
    if call.when is When.HOST_INVOLVED:
        return bool(host)
    return any(memory(fields[index]) is Memory.PAGEABLE for index in host if index is not None)


def transfer(call: BlockingCall, params: int, memory: Callable[[int], Memory]) -> tuple[str, int] | None:
    """The direction ("h2d" or "d2h") and size in bytes of one call of ``call`` that moves data between host and
    device memory, whose parameter struct is at address ``params``; None for any other call (a copy within the
    device or within the host, a synchronize, a free)."""
    if call.descriptor:
        dst, src, size = _sides(params, memory)
        way = {(True, False): "h2d", (False, True): "d2h"}.get((dst is Memory.DEVICE, src is Memory.DEVICE))
        return None if way is None else (way, size)
    if call.size is None:
        return None
    fields = ctypes.cast(params, ctypes.POINTER(ctypes.c_size_t))
    size = fields[call.size] * (fields[call.rows] if call.rows is not None else 1)
    if call.direction is not None:
        return call.direction, size
    kind = ctypes.c_int.from_address(params + 8 * call.kind).value if call.kind is not None else DEFAULT
    if kind == DEFAULT:  # the pointers say where each side is
        assert call.dst is not None and call.src is not None, call
        sides = (memory(fields[call.dst]) is Memory.DEVICE, memory(fields[call.src]) is Memory.DEVICE)
        direction = {(True, False): "h2d", (False, True): "d2h"}.get(sides)
    else:
        direction = {HOST_TO_DEVICE: "h2d", DEVICE_TO_HOST: "d2h"}.get(kind)
    return None if direction is None else (direction, size)


@dataclass(frozen=True)
class Transfer:
    """One memcpy call between host and device memory in a watched region: its direction, size, CUDA function and
    the Python call site that led to it (None where no frame of the user's code was on the stack)."""

    direction: str
    size: int
    function: str
    site: Frame | None
    caller: Frame | None = None
    """The user frame that called the site's function, where it lies in another file (the line of a loop that called
    a library's ``asnumpy``)."""

    def label(self) -> str:
        """``loop.py:12 in decode: cudaMemcpyAsync, device-to-host, 4096 B`` (with ``called from`` a caller)."""
        where = self.site.shown() if self.site is not None else "?"
        if self.caller is not None:
            where += f" (called from {self.caller.shown()})"
        return f"{where}: {self.function}, {signal.DIRECTIONS[self.direction]}, {self.size} B"


class CallbackData(ctypes.Structure):
    """CUpti_CallbackData (cupti_callbacks.h): what an API callback is given."""

    _fields_ = (
        ("callbackSite", ctypes.c_int),
        ("functionName", ctypes.c_char_p),
        ("functionParams", ctypes.c_void_p),
        ("functionReturnValue", ctypes.c_void_p),
        ("symbolName", ctypes.c_char_p),
        ("context", ctypes.c_void_p),
        ("contextUid", ctypes.c_uint32),
        ("correlationData", ctypes.POINTER(ctypes.c_uint64)),
        ("correlationId", ctypes.c_uint32),
    )


#: A CUPTI callback (CUpti_CallbackFunc).
CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)


class _Thread(threading.local):
    depth = 0
    """Catalogued calls open on this thread (a runtime function's own driver call is the second)."""
    stamp: AbstractContextManager[Any] | None = None
    """The open counted call's stamp, left when it returns."""


@dataclass
class CudaCallWatch:
    """One region's watch: why the blocking CUDA calls made outside torch could not be counted (None: they are
    counted, into the sync probe's recorders)."""

    not_counted: str | None = None
    transfers: list[Transfer] = field(default_factory=list)
    """Every memcpy call between host and device memory made in the region, torch's and any other library's."""
    not_read: Counter[str] = field(default_factory=Counter)
    """The calls of copy functions whose parameters the probe does not read (:data:`NOT_READ`), by name."""


@dataclass
class LaunchLog:
    """When each launch call of a region returned (:data:`LAUNCHES`, whoever made it; ns on the host's wall clock,
    the samples' clock, in order) and when it was entered, or why they were not logged."""

    returned_ns: tuple[int, ...] = ()
    entered_ns: tuple[int, ...] = ()
    """When each of those calls was entered, in the same order."""
    lost: int = 0
    """Launches made beyond what the log keeps (its earliest are kept)."""
    not_logged: str | None = None
    graph_launches: tuple[tuple[int, int], ...] = ()
    """The CUDA graph launches among them: (ns, the executable graph launched), in order."""
    graph_nodes: dict[int, GraphNodes] = field(default_factory=dict)
    """What each graph launched holds, where its capture was read (:mod:`.graph_nodes`), by executable graph."""

    def graphs(self) -> tuple[tuple[int, GraphNodes | None], ...]:
        """Each graph launch: (ns, what the graph holds, None where its capture was not read)."""
        return tuple((ns, self.graph_nodes.get(graph)) for ns, graph in self.graph_launches)


class CudaCallProbe:
    """The holder of a CUPTI subscriber (the process's: :data:`CUDA_CALLS`); regions count through
    :meth:`counting`."""

    def __init__(self, subscriber: cupti.Subscriber | None = None) -> None:
        subscriber = subscriber if subscriber is not None else cupti.Subscriber()
        self._subscriber = subscriber
        subscriber.holder = self
        self._cupti: Any = None
        self._driver: Any = None
        self._handle = ctypes.c_void_p()
        self._callback = CALLBACK(self._on_call)  # kept alive: CUPTI calls it while subscribed
        self._wanted: dict[tuple[int, int], tuple[str, BlockingCall]] = {}
        self._not_read: dict[tuple[int, int], str] = {}
        self._thread = _Thread()
        self._watches: list[CudaCallWatch] = []
        self._holders = 0
        """Open :meth:`held` blocks: the subscriber stays while any is open."""
        self._subscribed = False
        self._problem: str | None = None
        """Why the last subscription failed, if it did."""
        self._launch_ids: list[tuple[int, int]] = []
        self._native: Any = None
        """The native extension's launch log, where it loaded: its callback is the subscriber's, passing the rest on."""
        self._logging = False
        self._lock = threading.Lock()

    @contextmanager
    def counting(self) -> Iterator[CudaCallWatch]:
        """Count the catalogued calls made during the block (see :class:`CudaCallWatch`)."""
        watch = CudaCallWatch()
        with self._lock:
            if (taken := self._subscriber.taken) is not None:
                watch.not_counted = taken
            elif not self._subscribed:
                watch.not_counted = self._subscribe()
            if watch.not_counted is None:
                self._watches.append(watch)
        try:
            yield watch
        finally:
            with self._lock:
                if watch in self._watches:
                    self._watches.remove(watch)
                    if not self._watches and not self._holders and self._subscribed:
                        self._unsubscribe()

    def reset(self) -> None:
        """Forget every watch (a forked child's copies of its parent's: their lists are the parent's)."""
        with self._lock:
            self._watches.clear()
            self._holders = 0
            self._subscribed = self._logging = False

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the subscriber over the block: a measured region's whole span, entered before its clock starts and
        left after it stops, so that a timed run pays neither for subscribing (loading CUPTI, enabling each
        catalogued callback) nor for giving it up; the region's :meth:`counting` inside then only registers its
        watch. Where it cannot subscribe, that counting says why."""
        with self._lock:
            self._holders += 1
            if self._subscriber.taken is None and not self._subscribed:
                self._subscribe()
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if not self._holders and not self._watches and self._subscribed:
                    self._unsubscribe()

    @contextmanager
    def logging_launches(self) -> Iterator[LaunchLog]:
        """Stamp every launch call (:data:`LAUNCHES`) made during the block, on any thread, when it returns (the
        native extension's callback: a clock read per launch); the log is filled on exit. One log at a time; where
        it cannot run (no subscriber, no native extension), it says why."""
        log = LaunchLog()
        with self.held():
            with self._lock:
                why = None if self._subscribed else self._subscriber.taken or self._problem or "CUPTI is not subscribed"
                if why is None and self._native is None:
                    why = "the native extension is not loaded (SYNCGUARD_NATIVE=0, or it could not be built)"
                if why is None and self._logging:
                    why = "another region's launch log is running"
                if why is None:
                    self._logging = True
                    self._native.launch_start()
                    self._enable(self._launch_ids, 1)
            log.not_logged = why
            try:
                yield log
            finally:
                if why is None:
                    with self._lock:
                        if self._subscribed:
                            self._enable(self._launch_ids, 0)
                        data, made, launched, began = self._native.launch_stop()
                        self._logging = False
                    calls = sorted(zip(array("q", data), array("q", began), array("Q", launched), strict=True))
                    log.returned_ns = tuple(returned for returned, _, _ in calls)
                    log.entered_ns = tuple(entered for _, entered, _ in calls)
                    log.graph_launches = tuple((returned, graph) for returned, _, graph in calls if graph)
                    log.lost = made - len(calls)
                    if not self._subscribed:
                        log.not_logged = self._subscriber.taken or "CUPTI's subscriber was given up during the region"
                    elif log.lost:
                        log.not_logged = f"the log kept {len(calls)} of the region's {made} launches"

    def _enable(self, callbacks: list[tuple[int, int]], on: int) -> None:
        for domain, cbid in callbacks:
            self._cupti.cuptiEnableCallback(on, self._handle, domain, cbid)

    def give_up(self, why: str) -> None:
        """A capture takes CUPTI's subscriber (:meth:`.cupti.Subscriber.yielding`): the regions counting now count
        nothing meanwhile and say ``why``; those that start before it ends count nothing."""
        with self._lock:
            if self._subscribed:
                self._unsubscribe()
                for watch in self._watches:
                    watch.not_counted = watch.not_counted or why

    def take_back(self) -> None:
        """The capture has ended: subscribe again for the regions still open."""
        with self._lock:
            if (self._watches or self._holders) and not self._subscribed:
                again = self._subscribe()
                for watch in self._watches:
                    watch.not_counted = watch.not_counted or again

    def _unsubscribe(self) -> None:
        self._cupti.cuptiUnsubscribe(self._handle)
        self._subscribed = False

    def _subscribe(self) -> str | None:
        """Subscribe and enable the catalogued callbacks; why not, where it cannot."""
        import torch

        if not torch.cuda.is_available():
            return "CUDA is not available"
        try:
            self._load()
        except OSError as exc:
            return f"no CUPTI library could be loaded ({exc})"
        callback: Any = self._callback
        if self._native is not None:  # the launch log's callback, which passes every other call on to this probe's
            self._native.launch_pass_to(ctypes.cast(self._callback, ctypes.c_void_p).value)
            callback = ctypes.c_void_p(self._native.launch_callback())
        status = self._cupti.cuptiSubscribe(ctypes.byref(self._handle), callback, None)
        if status != 0:
            self._problem = cupti.meaning(status) or f"cuptiSubscribe failed with CUptiResult {status}"
            return self._problem
        self._enable([*self._wanted, *self._not_read, *(self._launch_ids if self._logging else ())], 1)
        self._subscribed, self._problem = True, None
        return None

    def _load(self) -> None:
        if self._cupti is not None:
            return
        try:
            self._cupti = cupti.load()
        except cupti.CuptiError as exc:
            raise OSError(str(exc)) from exc
        self._driver = ctypes.CDLL("libcuda.so.1")
        self._driver.cuPointerGetAttribute.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64)
        name = ctypes.c_char_p()
        kinds: dict[tuple[int, int], int] = {}
        for domain, catalogue in BLOCKING.items():
            for cbid in range(1, LARGEST_CBID):
                if self._cupti.cuptiGetCallbackName(domain, cbid, ctypes.byref(name)) != 0 or not name.value:
                    continue
                function = base_name(name.value.decode())
                if function in catalogue:
                    self._wanted[(domain, cbid)] = (function, catalogue[function])
                    if function in COPY_LAUNCHES:
                        kinds[(domain, cbid)] = _COPY
                elif function in NOT_READ[domain]:
                    self._not_read[(domain, cbid)] = function
                elif function in LAUNCHES[domain]:
                    self._launch_ids.append((domain, cbid))
                    # A graph launch's stamp keeps the graph launched (the executable graph's handle).
                    kinds[(domain, cbid)] = _GRAPH_LAUNCH if function in GRAPH_LAUNCHES else _LAUNCH
        self._native = _launch_log()
        for (domain, cbid), kind in kinds.items() if self._native is not None else ():
            self._native.launch_mark(domain, cbid, kind)

    def _memory(self, pointer: int) -> Memory:
        kind = ctypes.c_uint()
        if self._driver.cuPointerGetAttribute(ctypes.byref(kind), _MEMORY_TYPE, pointer) != 0:
            return Memory.PAGEABLE  # the driver does not know it: neither device nor page-locked
        return Memory.DEVICE if kind.value == _DEVICE else Memory.PINNED

    def _on_call(self, userdata: object, domain: int, cbid: int, data: int) -> None:
        thread = self._thread
        info = CallbackData.from_address(data)
        if info.callbackSite != ENTER:
            thread.depth = max(thread.depth - 1, 0)
            if thread.depth == 0 and thread.stamp is not None:
                stamp, thread.stamp = thread.stamp, None
                stamp.__exit__(None, None, None)
            return
        thread.depth += 1
        if thread.depth > 1:
            return  # a catalogued call's own inner call
        if not self._watches:
            return
        found = self._wanted.get((domain, cbid))
        if found is None:
            if (function := self._not_read.get((domain, cbid))) is not None:
                for watch in self._watches:
                    watch.not_read[function] += 1
            return
        moved = transfer(found[1], info.functionParams, self._memory)
        if moved is not None:  # torch's copies too: a transfer is one whoever makes it
            caller, site, _ = first_user_frame(sys._getframe(1))
            above = user_stack(caller.f_back, 1) if caller is not None else ()
            called_from = (
                above[0]
                if above
                and site is not None
                and above[0].filename != site.filename
                and not above[0].filename.startswith(STDLIB)
                else None
            )
            made = Transfer(*moved, found[0], site, called_from)
            for watch in self._watches:
                watch.transfers.append(made)
        if PROBE.inside or not blocks(found[1], info.functionParams, self._memory):
            return
        frame = sys._getframe(1)
        PROBE.record_cuda_call(found[0], frame)
        stamp = PROBE.stamp(SyncKind.CUDA_CALL, frame)
        stamp.__enter__()
        thread.stamp = stamp


def _launch_log() -> Any:
    """The native extension, where it loads and has the launch log (None: the probe's own callback subscribes)."""
    from .native import NATIVE

    try:
        module = NATIVE.load()
    except Exception:  # SYNCGUARD_NATIVE=1 and no build: the sync probe raises it where it loads the kernels
        return None
    return module if module is not None and hasattr(module, "launch_callback") else None


def transfer_counts(watch: CudaCallWatch) -> RegionCounts:
    """A region's transfers as the transfers signal counts them (:mod:`..signals.transfers`): per direction and in
    all, the calls and their bytes, and the largest contributors (call site, function, direction and size); where
    the region's calls were not watched, why each is not counted."""
    names = [spec.name for spec in signal.SIGNAL.counters]
    if watch.not_counted is not None:
        return RegionCounts(unmeasured=dict.fromkeys(names, f"{signal.UNCOUNTED} ({watch.not_counted})"))
    if watch.not_read:
        called = ", ".join(f"{name} x{n}" for name, n in sorted(watch.not_read.items()))
        why = f"transfers not counted: the region called copy functions whose parameters are not read ({called})"
        return RegionCounts(unmeasured=dict.fromkeys(names, why))
    values = dict.fromkeys(names, 0)
    items: dict[str, Counter[str]] = {name: Counter() for name in names if name.startswith("transfers")}
    for moved in watch.transfers:
        label = moved.label()
        for suffix in ("", f"_{moved.direction}"):
            values[f"transfers{suffix}"] += 1
            values[f"transfer_bytes{suffix}"] += moved.size
            items[f"transfers{suffix}"][label] += 1
    return RegionCounts(values, {name: top_items(found) for name, found in items.items()})


CUDA_CALLS = CudaCallProbe(cupti.SUBSCRIBER)
