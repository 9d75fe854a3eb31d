"""The race probe: host accesses of memory whose non_blocking copy the host has not waited for.

How: the sync probe's native ``copy_`` kernel announces each non_blocking copy between pinned host memory and the
device (:meth:`RaceProbe.copied`); the probe numbers it on its stream (:class:`..analysis.races.StreamClocks`) and
has the native access check (``native/races.cpp``) watch its host bytes. The host's waits complete it: the explicit
synchronizations the sync probe wraps, ``Event.query``/``Stream.query`` that return True, and the blocking reads
and copies the native kernels make (:meth:`RaceProbe.waited`). ``Event.record``, ``Event.wait`` and
``Stream.wait_event`` (``wait_stream`` calls them) move the stream clocks. An operator that reads a watched
destination or writes a watched source before that is a race, and so is ``Tensor.tolist()``/``.numpy()`` of a
watched destination (they read the memory without an operator).

Copies queued while a CUDA graph is captured run only when it is replayed, where no kernel sees them: not checked.
It needs the native extension; while no copy is watched it adds no per-operator work.
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from types import FrameType
from typing import Any, NamedTuple

import torch

from ..analysis.counts import RegionCounts
from ..analysis.races import RaceEvent, StreamClocks, StreamKey
from ..analysis.sites import Frame
from .call_sites import user_stack
from .native import NATIVE
from .patches import Patches
from .region import Region, RegionProbe

COUNTER = "async_races"


class _Copy(NamedTuple):
    stream: StreamKey
    number: int
    to_host: bool
    start: int
    end: int
    storage: int
    """The address of the host tensor's storage: an access of another storage at the same bytes (pinned memory
    freed and allocated again, which the host allocator does only once the copy has completed) is none."""
    site: Frame | None


def _key(stream: Any) -> StreamKey:
    return (int(stream.device_index), int(stream.stream_id))


def _device_index(device: Any) -> int:
    """The index of a device given as torch.cuda.synchronize takes it (an int, a string, a torch.device)."""
    if isinstance(device, int):
        return device
    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index


def _current() -> StreamKey:
    return _key(torch.cuda.current_stream())


def _user_site(frame: FrameType | None) -> Frame | None:
    stack = user_stack(frame, 1)
    return stack[0] if stack else None


def _extent(tensor: torch.Tensor) -> tuple[int, int] | None:
    """The host bytes a CPU tensor may touch, from its first element to its last (None: none)."""
    if tensor.device.type != "cpu" or tensor.numel() == 0:
        return None
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True))
    start = tensor.data_ptr()
    return start, start + (last + 1) * tensor.element_size()


class RaceProbe:
    """Process-wide: the copies being watched, the stream clocks, and the regions that collect the races."""

    def __init__(self) -> None:
        self.active = False
        """A region checks races now (read by the native copy kernel)."""
        self.seen = 0
        """Copies watched since the process started (so that a test can tell "no race" from "no copy seen")."""
        self._clocks = StreamClocks()
        self._copies: dict[int, _Copy] = {}
        self._found: list[list[RaceEvent]] = []
        self._ids = itertools.count()
        self._patches = Patches()
        self._native: Any = None
        self._lock = threading.RLock()

    @staticmethod
    def unavailable() -> str | None:
        """Why races cannot be checked in this process (None: they can)."""
        if not torch.cuda.is_available():
            return "needs CUDA"
        NATIVE.load()
        why = NATIVE.unavailable
        return None if why is None else f"the race check needs the native kernels, which {why}"

    @property
    def watched(self) -> int:
        """How many copies are being watched (not yet waited for by the host)."""
        return len(self._copies)

    @contextmanager
    def watching(self, found: list[RaceEvent], counts: list[RegionCounts]) -> Iterator[None]:
        """Check the block for races: append each to ``found``, and their number (or why there is none) to
        ``counts``. Opened inside the sync probe's recording, whose native kernels announce the copies."""
        why = self.unavailable()
        if why is not None:
            counts.append(RegionCounts(unmeasured={COUNTER: why}))
            yield
            return
        with self._lock:
            if not self._found:
                self._install()
            self._found.append(found)
        try:
            yield
        finally:
            with self._lock:
                if any(f is found for f in self._found):
                    self._found[:] = [f for f in self._found if f is not found]
                    if not self._found:
                        self._uninstall()
            counts.append(RegionCounts({COUNTER: len(found)}))

    def reset(self) -> None:
        """Stop checking: what a test left open must not check the next test."""
        with self._lock:
            if self._found:
                self._found.clear()
                self._uninstall()

    # -- events from the native kernels ------------------------------------------------------------
    def copied(self, to_host: bool, start: int, end: int, storage: int) -> int | None:
        """A non_blocking copy between the host bytes [start, end) of a pinned storage (its address) and the device
        was queued on the current stream: the id under which the native check is to watch them (None: not
        checked)."""
        if not self.active or torch.cuda.is_current_stream_capturing():
            return None
        with self._lock:
            stream = _current()
            ident = next(self._ids)
            self.seen += 1
            number = self._clocks.copy(stream)
            self._copies[ident] = _Copy(stream, number, to_host, start, end, storage, _user_site(sys._getframe(1)))
            return ident

    def waited(self) -> None:
        """The host waited for the work queued on the current stream so far."""
        if self._copies:
            self._clocks.host_waits_stream(_current())
            self._settle()

    def _accessed(self, ident: int, op: str, wrote: bool) -> None:
        """The native check: operator ``op`` read (or wrote) the host bytes of copy ``ident``."""
        self._race(ident, op, wrote, sys._getframe(1))

    def _race(self, ident: int, op: str, wrote: bool, frame: FrameType | None) -> None:
        with self._lock:
            copy = self._copies.pop(ident, None)
            if copy is None:
                return
            self._native.race_unwatch(ident)
            event = RaceEvent(
                "device->host" if copy.to_host else "host->device",
                "write" if wrote else "read",
                op,
                copy.site,
                _user_site(frame),
                copy.stream,
                _current(),
            )
            for found in self._found:
                found.append(event)

    def _settle(self) -> None:
        """Stop watching the copies the host has now waited for."""
        with self._lock:
            for ident, copy in list(self._copies.items()):
                if self._clocks.complete(copy.stream, copy.number):
                    del self._copies[ident]
                    self._native.race_unwatch(ident)

    # -- the host's waits ------------------------------------------------------------------------------
    def synchronized(self, what: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """An explicit synchronize returned (the sync probe's wrappers): ``what`` names it as they do."""
        if not self._copies:
            return
        if what.endswith("Event.synchronize"):
            self._clocks.host_waits_event(args[0])
        elif what.endswith("Stream.synchronize"):
            self._clocks.host_waits_stream(_key(args[0]))
        else:  # torch.cuda.synchronize(device=None), torch.accelerator.synchronize(device=None)
            device = args[0] if args else kwargs.get("device")
            self._clocks.host_waits_device(None if device is None else _device_index(device))
        self._settle()

    def _record(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def record(event: torch.cuda.Event, stream: Any = None) -> Any:
            result = original(event, stream)
            if not torch.cuda.is_current_stream_capturing():
                self._clocks.record(event, _current() if stream is None else _key(stream))
            return result

        return record

    def _event_wait(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wait(event: torch.cuda.Event, stream: Any = None) -> Any:
            result = original(event, stream)
            self._clocks.stream_waits(_current() if stream is None else _key(stream), event)
            return result

        return wait

    def _wait_event(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wait_event(stream: Any, event: torch.cuda.Event) -> Any:
            result = original(stream, event)
            self._clocks.stream_waits(_key(stream), event)
            return result

        return wait_event

    def _query(self, waits: Callable[[Any], None]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def query(owner: Any) -> bool:
                done = original(owner)
                if done and self._copies:
                    waits(owner)
                    self._settle()
                return bool(done)

            return query

        return wrap

    def _reads(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """``Tensor.tolist``/``Tensor.numpy``: they read host memory without an operator the check sees."""

        def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                if self._copies and (extent := _extent(tensor)) is not None:
                    start, end = extent
                    storage = tensor.untyped_storage()._cdata
                    for ident, copy in list(self._copies.items()):
                        if copy.to_host and copy.storage == storage and start < copy.end and copy.start < end:
                            self._race(ident, name, False, sys._getframe(1))
                return original(tensor, *args, **kwargs)

            return read

        return wrap

    # -- installation ------------------------------------------------------------------------------------
    def _install(self) -> None:
        native: Any = NATIVE.load()
        patch = self._patches.patch
        try:
            patch(torch.cuda.Event, "record", self._record)
            patch(torch.cuda.Event, "wait", self._event_wait)
            patch(torch.cuda.Stream, "wait_event", self._wait_event)
            patch(torch.cuda.Event, "query", self._query(lambda e: self._clocks.host_waits_event(e)))
            patch(torch.cuda.Stream, "query", self._query(lambda s: self._clocks.host_waits_stream(_key(s))))
            patch(torch.Tensor, "tolist", self._reads("Tensor.tolist"))
            patch(torch.Tensor, "numpy", self._reads("Tensor.numpy"))
            native.race_callback(self._accessed)
        except BaseException:
            self._patches.undo()
            raise
        self._native = native
        self.active = True

    def _uninstall(self) -> None:
        self.active = False
        try:
            if self._native is not None:
                self._native.race_unwatch(-1)
                self._native.race_callback(None)
        finally:
            self._native = None
            self._copies.clear()
            self._clocks = StreamClocks()
            self._patches.undo()

    @property
    def installed(self) -> bool:
        """Whether its patches are in place (for tests of the restore paths)."""
        return bool(self._patches)


RACES = RaceProbe()


def _on_cuda(region: Region) -> bool:
    return region.on_cuda


def _watching(region: Region, found: list[RaceEvent]) -> AbstractContextManager[None]:
    return RACES.watching(found, region.counts)


def _found(region: Region, found: list[RaceEvent]) -> dict[str, Any]:
    return {"races": tuple(found)}


#: The race watch of a region, for a test with a budget on races: inside the sync probe (its copy kernel announces
#: the copies) and the transfers, outside the counters.
REGION_PROBES = (RegionProbe("races", "races", 75, _on_cuda, _watching, _found, state=list, on_demand=True),)
