"""The processes a measured test starts (``torch.multiprocessing.spawn``, ``multiprocessing.Process``,
``subprocess``), each with the line that started it: their syncs are measured with the test's (:mod:`.children`),
and the test's results name each (its pid, command and start line, how it ended, the syncs it made), and say plainly
which could not be measured (a process that is not Python) rather than passing it off as measured.

It replaces ``multiprocessing.process.BaseProcess.start`` (every start method, torch's spawn included) and
``subprocess.Popen.__init__`` for the test's call, and puts them back on every exit path.
"""

from __future__ import annotations

import multiprocessing.process
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from . import children
from .call_sites import STDLIB, first_user_frame
from .children import Child
from .patches import Patches


@dataclass
class Started:
    """A process the test started: what it runs, where it was started, and its handle (for its pid and its end)."""

    what: str
    line: str | None
    handle: Any = None

    @property
    def pid(self) -> int | None:
        return getattr(self.handle, "pid", None)

    def ended(self) -> str:
        """How it ended by the test's end: its exit code, the signal that killed it, or still running."""
        popen = isinstance(self.handle, subprocess.Popen)
        code = self.handle.poll() if popen else getattr(self.handle, "exitcode", None)
        if code is None:
            return "still running at the test's end"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}" if -code in signal.valid_signals() else f"exit {code}"
        return f"exit {code}"


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


def _line() -> str | None:
    """The test's line that started the process: the innermost frame outside torch, the plugin and the standard
    library (``subprocess.run`` calls ``Popen``)."""
    frame = sys._getframe(2)
    while frame is not None:
        caller, site, _ = first_user_frame(frame)
        if caller is None or site is None:
            return None
        if not caller.f_code.co_filename.startswith(STDLIB):
            return site.shown()
        frame = caller.f_back  # type: ignore[assignment]
    return None


@contextmanager
def watching() -> Iterator[list[Started]]:
    """Each process started in the block: what it runs (its target, or its command's program), where, its handle."""
    started: list[Started] = []
    patches = Patches()

    def on_start(original: Callable[..., Any]) -> Callable[..., Any]:
        def start(self: Any, *args: Any, **kwargs: Any) -> Any:
            started.append(Started(_named(self), _line(), self))
            try:
                return original(self, *args, **kwargs)
            finally:
                if self.pid is not None:
                    children.name(self.pid, started[-1].what)

        return start

    def on_popen(original: Callable[..., Any]) -> Callable[..., Any]:
        def init(self: Any, args: Any, *rest: Any, **kwargs: Any) -> Any:
            started.append(Started(_program(args), _line(), self))
            return original(self, args, *rest, **kwargs)

        return init

    patches.patch(multiprocessing.process.BaseProcess, "start", on_start)
    patches.patch(subprocess.Popen, "__init__", on_popen)
    try:
        yield started
    finally:
        patches.undo()


def note(started: Sequence[Started], measured: Sequence[Child], window: tuple[int, int]) -> str | None:
    """What a test is told of its child processes: each it started (pid, what it runs, where it was started, how it
    ended by the test's end, its syncs in the test's ``window``, wall-clock ns), whether measured or not (not Python);
    and each other child that made syncs in the window (a fixture's engine, a grandchild). None: none of either."""
    start, end = window
    by_pid = {c.pid: c for c in measured}

    def during(child: Child) -> int:
        return sum(e.syncs for t, e in child.syncs if e.counted and start <= t <= end)

    lines = []
    for process in started:
        where = f" started at {process.line}" if process.line else ""
        child = by_pid.pop(process.pid, None) if process.pid is not None else None
        if child is None:
            lines.append(
                f"{process.what} (pid {process.pid}){where}: not measured: not a Python process (or one run with "
                f"-I or -S, which skip syncguard's start-up hook); {process.ended()}"
            )
        else:
            lines.append(f"{child.label}{where}: {during(child)} sync(s) during the test; {process.ended()}")
    for child in by_pid.values():
        if during(child):
            lines.append(f"{child.label}, started by process {child.ppid}: {during(child)} sync(s) during the test")
    children.forget()
    if not lines:
        return None
    return (
        "syncguard: child processes, measured with this test where Python (their syncs inside its regions count "
        f"with its own, per its tokens): {'; '.join(lines)}"
    )


def not_measured(started: Sequence[Started], measured: Sequence[Child]) -> str | None:
    """The processes the test started that could not be measured (not Python), named; None: every one was."""
    pids = {c.pid for c in measured}
    blind = [f"{p.what} (pid {p.pid})" for p in started if p.pid is None or p.pid not in pids]
    return ", ".join(blind) or None
