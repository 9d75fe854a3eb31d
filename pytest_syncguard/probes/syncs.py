"""The sync probe: counts blocking host-device syncs, each with its kind and Python call site.

How: a Python kernel is registered for each catalogued operator (see :mod:`.sync_ops`) at the
``BackendSelect`` dispatch key, the last key before the backend kernel. Every call of that operator
reaches it, from Python or from inside another ATen kernel (``x[mask]`` calls ``nonzero`` in C++), while all
other operators keep their native speed: there is no per-op cost as with a ``TorchDispatchMode``. The kernel
records the call and redispatches to the backend. The hottest operator, ``_local_scalar_dense`` (``.item()``),
gets a C++ kernel with the same semantics where one can be built (:mod:`.native`). On CUDA the probe also wraps
the Python entry points of the explicit synchronizations (``torch.cuda.synchronize``, ``Stream.synchronize``,
``Event.synchronize``, ``torch.accelerator.synchronize``), which are no operators, and catches host<->device
copies as described in :mod:`.copies` (they get no dispatcher kernel: ``copy_`` is too frequent for one).

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
from .native import NATIVE
from .sync_ops import CATALOGUE, SyncKind, SyncOp
from .timeline import TIMELINE

STACK_DEPTH = 5
_new_event = tuple.__new__
_DISPATCH_KEY = "BackendSelect"
_SCALAR_READ = "_local_scalar_dense"


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
        self._internal: dict[str, bool] = {}

    def __contains__(self, filename: str) -> bool:
        internal = self._internal.get(filename)
        if internal is None:
            internal = filename.startswith("<frozen ") or os.path.realpath(filename).startswith(self._roots)
            self._internal[filename] = internal
        return internal


_INTERNAL = _InternalFiles()


def is_internal_file(filename: str) -> bool:
    """Whether a source file belongs to torch, this plugin or the test runner (not a call site)."""
    return filename in _INTERNAL


#: (id(code), instruction offset) -> (code, its Frame, or None in internal code): each frame of a loop's stack
#: is classified and resolved once, not once per token. Keyed by id: hashing a code object hashes its bytecode
#: and constants, microseconds per frame; the code is kept, so that its id is not reused.
_FRAMES: dict[tuple[int, int], tuple[CodeType, Frame | None]] = {}


def _resolve(frame: FrameType) -> Frame | None:
    code = frame.f_code
    if code.co_filename in _INTERNAL:
        return None
    return Frame(code.co_filename, frame.f_lineno, getattr(code, "co_qualname", code.co_name))


def _is_user_code(code: CodeType) -> bool:
    return code.co_filename not in _INTERNAL


def _site(code: CodeType, lasti: int) -> Frame:
    """The Frame of user ``code`` paused at instruction offset ``lasti`` (a frame's ``f_lasti``), cached."""
    key = (id(code), lasti)
    cached = _FRAMES.get(key)
    if cached is None or cached[1] is None:
        line = next((line for start, end, line in code.co_lines() if start <= lasti < end and line), None)
        site = Frame(code.co_filename, line or code.co_firstlineno, getattr(code, "co_qualname", code.co_name))
        cached = _FRAMES[key] = (code, site)
    return cached[1]  # type: ignore[return-value]


def _first_user_frame(frame: FrameType | None) -> tuple[FrameType, Frame] | None:
    """The innermost frame from ``frame`` outwards that lies outside torch and this plugin, and its Frame."""
    cache = _FRAMES
    while frame is not None:
        code = frame.f_code
        # f_lineno decodes the line table (microseconds in a large function); f_lasti is a plain int.
        key = (id(code), frame.f_lasti)
        cached = cache.get(key)
        if cached is None:
            cached = cache[key] = (code, _resolve(frame))
        if cached[1] is not None:
            return frame, cached[1]
        frame = frame.f_back
    return None


def user_stack(frame: FrameType | None, depth: int = STACK_DEPTH) -> tuple[Frame, ...]:
    """The innermost ``depth`` frames from ``frame`` outwards that lie outside torch and this plugin."""
    frames: list[Frame] = []
    while len(frames) < depth:
        found = _first_user_frame(frame)
        if found is None:
            break
        frame, site = found[0].f_back, found[1]
        frames.append(site)
    return tuple(frames)


def _label(kind: SyncKind, frame: FrameType | None) -> str:
    """How a counted sync is annotated in a profiler trace: its kind and Python call site."""
    stack = user_stack(frame, 1)
    return f"{kind.value} at {stack[0] if stack else '?'}"


class _ProbeState(threading.local):
    """Per thread: whether the probe's own code is running (its syncs and their inner ones are not counted)."""

    inside = False


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
        #: (op, call site, allowed) of the syncs whose short stack was recorded since a recorder last attached
        self._stacked: set[tuple[str, Frame, bool]] = set()
        self._local = _ProbeState()
        self._library: torch.library.Library | None = None
        self._native: Any = None  # the native kernel's module while its kernel is registered
        self._restore: list[Callable[[], None]] = []
        self._lock = threading.RLock()
        self._copies = BlockingCopySignal(self._local)
        self._pageable = PageableCopyCheck()

    @property
    def active(self) -> bool:
        return bool(self._recorders)

    @staticmethod
    def prepare() -> None:
        """Load (or build) the native kernel now, so that no measured region pays for it."""
        NATIVE.load()

    @property
    def scalar_read_kernel(self) -> str:
        """Which kernel counts scalar reads, and for the Python one why the native one does not."""
        why = NATIVE.unavailable
        return f"Python kernel: native {why}" if why else "native kernel"

    @contextmanager
    def recording(self, recorder: SyncRecorder) -> Iterator[SyncRecorder]:
        """Record syncs into ``recorder`` for the duration of the block."""
        with self._lock:
            if not self._recorders:
                self._install()
            self._drain()  # queued reads belong to the recorders attached before this one
            self._recorders.append(recorder)
            # The new recorder gets the stack of each site's first sync.
            self._stacked.clear()
            if self._native is not None:
                self._native.reset_stacks()
        try:
            yield recorder
        finally:
            with self._lock:
                try:
                    self._drain()
                finally:
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
        outer = local.inside
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
        # This runs on every counted sync, so it does the least work that keeps reports whole: the call site
        # always, the short stack above it only for the first sync from that site since a recorder attached
        # (reports show one stack per site: the first one's). The event is built as a plain tuple of
        # SyncEvent's fields, and the kind's string read from the member (``kind.value`` is a Python property).
        if self._native is not None:
            self._drain()
        found = _first_user_frame(frame)
        allowed = self._allowed > 0
        stack: tuple[Frame, ...] = ()
        if found is not None:
            caller, site = found
            stack = (site,)
            if (op, site, allowed) not in self._stacked:
                self._stacked.add((op, site, allowed))
                stack += user_stack(caller.f_back, STACK_DEPTH - 1)
        event = _new_event(SyncEvent, (kind._value_, op, count, stack, allowed))
        for recorder in self._recorders:
            recorder.events.append(event)

    def _drain(self) -> None:
        """Turn the scalar reads the native kernel queued into events, for the recorders attached now."""
        native = self._native
        if native is None or not native.pending():
            return
        op, kind, stacked = f"aten::{_SCALAR_READ}", SyncKind.SCALAR_READ._value_, self._stacked
        for code, lasti, allowed, above in native.drain():
            stack: tuple[Frame, ...] = ()
            if code is not None:
                site = _site(code, lasti)
                stack = (site,)
                if above is not None and (op, site, allowed) not in stacked:
                    stacked.add((op, site, allowed))
                    stack += tuple(_site(c, offset) for c, offset in above)
            event = _new_event(SyncEvent, (kind, op, 1, stack, allowed))
            for recorder in self._recorders:
                recorder.events.append(event)

    def _kernel(self, entry: SyncOp, op: torch._ops.OpOverload) -> Callable[..., Any]:
        # Without the native kernel this runs once per scalar read of a decoding loop, with the caches cold
        # from the model's kernels in between, so it reads closure variables only and calls the operator
        # handle's redispatch directly (what ``OpOverload.redispatch`` wraps): each saves microseconds per
        # call (bench/bench_overhead.py).
        after = torch._C._dispatch_keyset_full_after(DispatchKey.BackendSelect)
        redispatch = op._handle.redispatch_boxed
        local, signal, recorders, rule = self._local, self._copies, self._recorders, entry.rule
        name = f"aten::{entry.name}"

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            keyset = keyset & after
            if local.inside or not recorders or args[0].is_meta:
                return redispatch(keyset, *args, **kwargs)
            verdict = rule(args, kwargs, recorders[-1].on_device)
            local.inside = True
            muted = verdict is not None and signal.muting
            if muted:
                signal.mute()
            try:
                if verdict is not None and TIMELINE.active:
                    kind, frame = verdict[1], sys._getframe(1)
                    with TIMELINE.sync(lambda: _label(kind, frame)):
                        result = redispatch(keyset, *args, **kwargs)
                else:
                    result = redispatch(keyset, *args, **kwargs)
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
            if local.inside or not self._recorders:
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
        native = NATIVE.load()
        library = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
        try:
            for entry in CATALOGUE:
                base, _, overload = entry.name.partition(".")
                if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{entry.name}", _DISPATCH_KEY):
                    # Replacing a kernel already there (as for _to_copy) would change what the op computes.
                    raise RuntimeError(
                        f"syncguard: aten::{entry.name} already has a {_DISPATCH_KEY} kernel; refusing to replace it"
                    )
                if entry.name == _SCALAR_READ and native is not None:
                    self._install_native(native)
                    continue
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
            self._uninstall_native()
            self._unpatch()
            raise
        self._library = library

    def _install_native(self, native: Any) -> None:
        kind = SyncKind.SCALAR_READ

        def annotate(frame: FrameType | None) -> Any:
            return TIMELINE.sync(lambda: _label(kind, frame))

        native.install(self, self._local, self._recorders, self._copies, TIMELINE, annotate, _is_user_code, STACK_DEPTH)
        self._native = native

    def _uninstall_native(self) -> None:
        if self._native is not None:
            self._native.uninstall()
            self._native = None

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
            try:
                self._uninstall_native()
            finally:
                if self._library is not None:
                    self._library._destroy()  # type: ignore[no-untyped-call]
        finally:
            self._library = None
            self._unpatch()

    @property
    def installed(self) -> bool:
        """Whether the dispatcher kernels are registered right now (for tests of the restore paths)."""
        return self._library is not None or self._native is not None


PROBE = SyncProbe()
