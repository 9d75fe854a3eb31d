"""CUPTI, in one place: finding its library, what its results mean, and the process's one subscriber.

A process has one CUPTI subscriber (the callback API) at most. torch.profiler's kineto takes it when a capture
starts (it finds nothing to record on the device if it is taken: it warns "CUPTI initialization failed") and holds
it until it detaches CUPTI after a capture that asked it to. :data:`SUBSCRIBER` is who holds it here: the probe
that subscribes (:mod:`.cuda_calls`) registers as its :class:`Holder`, and a capture takes it over for its
duration (:meth:`Subscriber.yielding`), whoever asked for it.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Protocol

#: CUptiResult values of the plugin's own making: no library, a library without the PM sampler.
NO_LIBRARY, NO_SAMPLER = -1, -2
#: ``CUPTI_ERROR_NOT_INITIALIZED``: what profiler calls return after CUPTI was finalized (a capture detached it).
NOT_INITIALIZED = 15
#: ``CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED``: a second subscriber.
MULTIPLE_SUBSCRIBERS = 39
#: CUptiResult values named in errors (cupti_result.h).
_MEANINGS = {
    NO_LIBRARY: "no libcupti in this process or beside torch (CUPTI 12.6 or newer has the PM sampler)",
    NO_SAMPLER: "this libcupti has no PM sampler (CUPTI 12.6 or newer has one)",
    7: "invalid operation (PM sampling already enabled on the device?)",
    8: "out of memory",
    NOT_INITIALIZED: "not initialized (CUPTI could not load libnvperf_host.so/libnvperf_target.so)",
    17: "invalid metric name",
    27: "not supported on this device or configuration",
    33: "not supported on a virtualized device",
    35: "insufficient privileges to read GPU performance counters (ERR_NVGPUCTRPERM)",
    36: "the old profiler API is initialized in this process",
    MULTIPLE_SUBSCRIBERS: "CUPTI's one subscriber of the process is taken (a profiler capture running now, or another "
    "tool that subscribed to CUPTI)",
}


def meaning(status: int) -> str | None:
    """What a CUptiResult means, in words, where it is one the plugin names (None: see cupti_result.h)."""
    return _MEANINGS.get(status)


class CuptiError(RuntimeError):
    """A CUPTI call failed; ``status`` is its CUptiResult, ``message`` what it means in words."""

    def __init__(self, call: str, status: int) -> None:
        self.status = status
        said = meaning(status)
        self.message = said or f"{call} returned {status} (see cupti_result.h)"
        super().__init__(f"{call} returned {status}: {said or 'see cupti_result.h'}")


def process_library(fragment: str) -> ctypes.CDLL | None:
    """The first library of this process whose path contains ``fragment`` (``/libcupti``, ``/libcudart``), as
    ctypes sees it: the same library, so the same state; None where none is loaded or ``/proc/self/maps`` is
    missing."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if fragment in line})
    except OSError:
        return None
    for path in paths:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def library() -> ctypes.CDLL | None:
    """The CUPTI library the profiler loaded into this process; None where it cannot be found (not loaded, no
    ``/proc/self/maps``, or CUPTI linked into torch itself)."""
    return process_library("/libcupti")


def load() -> ctypes.CDLL:
    """The libcupti of this process (the one the profiler loaded), else the one beside torch's CUDA libraries;
    the nvperf libraries beside it are loaded first, where the dynamic linker would not find them. Raises
    :class:`CuptiError` where there is none."""
    loaded = library()
    if loaded is None:
        import torch

        site = os.path.dirname(os.path.dirname(torch.__file__))
        found = sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libcupti.so*")))  # cu13/, cuda_cupti/
        if not found:
            raise CuptiError("dlopen(libcupti)", NO_LIBRARY)
        loaded = ctypes.CDLL(found[-1])
    directory = os.path.dirname(getattr(loaded, "_name", "") or "")
    for name in ("libnvperf_host.so", "libnvperf_target.so"):
        with suppress(OSError):
            ctypes.CDLL(os.path.join(directory, name), mode=ctypes.RTLD_GLOBAL)
    return loaded


class Holder(Protocol):
    """What holds CUPTI's subscriber: it gives it up for a capture and takes it again after."""

    def give_up(self, why: str) -> None:
        """Unsubscribe now; what counts through it counts nothing meanwhile, and says ``why``."""

    def take_back(self) -> None:
        """Subscribe again, where something still counts through it."""


class Subscriber:
    """CUPTI's one subscriber of the process: its holder, and whether a capture has it now."""

    def __init__(self) -> None:
        self.holder: Holder | None = None
        self._taken: str | None = None
        self._lock = threading.RLock()

    @property
    def taken(self) -> str | None:
        """Why a capture holds the subscriber now (:meth:`yielding`), if one does."""
        return self._taken

    @contextmanager
    def yielding(self, why: str) -> Iterator[None]:
        """Give the subscriber up for the block (a profiler capture, which needs it); the holder says ``why`` it
        counted nothing meanwhile, and takes it again after the block. Nested captures give it up once."""
        with self._lock:
            outer, self._taken = self._taken, why
            if outer is None and self.holder is not None:
                self.holder.give_up(why)
        try:
            yield
        finally:
            with self._lock:
                self._taken = outer
                if outer is None and self.holder is not None:
                    self.holder.take_back()


SUBSCRIBER = Subscriber()
