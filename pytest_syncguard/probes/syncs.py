"""The sync probe: counts blocking host-device syncs, each with its kind and Python call site.

How: a kernel is registered for each catalogued operator (see :mod:`.sync_ops`) at the ``BackendSelect``
dispatch key, the last key before the backend kernel. Every call of that operator reaches it, from Python or
from inside another ATen kernel (``x[mask]`` calls ``nonzero`` in C++), while all other operators keep their
native speed: there is no per-op cost as with a ``TorchDispatchMode``. The kernel records the call and
redispatches to the backend. The hottest operators, ``_local_scalar_dense`` (``.item()``) and on CUDA ``copy_``
(transfers), get C++ kernels with the same semantics where they can be built (:mod:`.native`); the others are
Python kernels. On CUDA the probe also wraps the Python entry points of the explicit synchronizations
(``torch.cuda.synchronize``, ``Stream.synchronize``, ``Event.synchronize``, ``torch.accelerator.synchronize``),
which are no operators. Nothing here reads warnings or the sync-debug mode, so code under test that filters
warnings or sets the mode changes no count, and the user's mode is left as it was.

Counting is per process (a sync of any thread counts in the regions recording when it is made); ``allow()`` is
per thread (it excuses the syncs of the thread that entered it).

The kernels are registered when the first recorder attaches and removed when the last one detaches, on every
exit path, so nothing outlives a measured region; :meth:`SyncProbe.reset` removes what a test left open.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from types import FrameType
from typing import Any

import torch
from torch._C import DispatchKey

from ..analysis.sites import Frame, SyncEvent, budgeted_syncs
from .call_sites import STACK_DEPTH, code_class, first_user_frame, site_of, user_stack
from .native import NATIVE
from .patches import Patches
from .races import RACES
from .sync_ops import ASSIGNED_VALUE, CATALOGUE, SyncKind, SyncOp, as_tensor
from .timeline import TIMELINE

_new_event = tuple.__new__
_DISPATCH_KEY = "BackendSelect"
_SCALAR_READ = "_local_scalar_dense"


def _label(kind: SyncKind, frame: FrameType | None) -> str:
    """How a counted sync is annotated in a profiler trace: its kind and Python call site."""
    stack = user_stack(frame, 1)
    return f"{kind.value} at {stack[0].shown() if stack else '?'}"


class _ProbeState(threading.local):
    """Per thread: whether the probe's own code is running (its syncs and their inner ones are not counted),
    and the depth of the ``allow()`` blocks this thread is in."""

    inside = False
    allowed = 0


#: The native kernels' codes for what a counted call waited for (kernels.cpp, ``enum Wait``).
_WAITS = {
    0: ("aten::_local_scalar_dense", SyncKind.SCALAR_READ),
    1: ("aten::copy_", SyncKind.BLOCKING_COPY),
    2: ("aten::copy_", SyncKind.PAGEABLE_NON_BLOCKING),
}


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
        #: (op, call site, allowed) of the syncs whose short stack was recorded since a recorder last attached
        self._stacked: set[tuple[str, Frame, bool]] = set()
        self._local = _ProbeState()
        #: The open allow() blocks, so that a block left open (a generator never closed) can be found and reset.
        self._allowances: set[object] = set()
        self._library: torch.library.Library | None = None
        self._native: Any = None  # the native kernels' module while they are registered
        self._patches = Patches()
        self._lock = threading.RLock()

    @property
    def active(self) -> bool:
        return bool(self._recorders)

    @property
    def inside(self) -> bool:
        """Whether this thread is inside an operator the probe judged, or in the plugin's own unobserved code."""
        return self._local.inside

    @staticmethod
    def prepare() -> None:
        """Load (or build) the native kernels now, so that no measured region pays for it."""
        NATIVE.load()

    @property
    def kernels(self) -> str:
        """Which kernels count scalar reads and copies, and for the Python ones why the native ones do not."""
        why = NATIVE.unavailable
        return f"Python kernels: native {why}" if why else "native kernels"

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
            self._detach(recorder)

    def _detach(self, recorder: SyncRecorder) -> None:
        with self._lock:
            if recorder not in self._recorders:
                return  # already detached by reset()
            try:
                self._drain()
            finally:
                self._recorders.remove(recorder)
                if not self._recorders:
                    self._uninstall()

    @contextmanager
    def allowing(self) -> Iterator[None]:
        """Syncs of this thread in this block are recorded as intended and do not count against budgets."""
        token = object()
        local = self._local
        self._allowances.add(token)
        local.allowed += 1
        try:
            yield
        finally:
            if token in self._allowances:  # not when reset() closed it
                self._allowances.discard(token)
                local.allowed -= 1

    def left_open(self) -> tuple[int, int]:
        """How many recorders are attached and ``allow()`` blocks open (none, between tests)."""
        return len(self._recorders), len(self._allowances)

    def reset(self) -> None:
        """Detach every recorder, remove the kernels and close every allow() block: what a test left open (a
        generator suspended inside a region and never closed) must not count the next test's syncs. A block
        closed later, by the garbage collector, changes nothing."""
        with self._lock:
            for recorder in list(self._recorders):
                self._detach(recorder)
            self._allowances.clear()
            self._local.allowed = 0

    @contextmanager
    def unobserved(self) -> Iterator[None]:
        """The plugin's own syncs in this block (timing a region) reach no recorder, and a sync-debug mode the
        user set ("warn", "error") does not report them."""
        local = self._local
        outer = local.inside
        local.inside = True
        mode = torch.cuda.get_sync_debug_mode() if torch.cuda.is_available() else 0
        if mode:
            torch.cuda.set_sync_debug_mode(0)
        try:
            yield
        finally:
            local.inside = outer
            if mode:
                torch.cuda.set_sync_debug_mode(mode)

    # -- recording ---------------------------------------------------------------------------------
    def record_cuda_call(self, function: str, frame: FrameType | None) -> None:
        """Count a host-blocking CUDA call made outside torch (:mod:`.cuda_calls`) in the recorders attached now,
        as torch's syncs are counted: the call site, ``allow()`` and the compiler's calls apply alike."""
        if self._recorders:
            self._emit(function, 1, SyncKind.CUDA_CALL, frame)

    def stamp(self, kind: SyncKind, frame: FrameType | None) -> AbstractContextManager[Any]:
        """What marks a counted sync in a capture's trace or a sampled timeline's stamps, entered before the call
        and left when it returns."""
        return TIMELINE.sync(lambda: _label(kind, frame))

    def _emit(self, op: str, count: int, kind: SyncKind, frame: FrameType | None) -> None:
        # This runs on every counted sync, so it does the least work that keeps reports whole: the call site
        # always, the short stack above it only for the first sync from that site since a recorder attached
        # (reports show one stack per site: the first one's). The event is built as a plain tuple of
        # SyncEvent's fields, and the kind's string read from the member (``kind.value`` is a Python property).
        if self._native is not None:
            self._drain()
        caller, site, compiling = first_user_frame(frame)
        allowed = self._local.allowed > 0
        stack: tuple[Frame, ...] = ()
        if caller is not None and site is not None:
            stack = (site,)
            if (op, site, allowed) not in self._stacked:
                self._stacked.add((op, site, allowed))
                stack += user_stack(caller.f_back, STACK_DEPTH - 1)
        event = _new_event(SyncEvent, (kind._value_, op, count, stack, allowed, compiling))
        for recorder in self._recorders:
            recorder.events.append(event)

    def _drain(self) -> None:
        """Turn the calls the native kernels queued into events, for the recorders attached now."""
        native = self._native
        if native is None or not native.pending():
            return
        stacked = self._stacked
        for wait, code, lasti, allowed, compiling, above in native.drain():
            op, kind = _WAITS[wait]
            stack: tuple[Frame, ...] = ()
            if code is not None:
                site = site_of(code, lasti)
                stack = (site,)
                if above is not None and (op, site, allowed) not in stacked:
                    stacked.add((op, site, allowed))
                    stack += tuple(site_of(c, offset) for c, offset in above)
            event = _new_event(SyncEvent, (kind._value_, op, 1, stack, allowed, compiling))
            for recorder in self._recorders:
                recorder.events.append(event)

    def _kernel(self, entry: SyncOp, op: torch._ops.OpOverload) -> Callable[..., Any]:
        # Without the native kernel this runs once per scalar read of a decoding loop, with the caches cold
        # from the model's kernels in between, so it reads closure variables only and calls the operator
        # handle's redispatch directly (what ``OpOverload.redispatch`` wraps): each saves microseconds per
        # call (bench/bench_overhead.py).
        after = torch._C._dispatch_keyset_full_after(DispatchKey.BackendSelect)
        redispatch = op._handle.redispatch_boxed
        local, recorders, rule, numbers = self._local, self._recorders, entry.rule, entry.numbers
        name = f"aten::{entry.name}"

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            keyset = keyset & after
            if numbers and not all(isinstance(args[i], torch.Tensor) for i in numbers if i < len(args)):
                args = tuple(as_tensor(a) if i in numbers else a for i, a in enumerate(args))
            if local.inside or not recorders or args[0].is_meta:
                return redispatch(keyset, *args, **kwargs)
            verdict = rule(args, kwargs, recorders[-1].on_device)
            local.inside = True
            try:
                if verdict is not None and TIMELINE.active:
                    kind, frame = verdict[1], sys._getframe(1)
                    with TIMELINE.sync(lambda: _label(kind, frame)):
                        result = redispatch(keyset, *args, **kwargs)
                else:
                    result = redispatch(keyset, *args, **kwargs)
            finally:
                local.inside = False
            if verdict is not None:
                self._emit(name, verdict[0], verdict[1], sys._getframe(1))
                if RACES.watched:  # it waited for the current stream
                    RACES.waited()
            return result

        return kernel

    def _explicit(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        local = self._local

        @functools.wraps(original)
        def synchronize(*args: Any, **kwargs: Any) -> Any:
            if local.inside or not self._recorders:
                return original(*args, **kwargs)
            local.inside = True
            try:
                frame = sys._getframe(1)
                with TIMELINE.sync(lambda: _label(SyncKind.EXPLICIT, frame)):
                    result = original(*args, **kwargs)
            finally:
                local.inside = False
            self._emit(name, 1, SyncKind.EXPLICIT, sys._getframe(1))
            if RACES.watched:
                RACES.synchronized(name, args, kwargs)
            return result

        return synchronize

    @staticmethod
    def _setitem(original: Callable[..., Any]) -> Callable[..., Any]:
        """``Tensor.__setitem__`` telling the ``index_put_`` rule whether its value was a Python number."""
        state = ASSIGNED_VALUE

        @functools.wraps(original)
        def setitem(self: torch.Tensor, index: Any, value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return original(self, index, value)
            outer, state.python_number = state.python_number, True
            try:
                return original(self, index, value)
            finally:
                state.python_number = outer

        return setitem

    # -- installation --------------------------------------------------------------------------------
    def _install(self) -> None:
        cuda = torch.cuda.is_available()
        native = NATIVE.load()
        library = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
        entries = [entry for entry in CATALOGUE if cuda or not entry.device_only]
        by_native = {entry.name for entry in entries if entry.name in _NATIVE_OPS} if native is not None else set()
        if _SCALAR_READ not in by_native:  # the native module always registers the scalar read
            by_native.clear()
        try:
            for entry in entries:
                base, _, overload = entry.name.partition(".")
                if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{entry.name}", _DISPATCH_KEY):
                    # Replacing a kernel already there (as for _to_copy) would change what the op computes.
                    raise RuntimeError(
                        f"syncguard: aten::{entry.name} already has a {_DISPATCH_KEY} kernel; refusing to replace it"
                    )
                if entry.name in by_native:
                    continue
                op = getattr(getattr(torch.ops.aten, base), overload or "default")
                kernel = self._kernel(entry, op)
                library.impl(entry.name, kernel, _DISPATCH_KEY, with_keyset=True)  # type: ignore[no-untyped-call]
            if by_native:
                self._install_native(native, copies="copy_" in by_native)
            self._patches.patch(torch.Tensor, "__setitem__", self._setitem)
            if cuda:
                for owner, name in (
                    (torch.cuda, "torch.cuda.synchronize"),
                    (torch.cuda.Stream, "torch.cuda.Stream.synchronize"),
                    (torch.cuda.Event, "torch.cuda.Event.synchronize"),
                    (getattr(torch, "accelerator", None), "torch.accelerator.synchronize"),
                ):
                    if hasattr(owner, "synchronize"):
                        self._patches.patch(owner, "synchronize", functools.partial(self._explicit, name))
        except BaseException:
            library._destroy()  # type: ignore[no-untyped-call]
            self._uninstall_native()
            self._patches.undo()
            raise
        self._library = library

    def _install_native(self, native: Any, *, copies: bool) -> None:
        def annotate(frame: FrameType | None, wait: int) -> Any:
            kind = _WAITS[wait][1]
            return TIMELINE.sync(lambda: _label(kind, frame))

        native.install(self._local, self._recorders, TIMELINE, annotate, code_class, STACK_DEPTH, copies, RACES)
        self._native = native

    def _uninstall_native(self) -> None:
        if self._native is not None:
            self._native.uninstall()
            self._native = None

    def _uninstall(self) -> None:
        try:
            try:
                self._uninstall_native()
            finally:
                if self._library is not None:
                    self._library._destroy()  # type: ignore[no-untyped-call]
        finally:
            self._library = None
            self._patches.undo()

    @property
    def installed(self) -> bool:
        """Whether the dispatcher kernels are registered right now (for tests of the restore paths)."""
        return self._library is not None or self._native is not None


#: The operators the native module has kernels for (copy_ only where CUDA is available).
_NATIVE_OPS = frozenset({_SCALAR_READ, "copy_"})

PROBE = SyncProbe()
