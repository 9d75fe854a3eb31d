"""The processes a measured test starts (``torch.multiprocessing.spawn``, ``multiprocessing.Process``,
``subprocess``): syncguard measures the process it runs in, so a test that spawns its ranks (as torch's own
``MultiProcessTestCase`` and DeepSpeed's tests do) has its ranks' syncs, collectives and GPU work outside its
numbers. The watch says so plainly in the test's results instead of passing them off as the ranks'.

It replaces ``multiprocessing.process.BaseProcess.start`` (every start method, torch's spawn included) and
``subprocess.Popen.__init__`` for the test's call, and puts them back on every exit path.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .patches import Patches


def _named(process: Any) -> str:
    """What a process runs: its target, or the function torch.multiprocessing's wrapper runs in it."""
    target = getattr(process, "_target", None)
    wrapped = getattr(process, "_args", ())
    if str(getattr(target, "__module__", "")).startswith("torch.multiprocessing") and wrapped and callable(wrapped[0]):
        target = wrapped[0]
    return getattr(target, "__qualname__", None) or str(getattr(process, "name", "a process"))


def _program(args: Any) -> str:
    """The program a ``Popen`` runs: its command's first word."""
    first = args if isinstance(args, (str, bytes, os.PathLike)) else next(iter(args), "?")
    text = os.fsdecode(first) if isinstance(first, (bytes, os.PathLike)) else str(first)
    return os.path.basename(text.split()[0]) if text.split() else "?"


@contextmanager
def watching() -> Iterator[list[str]]:
    """Each process started in the block, by what it runs (its target, or its command's program)."""
    started: list[str] = []
    patches = Patches()

    def on_start(original: Callable[..., Any]) -> Callable[..., Any]:
        def start(self: Any, *args: Any, **kwargs: Any) -> Any:
            started.append(_named(self))
            return original(self, *args, **kwargs)

        return start

    def on_popen(original: Callable[..., Any]) -> Callable[..., Any]:
        def init(self: Any, args: Any, *rest: Any, **kwargs: Any) -> Any:
            started.append(_program(args))
            return original(self, args, *rest, **kwargs)

        return init

    patches.patch(multiprocessing.process.BaseProcess, "start", on_start)
    patches.patch(subprocess.Popen, "__init__", on_popen)
    try:
        yield started
    finally:
        patches.undo()


def note(started: list[str]) -> str | None:
    """What a test that started processes is told (None: it started none)."""
    if not started:
        return None
    named = ", ".join(dict.fromkeys(started))
    return (
        f"syncguard: this test started {len(started)} process(es) ({named}): syncguard measured this process "
        "alone; their syncs, collectives and GPU work are not in its numbers. Launch ranks with torchrun to "
        "measure each (docs/howto/torchrun.md)"
    )
