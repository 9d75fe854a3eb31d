"""The timeline probe: a profiler session over a test's call on CUDA that records the device's work and the
plugin's own annotations (regions, decode steps, counted syncs), exported as a Chrome trace for
:mod:`..analysis.gaps`.

What it records is what the verdicts need and nothing the loop pays for per operator: the CUDA activity
(kernels, copies, memsets, runtime and driver calls, synchronizations) comes from CUPTI, and on the host only
``record_function`` ranges (user scope) are recorded. The dispatcher's operators are not: recording each one
costs host time before every launch, which in a launch-bound loop lengthens the very gaps being measured
(bench/bench_timeline_capture.py). The driver calls are kept: cuBLASLt launches its kernels through the driver
(``cuLaunchKernel``), as Triton does, and a kernel without its launch record leaves the gap before it without a
cause. ``host_ops=True`` records the operators too, for a diagnostic run whose timings are not judged.

A sentinel kernel is launched inside an annotation just before the capture stops: a trace whose sentinel has
no kernel lost events (the profiler's device buffers filled), and nothing in it is trusted.

CUPTI is detached from the process when a capture stops (kineto's ``TEARDOWN_CUPTI``): left attached, as
kineto leaves it by default, it slows every later kernel launch of the process, those of tests that capture
nothing included (bench/bench_cupti_floor.py).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from pathlib import Path
from typing import Any

import torch
from torch._C._autograd import _disable_profiler, _enable_profiler, _prepare_profiler
from torch._C._profiler import ProfilerActivity, RecordScope, _ExperimentalConfig
from torch.autograd.profiler import record_function

from ..analysis.gaps import MARKED_STEP_ANNOTATION, REGION_ANNOTATION, STEP_ANNOTATION, SYNC_ANNOTATION
from ..analysis.reliability import SENTINEL_ANNOTATION
from . import cupti

#: Why the CUDA-call probe counts nothing during a capture (:meth:`.cupti.Subscriber.yielding`).
CAPTURE_HOLDS_CUPTI = (
    "a profiler trace of the test's GPU timeline held CUPTI's one subscriber of the process (--syncguard-timeline="
    "trace, the trace standing in for the sampler, or a measure()'s counting run)"
)

_ACTIVITIES = {ProfilerActivity.CPU, ProfilerActivity.CUDA}
#: kineto's switch: "1" detaches CUPTI when a capture stops, and attaches it again when the next one starts.
TEARDOWN = "TEARDOWN_CUPTI"
#: The CUDA calls made after a capture stops, so that kineto's detaching thread finishes there: it detaches CUPTI
#: on the return of the first CUDA call after it is ready, which would otherwise be the caller's next.
_DETACH_CALLS, _DETACH_PAUSE_S = 10, 0.001


@contextmanager
def cupti_detached_afterwards() -> Iterator[None]:
    """Let kineto detach CUPTI when the profiler stops inside the block, and finish detaching before the block
    exits; where :data:`TEARDOWN` is set already (by the user, or by torch when it compiled CUDA graphs that
    cannot attach CUPTI again, during the capture or before) it is left as it is. The variable is restored on
    exit, unless code inside the block set another value: that one is kept."""
    if TEARDOWN in os.environ:
        yield
        return
    os.environ[TEARDOWN] = "1"
    try:
        yield
    finally:
        try:
            # A failing test's call ends here too. A CUDA error would have been raised by the capture's own
            # synchronizations before this point: none may replace the exception on its way out.
            with suppress(RuntimeError):
                for _ in range(_DETACH_CALLS) if torch.cuda.is_initialized() else ():  # type: ignore[no-untyped-call]
                    torch.cuda.synchronize()
                    time.sleep(_DETACH_PAUSE_S)
        finally:
            if os.environ.get(TEARDOWN) == "1":
                del os.environ[TEARDOWN]


def _config() -> Any:
    """A profiler configuration of this torch version: no shapes, memory, stacks, flops or modules; CUDA
    synchronization events on."""
    experimental = _ExperimentalConfig(enable_cuda_sync_events=True)
    # torch.autograd.profiler.profile builds the ProfilerConfig its torch version expects; it is not entered.
    holder = torch.autograd.profiler.profile(use_device="cuda", experimental_config=experimental)
    return holder.config()  # type: ignore[no-untyped-call]


class _StampOnReturn:
    """Around a counted sync: when it returns (the host resumes), its stamp (wall clock ns, label) is added."""

    __slots__ = ("_label", "_stamps")

    def __init__(self, stamps: list[tuple[int, str]], label: Callable[[], str]) -> None:
        self._stamps, self._label = stamps, label

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self._stamps.append((time.time_ns(), self._label()))


class TimelineProbe:
    """Process-wide: at most one captured test call at a time (the profiler does not nest)."""

    def __init__(self) -> None:
        self.active = False
        """Counted syncs are annotated (:meth:`sync`): a capture runs, or sync stamps are taken."""
        self.tracing = False
        """A profiler capture runs: regions, steps and syncs are annotated in its trace."""
        self._region_files: list[Path] | None = None
        self._stamps: list[tuple[int, str]] | None = None

    @contextmanager
    def stamping(self) -> Iterator[list[tuple[int, str]]]:
        """Stamp each counted sync outside a capture: (the host's wall clock in ns when it returned, its kind and
        call site), on a sampled timeline's clock. One ``time.time_ns()`` and the call site per sync, no
        profiler."""
        stamps: list[tuple[int, str]] = []
        self._stamps = stamps
        self.active = True
        try:
            yield stamps
        finally:
            self._stamps = None
            self.active = self.tracing

    @contextmanager
    def per_region(self) -> Iterator[list[Path]]:
        """Capture the regions that ask for it (:meth:`region_capture`) each on its own, instead of a whole call;
        the yielded list gets their trace files (the caller removes them)."""
        files: list[Path] = []
        self._region_files = files
        try:
            yield files
        finally:
            self._region_files = None

    def region_capture(self) -> AbstractContextManager[Any]:
        """A capture of one region while :meth:`per_region` is on (none inside another capture)."""
        if self._region_files is None or self.tracing:
            return nullcontext()
        return self._captured_into(self._region_files)

    @contextmanager
    def _captured_into(self, files: list[Path]) -> Iterator[None]:
        exported: list[Path] = []
        try:
            with self.capturing() as exported:
                yield
        finally:
            files.extend(exported)

    @contextmanager
    def capturing(self, *, host_ops: bool = False) -> Iterator[list[Path]]:
        """Capture the block; on exit the yielded list holds the exported trace file (the caller removes it).
        ``host_ops``: record every operator on the host as well (slows a launch-bound loop: diagnosis only)."""
        if self.tracing:
            raise RuntimeError("syncguard: a timeline capture is already running")
        with cupti.SUBSCRIBER.yielding(CAPTURE_HOLDS_CUPTI), self._capturing(host_ops) as exported:
            yield exported

    @contextmanager
    def _capturing(self, host_ops: bool) -> Iterator[list[Path]]:
        exported: list[Path] = []
        config = _config()
        scopes = set() if host_ops else {RecordScope.USER_SCOPE}  # empty: every scope
        _prepare_profiler(config, _ACTIVITIES)
        _enable_profiler(config, _ACTIVITIES, scopes)  # type: ignore[call-arg]  # the stub lacks scopes
        self.active = self.tracing = True
        try:
            yield exported
        finally:
            self.tracing = False
            self.active = self._stamps is not None
            try:
                torch.cuda.synchronize()  # the last kernels belong to the trace
                with record_function(SENTINEL_ANNOTATION):
                    torch.cuda._sleep(1)  # type: ignore[no-untyped-call]
                torch.cuda.synchronize()
            finally:
                # Only around the stop: kineto also detaches at the start of a session, from a CUPTI that an
                # earlier one left attached (a torch.profiler run without TEARDOWN_CUPTI), in a thread that
                # finishes while the new session records: its last kernels were lost (seen on an H200).
                with cupti_detached_afterwards():
                    result = _disable_profiler()
            handle, name = tempfile.mkstemp(prefix="syncguard-", suffix=".trace.json")
            os.close(handle)
            result.save(name)
            exported.append(Path(name))

    def region(self, number: int) -> AbstractContextManager[Any]:
        return record_function(f"{REGION_ANNOTATION}#{number}") if self.tracing else nullcontext()

    def sync(self, label: Callable[[], str]) -> AbstractContextManager[Any]:
        """Annotate a counted sync in the capture's trace, or stamp it (:meth:`stamping`); ``label`` (its kind and
        call site) is only computed then."""
        if self.tracing:
            return record_function(f"{SYNC_ANNOTATION} {label()}")
        if self._stamps is not None:
            return _StampOnReturn(self._stamps, label)
        return nullcontext()

    def step_hooks(self, model: torch.nn.Module) -> list[Any]:
        """Annotate each forward call of ``model`` as a decode step; returns the hook handles to remove."""
        open_steps: list[record_function] = []

        def enter(module: torch.nn.Module, args: Any) -> None:
            step = record_function(STEP_ANNOTATION)
            step.__enter__()  # type: ignore[no-untyped-call]
            open_steps.append(step)

        def leave(module: torch.nn.Module, args: Any, output: Any) -> None:
            if open_steps:
                open_steps.pop().__exit__(None, None, None)

        return [model.register_forward_pre_hook(enter), model.register_forward_hook(leave, always_call=True)]


class MarkedSteps:
    """The decode steps a loop marks itself (``region.step()``): each mark ends the open step and begins the
    next; annotated only while a capture runs."""

    def __init__(self) -> None:
        self.marks = 0
        self._open: record_function | None = None

    def mark(self) -> None:
        self.marks += 1
        self.close()
        if TIMELINE.tracing:
            step = record_function(MARKED_STEP_ANNOTATION)
            step.__enter__()  # type: ignore[no-untyped-call]
            self._open = step

    def close(self) -> None:
        step, self._open = self._open, None
        if step is not None:
            step.__exit__(None, None, None)


TIMELINE = TimelineProbe()
