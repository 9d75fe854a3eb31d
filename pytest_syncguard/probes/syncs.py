"""The sync probe: counts blocking host-device syncs, each with its kind and Python call site.

How: a Python kernel is registered for each catalogued operator (see :mod:`.sync_ops`) at the
``BackendSelect`` dispatch key, the last key before the backend kernel. Every call of that operator
reaches it, from Python or from inside another ATen kernel (``x[mask]`` calls ``nonzero`` in C++), while all
other operators keep their native speed: there is no per-op cost as with a ``TorchDispatchMode``. The kernel
records the call and redispatches to the backend. On CUDA the probe also wraps the Python entry points of the
explicit synchronizations (``torch.cuda.synchronize``, ``Stream.synchronize``, ``Event.synchronize``,
``torch.accelerator.synchronize``), which are no operators, and catches host<->device copies as described in
:mod:`.copies` (they get no dispatcher kernel: ``copy_`` is too frequent for one).

The kernels are registered when the first recorder attaches and removed when the last one detaches, on every
exit path, so nothing outlives a measured region.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import CodeType, FrameType
from typing import Any

import _pytest
import pluggy
import pytest
import torch
from torch._C import DispatchKey

from ..analysis.sites import Frame, SyncEvent, budgeted_syncs
from .copies import BlockingCopySignal, PageableCopyCheck
from .sync_ops import CATALOGUE, SyncKind, SyncOp
from .timeline import TIMELINE

STACK_DEPTH = 5
_DISPATCH_KEY = "BackendSelect"


def _package_dir(module_file: str | None) -> str:
    return os.path.realpath(os.path.dirname(module_file or "")) + os.sep


class _InternalFiles:
    """Decides whether a source file belongs to torch, this plugin or the test runner, by the packages' real
    locations (never by a substring of the path: a project under a folder named ``torch`` is user code)."""

    def __init__(self) -> None:
        self._roots = tuple(
            _package_dir(module.__file__)
            for module in (torch, sys.modules["pytest_syncguard"], _pytest, pytest, pluggy)
        )
        #: id(code) -> (code, its frame name or None for internal code). Keyed by id: hashing a code object
        #: hashes its bytecode and constants, microseconds per frame; the code is kept to check identity.
        self.names: dict[int, tuple[CodeType, str | None]] = {}

    def __contains__(self, filename: str) -> bool:
        return filename.startswith("<frozen ") or os.path.realpath(filename).startswith(self._roots)

    def name(self, code: CodeType) -> str | None:
        """The qualified name of ``code`` if it is user code, else None."""
        name = None if code.co_filename in self else getattr(code, "co_qualname", code.co_name)
        self.names[id(code)] = (code, name)
        return name


_INTERNAL = _InternalFiles()


def is_internal_file(filename: str) -> bool:
    """Whether a source file belongs to torch, this plugin or the test runner (not a call site)."""
    return filename in _INTERNAL


#: (id(code), instruction offset) -> (code, Frame): a loop's sync site is resolved once, not once per token
_SITES: dict[tuple[int, int], tuple[CodeType, Frame]] = {}


def user_stack(frame: FrameType | None, depth: int = STACK_DEPTH) -> tuple[Frame, ...]:
    """The innermost ``depth`` frames from ``frame`` outwards that lie outside torch and this plugin."""
    frames: list[Frame] = []
    names, unknown, sites = _INTERNAL.names, _INTERNAL.name, _SITES
    while frame is not None and len(frames) < depth:
        code = frame.f_code
        known = names.get(id(code))
        name = known[1] if known is not None and known[0] is code else unknown(code)
        if name is not None:
            # f_lineno decodes the line table (microseconds in a large function); f_lasti is a plain int.
            key = (id(code), frame.f_lasti)
            cached = sites.get(key)
            if cached is None or cached[0] is not code:
                cached = sites[key] = (code, Frame(code.co_filename, frame.f_lineno, name))
            frames.append(cached[1])
        frame = frame.f_back
    return tuple(frames)


def _label(kind: SyncKind, frame: FrameType | None) -> str:
    """How a counted sync is annotated in a profiler trace: its kind and Python call site."""
    stack = user_stack(frame, 1)
    return f"{kind.value} at {stack[0] if stack else '?'}"


class SyncRecorder:
    """Collects the syncs of one measured region."""

    def __init__(self, on_device: bool) -> None:
        self.on_device = on_device
        self.events: list[SyncEvent] = []

    @property
    def syncs(self) -> int:
        """Syncs that count against budgets (those inside ``allow()`` do not)."""
        return budgeted_syncs(self.events)


class SyncProbe:
    """Process-wide owner of the dispatcher kernels and patches; recorders attach to it."""

    def __init__(self) -> None:
        self._recorders: list[SyncRecorder] = []
        self._allowed = 0
        self._local = threading.local()
        self._library: torch.library.Library | None = None
        self._restore: list[Callable[[], None]] = []
        self._lock = threading.RLock()
        self._copies = BlockingCopySignal(self._local)
        self._pageable = PageableCopyCheck()

    @property
    def active(self) -> bool:
        return bool(self._recorders)

    @contextmanager
    def recording(self, recorder: SyncRecorder) -> Iterator[SyncRecorder]:
        """Record syncs into ``recorder`` for the duration of the block."""
        with self._lock:
            if not self._recorders:
                self._install()
            self._recorders.append(recorder)
        try:
            yield recorder
        finally:
            with self._lock:
                self._recorders.remove(recorder)
                if not self._recorders:
                    self._uninstall()

    @contextmanager
    def allowing(self) -> Iterator[None]:
        """Syncs in this block are recorded as intended and do not count against budgets."""
        self._allowed += 1
        try:
            yield
        finally:
            self._allowed -= 1

    @contextmanager
    def unobserved(self) -> Iterator[None]:
        """The plugin's own syncs in this block (timing a region) reach no recorder and no sync warning."""
        local, signal = self._local, self._copies
        outer = getattr(local, "inside", False)
        muted = signal.muting and not outer
        local.inside = True
        if muted:
            signal.mute()
        try:
            yield
        finally:
            local.inside = outer
            if muted:
                signal.unmute()

    # -- recording ---------------------------------------------------------------------------------
    def _emit(self, op: str, count: int, kind: SyncKind, frame: FrameType | None) -> None:
        event = SyncEvent(kind.value, op, count, user_stack(frame), allowed=self._allowed > 0)
        for recorder in self._recorders:
            recorder.events.append(event)

    def _kernel(self, entry: SyncOp, op: torch._ops.OpOverload) -> Callable[..., Any]:
        after = torch._C._dispatch_keyset_full_after(DispatchKey.BackendSelect)
        local, signal = self._local, self._copies
        name = f"aten::{entry.name}"

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(local, "inside", False) or not self._recorders:
                return op.redispatch(keyset & after, *args, **kwargs)
            local.inside = True
            muted = signal.muting
            if muted:
                signal.mute()
            try:
                first = args[0]
                verdict = None
                if not (isinstance(first, torch.Tensor) and first.is_meta):
                    verdict = entry.rule(args, kwargs, self._recorders[-1].on_device)
                if verdict is not None and TIMELINE.active:
                    kind, frame = verdict[1], sys._getframe(1)
                    with TIMELINE.sync(lambda: _label(kind, frame)):
                        result = op.redispatch(keyset & after, *args, **kwargs)
                else:
                    result = op.redispatch(keyset & after, *args, **kwargs)
            finally:
                local.inside = False
                if muted:
                    signal.unmute()
            if verdict is not None:
                self._emit(name, verdict[0], verdict[1], sys._getframe(1))
            return result

        return kernel

    def _explicit(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        local, signal = self._local, self._copies

        @functools.wraps(original)
        def synchronize(*args: Any, **kwargs: Any) -> Any:
            if getattr(local, "inside", False) or not self._recorders:
                return original(*args, **kwargs)
            local.inside = True
            muted = signal.muting
            if muted:
                signal.mute()  # Stream.synchronize is flagged by the runtime too
            try:
                frame = sys._getframe(1)
                with TIMELINE.sync(lambda: _label(SyncKind.EXPLICIT, frame)):
                    result = original(*args, **kwargs)
            finally:
                local.inside = False
                if muted:
                    signal.unmute()
            self._emit(name, 1, SyncKind.EXPLICIT, sys._getframe(1))
            return result

        return synchronize

    # -- installation --------------------------------------------------------------------------------
    def _install(self) -> None:
        cuda = torch.cuda.is_available()
        library = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
        try:
            for entry in CATALOGUE:
                base, _, overload = entry.name.partition(".")
                if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{entry.name}", _DISPATCH_KEY):
                    # Replacing a kernel already there (as for _to_copy) would change what the op computes.
                    raise RuntimeError(
                        f"syncguard: aten::{entry.name} already has a {_DISPATCH_KEY} kernel; refusing to replace it"
                    )
                op = getattr(getattr(torch.ops.aten, base), overload or "default")
                kernel = self._kernel(entry, op)
                library.impl(entry.name, kernel, _DISPATCH_KEY, with_keyset=True)  # type: ignore[no-untyped-call]
            if cuda:
                self._patch(torch.cuda, "synchronize", "torch.cuda.synchronize")
                self._patch(torch.cuda.Stream, "synchronize", "torch.cuda.Stream.synchronize")
                self._patch(torch.cuda.Event, "synchronize", "torch.cuda.Event.synchronize")
                if hasattr(torch, "accelerator") and hasattr(torch.accelerator, "synchronize"):
                    self._patch(torch.accelerator, "synchronize", "torch.accelerator.synchronize")
                self._pageable.install(self._copy_emitter(SyncKind.PAGEABLE_NON_BLOCKING))
                self._copies.install(self._copy_emitter(SyncKind.BLOCKING_COPY))
        except BaseException:
            library._destroy()  # type: ignore[no-untyped-call]
            self._unpatch()
            raise
        self._library = library

    def _patch(self, owner: Any, attribute: str, name: str) -> None:
        original = owner.__dict__[attribute]
        setattr(owner, attribute, self._explicit(name, original))
        self._restore.append(lambda: setattr(owner, attribute, original))

    def _copy_emitter(self, kind: SyncKind) -> Callable[[str, FrameType | None], None]:
        def emit(op: str, frame: FrameType | None) -> None:
            if self._recorders:
                self._emit(op, 1, kind, frame)

        return emit

    def _unpatch(self) -> None:
        try:
            self._copies.uninstall()
        finally:
            try:
                self._pageable.uninstall()
            finally:
                while self._restore:
                    self._restore.pop()()

    def _uninstall(self) -> None:
        try:
            if self._library is not None:
                self._library._destroy()  # type: ignore[no-untyped-call]
        finally:
            self._library = None
            self._unpatch()

    @property
    def installed(self) -> bool:
        """Whether the dispatcher kernels are registered right now (for tests of the restore paths)."""
        return self._library is not None


PROBE = SyncProbe()
