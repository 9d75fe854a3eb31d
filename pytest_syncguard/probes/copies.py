"""Host<->device copies on CUDA: the blocking ones, flagged by the runtime, and non_blocking ones that stall.

Copies are the most frequent operator of a decoding loop (HF ``generate`` makes about eight ``copy_`` calls per
token, nearly all device to device), so they get no dispatcher kernel: a Python kernel on every ``copy_`` made
the probe cost 13% on the H100 instead of 5%. Instead:

- Blocking copies: the CUDA runtime's own sync check. In ``set_sync_debug_mode("warn")`` every
  ``memcpy_and_sync`` (blocking copies both ways, ``.cpu()``, ``.tolist()``, pageable ``torch.tensor(...,
  device="cuda")``) raises a ``UserWarning`` at the Python caller, at no cost per op. The probe catches those
  warnings; its own kernels mute the mode while they run, so a sync is never counted twice.
- ``non_blocking=True`` copies through pageable memory stall the host in the driver and no sync check sees
  them. They can only be asked for from Python (``Tensor.to``, ``Tensor.copy_``, ``Tensor.cuda``), whose
  wrappers look at the memory only when ``non_blocking`` is set.
"""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

import torch

SYNC_WARNING = "called a synchronizing CUDA operation"
_WARN = 1
_OFF = 0

#: Called with (operator name, frame of the caller) for each sync seen.
Emit = Callable[[str, "FrameType | None"], None]


def _nothing() -> None:
    pass


class ProbeThreadState(Protocol):
    """The sync probe's per-thread state: whether its own code is running on this thread."""

    inside: bool


def _caller(frame: FrameType | None) -> FrameType | None:
    """The first frame outside the ``warnings`` module (whose Python half calls ``showwarning``)."""
    while frame is not None and frame.f_globals.get("__name__") == "warnings":
        frame = frame.f_back
    return frame


class BlockingCopySignal:
    """Turns the runtime's sync-debug warnings into sync events while installed.

    The sync-debug mode is process-wide; ``install`` saves it and ``uninstall`` restores it. When the user had
    already switched it on, their warnings still reach them.
    """

    def __init__(self, local: ProbeThreadState) -> None:
        self._local = local
        self._saved_mode: int | None = None
        self._catcher: warnings.catch_warnings[Any] | None = None
        self.muting = False
        #: Called on entry to and exit from the probe's own kernels, which count their syncs themselves.
        self.mute: Callable[[], None] = _nothing
        self.unmute: Callable[[], None] = _nothing

    def install(self, emit: Emit) -> None:
        saved = torch.cuda.get_sync_debug_mode()
        if saved == 2:  # "error": every sync raises already; leave the user's mode alone
            return
        catcher = warnings.catch_warnings()
        catcher.__enter__()
        try:
            # pytest de-duplicates warnings by location (and -W error would raise): this one is always ours.
            warnings.filterwarnings("always", message=SYNC_WARNING, category=UserWarning)
            # torch's note that the mode is a prototype is about the probe, not the user's code.
            warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype", category=UserWarning)
            forward = warnings.showwarning
            local, passthrough = self._local, saved != _OFF

            def showwarning(message: Any, category: type[Warning], *rest: Any, **kwargs: Any) -> None:
                if issubclass(category, UserWarning) and str(message).startswith(SYNC_WARNING):
                    if not local.inside:
                        emit("cudaMemcpy+sync", _caller(sys._getframe(1)))
                    if not passthrough:
                        return
                forward(message, category, *rest, **kwargs)

            warnings.showwarning = showwarning
            torch.cuda.set_sync_debug_mode(_WARN)
        except BaseException:
            catcher.__exit__(None, None, None)
            raise
        self._catcher, self._saved_mode, self.muting = catcher, saved, True
        self.mute, self.unmute = self._switch(_OFF), self._switch(_WARN)

    def uninstall(self) -> None:
        try:
            if self._saved_mode is not None:
                torch.cuda.set_sync_debug_mode(self._saved_mode)
        finally:
            if self._catcher is not None:
                self._catcher.__exit__(None, None, None)
            self._catcher, self._saved_mode, self.muting = None, None, False
            self.mute = self.unmute = _nothing

    @staticmethod
    def _switch(mode: int) -> Callable[[], None]:
        # A C-level partial: muting runs twice per counted sync, where a Python frame costs microseconds.
        return functools.partial(torch._C._cuda_set_sync_debug_mode, mode)


def _non_blocking(args: tuple[Any, ...], kwargs: dict[str, Any], position: int | None) -> bool:
    if "non_blocking" in kwargs:
        return bool(kwargs["non_blocking"])
    if position is None:  # Tensor.to: the flag is the first bool, after a device, dtype or tensor
        flags = [arg for arg in args if isinstance(arg, bool)]
        return bool(flags and flags[0])
    return len(args) > position and bool(args[position])


def _stalls(host: torch.Tensor, device: torch.Tensor) -> bool:
    """A copy between ``host`` and ``device`` memory that stalls: pageable host memory, a real transfer."""
    return host.is_cpu and not device.is_cpu and host.numel() > 0 and not host.is_pinned()


def _put_back(owner: type, name: str, own: Any) -> None:
    """Restore ``owner.name``: the attribute it had itself, or none (it inherits the C method again)."""
    if own is None:
        delattr(owner, name)
    else:
        setattr(owner, name, own)


class PageableCopyCheck:
    """Wraps the Python entry points of ``non_blocking`` copies; others pass straight through."""

    def __init__(self) -> None:
        self._restore: list[Callable[[], None]] = []

    def install(self, emit: Emit) -> None:
        tensor = torch.Tensor

        def check(name: str, original: Callable[..., Any], position: int | None) -> Callable[..., Any]:
            def wrapper(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                # Most calls (``.to(dtype)``, ``.to(device)``) leave here: a positional flag is never first.
                if len(args) < 2 and not kwargs.get("non_blocking"):
                    return original(self, *args, **kwargs)
                if torch.compiler.is_compiling() or not _non_blocking(args, kwargs, position):
                    return original(self, *args, **kwargs)
                result = original(self, *args, **kwargs)
                if name == "copy_":
                    source = args[0] if args else kwargs["src"]
                    pair = (self, source) if self.is_cpu else (source, self)
                else:
                    pair = (self, result) if self.is_cpu else (result, self)
                if isinstance(pair[0], torch.Tensor) and isinstance(pair[1], torch.Tensor) and _stalls(*pair):
                    emit(f"Tensor.{name}", sys._getframe(1))
                return result

            wrapper.__name__ = wrapper.__qualname__ = name
            wrapper.__doc__ = original.__doc__
            return wrapper

        for name, position in (("to", None), ("copy_", 1), ("cuda", 1)):
            own = tensor.__dict__.get(name)
            setattr(tensor, name, check(name, getattr(tensor, name), position))
            self._restore.append(functools.partial(_put_back, tensor, name, own))

    def uninstall(self) -> None:
        while self._restore:
            self._restore.pop()()
