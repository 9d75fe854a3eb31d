"""The timeline probe: a torch.profiler session over a test's call on CUDA, with the plugin's regions, decode
steps and counted syncs annotated, exported as a Chrome trace for :mod:`..analysis.gaps`.

Only host ranges and CUDA activity are recorded (no shapes, no Python stacks): each adds host time per op,
which would lengthen the very launch gaps being measured.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from ..analysis.gaps import REGION_ANNOTATION, STEP_ANNOTATION, SYNC_ANNOTATION


class TimelineProbe:
    """Process-wide: at most one profiled test call at a time (torch.profiler does not nest)."""

    def __init__(self) -> None:
        self.active = False

    @contextmanager
    def capturing(self) -> Iterator[list[Path]]:
        """Profile the block; on exit the yielded list holds the exported trace file (the caller removes it)."""
        if self.active:
            raise RuntimeError("syncguard: a timeline capture is already running")
        config = torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True)
        prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], experimental_config=config)
        exported: list[Path] = []
        prof.start()
        self.active = True
        try:
            yield exported
        finally:
            self.active = False
            torch.cuda.synchronize()  # the last kernels belong to the trace
            prof.stop()
            handle, name = tempfile.mkstemp(prefix="syncguard-", suffix=".trace.json")
            os.close(handle)
            prof.export_chrome_trace(name)
            exported.append(Path(name))

    def region(self, number: int) -> AbstractContextManager[Any]:
        return record_function(f"{REGION_ANNOTATION}#{number}") if self.active else nullcontext()

    def sync(self, label: Callable[[], str]) -> AbstractContextManager[Any]:
        """Annotate a counted sync; ``label`` (its kind and call site) is only computed while capturing."""
        return record_function(f"{SYNC_ANNOTATION} {label()}") if self.active else nullcontext()

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


TIMELINE = TimelineProbe()
