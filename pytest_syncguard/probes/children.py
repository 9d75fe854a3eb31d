"""A measured test's Python child processes, from the test process's side: while the test runs, every Python process
it starts (``subprocess``, multiprocessing's spawn, forkserver and fork, at any depth) measures its own syncs,
compilations and, on CUDA, copies between host and device (:mod:`.child`) into the session's folder for them; each
region of the test takes the syncs its children made inside the region's wall-clock window (:func:`syncs_in`), the
compilations they started in it (:func:`compiles_in`) and their copies (:func:`copies_in`), each labelled with the
child that made it, so that a budget judges the test and its children together, per the test's tokens; and the
operators each ran in it, from the running total a child keeps in the folder (:func:`operators_in`).

How a child is reached: :func:`measuring` puts :mod:`.startup` first on ``PYTHONPATH`` (its ``sitecustomize`` starts
the child's probe at interpreter start-up) and names the folder in :data:`.child.FOLDER_VARIABLE`; a forked child is
started by an ``os.register_at_fork`` hook (:func:`.child.watch_forks`). Both hold from a measured test's setup to its
teardown and are undone after, so a test that does not measure starts its processes as they were. A process that is
not Python (or a Python run with ``-I`` or ``-S``) writes nothing: :func:`.spawned.not_measured` names it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analysis.sites import Frame, SyncEvent
from .child import EXTENSION_VARIABLE, FOLDER_VARIABLE, OPERATORS, watch_forks
from .cuda_calls import Transfer
from .native import NATIVE, NativeKernelError

STARTUP = Path(__file__).with_name("startup")
#: The process that measures its children (a child's own regions, if it had any, take none).
OWNER_VARIABLE = "SYNCGUARD_CHILDREN_OWNER"


@dataclass(frozen=True)
class Child:
    """One child process as its file says: who it is, and each sync it made (wall-clock ns, event)."""

    pid: int
    ppid: int
    argv: tuple[str, ...]
    syncs: tuple[tuple[int, SyncEvent], ...]
    compiles: tuple[tuple[int, Compiled], ...] = ()
    """Each compilation of torch.compile: when it started (wall-clock ns), and its record."""

    @property
    def command(self) -> str:
        """What it runs: the target the test started it with, else its command line shortened to 80 characters."""
        if self.pid in _NAMES:
            return _NAMES[self.pid]
        text = " ".join(" ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(self.argv)).split())
        return text if len(text) <= 80 else text[:77] + "..."

    @property
    def label(self) -> str:
        return f"child process {self.pid} ({self.command})"


@dataclass(frozen=True)
class Compiled:
    """A child's compilation as :func:`.compiles.counts_of` reads dynamo's records, the child named in ``process``."""

    co_name: str
    co_filename: str
    co_firstlineno: int
    recompile_reason: str | None
    process: str


#: What the test started each of its processes with (a multiprocessing target), by pid: a forked child's command
#: line is its parent's.
_NAMES: dict[int, str] = {}


def name(pid: int, what: str) -> None:
    """Say what process ``pid`` runs (for its label)."""
    _NAMES[pid] = what


def forget() -> None:
    """Forget the names of a test's processes (at its end)."""
    _NAMES.clear()


def _event(data: Any, label: str) -> SyncEvent:
    kind, op, syncs, stack, allowed, compiling = data
    frames = tuple(frame for frame in map(_frame, stack) if frame is not None)
    return SyncEvent(str(kind), f"{op} in {label}", int(syncs), frames, bool(allowed), bool(compiling))


def _child(header: Any, syncs: Any = (), compiles: Any = ()) -> Child:
    argv = tuple(str(a) for a in header.get("argv", ()))
    return Child(int(header["pid"]), int(header.get("ppid", 0)), argv, tuple(syncs), tuple(compiles))


def _compiled(fields: Any, label: str) -> Compiled:
    name, filename, line, reason = fields
    return Compiled(str(name), str(filename), int(line), None if reason is None else str(reason), f" in {label}")


def _frame(data: Any) -> Frame | None:
    return None if data is None else Frame(str(data[0]), int(data[1]), str(data[2]))


def _transfer(fields: Any, label: str) -> Transfer:
    direction, size, function, site, caller = fields
    return Transfer(str(direction), int(size), f"{function} in {label}", _frame(site), _frame(caller))


@dataclass(frozen=True)
class ChildCopies:
    """What the test's children copied between host and device memory in a region (each transfer's function named
    with its child), the copy calls whose parameters were not read, and why a child's calls were not watched."""

    transfers: tuple[Transfer, ...] = ()
    not_read: tuple[str, ...] = ()
    not_counted: tuple[str, ...] = ()


@dataclass
class _File:
    """How far a child's file has been read, and what it said so far."""

    offset: int = 0
    header: Any = None
    syncs: list[tuple[int, SyncEvent]] = field(default_factory=list)
    compiles: list[tuple[int, Compiled]] = field(default_factory=list)
    transfers: list[tuple[int, Transfer]] = field(default_factory=list)
    not_read: list[tuple[int, str]] = field(default_factory=list)
    not_counted: str | None = None
    """Why the child's CUDA calls were not watched (it said so once, when it imported torch)."""
    last_ns: int = 0
    """When it last wrote a line (wall-clock ns)."""
    no_operators: str | None = None
    """Why the child, which imported torch, does not count its operators."""
    compiling_since: int | None = None
    """When the compilation it is still in started (wall-clock ns; None: none), as its file says so far."""

    def take(self, text: str) -> None:
        for line in text.splitlines():
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if not isinstance(data, dict):
                continue
            if isinstance(stamp := data.get("t"), int):
                self.last_ns = max(self.last_ns, stamp)
            if self.header is None and "pid" in data:
                self.header = data
            elif self.header is not None and "name" in data:
                _NAMES.setdefault(int(self.header["pid"]), str(data["name"]))
            elif self.header is not None and "e" in data:
                self.syncs.append((int(data["t"]), _event(data["e"], _child(self.header).label)))
            elif self.header is not None and "cs" in data:
                self.compiling_since = int(data["t"])
            elif self.header is not None and "c" in data:
                self.compiles.append((int(data["t"]), _compiled(data["c"], _child(self.header).label)))
                self.compiling_since = None  # its record is written once it has ended
            elif self.header is not None and "x" in data:
                self.transfers.append((int(data["t"]), _transfer(data["x"], _child(self.header).label)))
            elif self.header is not None and "n" in data:
                self.not_read.append((int(data["t"]), f"{data['n']} in {_child(self.header).label}"))
            elif self.header is not None and "u" in data:
                self.not_counted = f"{_child(self.header).label}: {data['u']}"
            elif self.header is not None and "o" in data:
                self.no_operators = str(data["o"])


#: Each child file read so far: a read takes only what was written since the last (the session's files grow with
#: every sync of a long-lived engine).
_FILES: dict[Path, _File] = {}


def read(folder: Path, since_ns: int = 0) -> list[Child]:
    """The children that wrote to ``folder``, each file read on from where the last read stopped (a line a kill cut
    short is never read); syncs made before ``since_ns`` are forgotten (no later region can take them)."""
    found = []
    for path in sorted(folder.glob("*.jsonl")):
        state = _FILES.setdefault(path, _File())
        if path.stat().st_size > state.offset:  # a region's probes each ask at its end: a file opened once it grew
            with path.open("rb") as out:
                out.seek(state.offset)
                written = out.read()
            whole = written.rfind(b"\n") + 1
            state.offset += whole
            state.take(written[:whole].decode("utf-8", errors="replace"))
        if since_ns:
            state.syncs = [(t, e) for t, e in state.syncs if t >= since_ns]
            state.compiles = [(t, c) for t, c in state.compiles if t >= since_ns]
            state.transfers = [(t, x) for t, x in state.transfers if t >= since_ns]
            state.not_read = [(t, n) for t, n in state.not_read if t >= since_ns]
        if state.header is not None:
            found.append(_child(state.header, state.syncs, state.compiles))
    return found


@contextmanager
def measuring(folder: Path) -> Iterator[None]:
    """For the block (a measured test, from its setup to its teardown: an engine its fixture starts is its child
    too), every Python process started measures its syncs into ``folder``, and counts its operators with this
    process's native extension (named in :data:`.child.EXTENSION_VARIABLE`, where it is loaded); the environment
    is put back after."""
    watch_forks()
    names = (FOLDER_VARIABLE, OWNER_VARIABLE, EXTENSION_VARIABLE, "PYTHONPATH")
    saved = {name: os.environ.get(name) for name in names}
    os.environ[FOLDER_VARIABLE] = str(folder)
    os.environ[OWNER_VARIABLE] = str(os.getpid())
    try:
        native = NATIVE.load()
    except NativeKernelError:  # SYNCGUARD_NATIVE=1: the test's first region raises it
        native = None
    if native is not None and getattr(native, "__file__", None):
        os.environ[EXTENSION_VARIABLE] = str(native.__file__)
    else:
        os.environ[EXTENSION_VARIABLE] = ""
    path = saved["PYTHONPATH"]
    os.environ["PYTHONPATH"] = str(STARTUP) + (os.pathsep + path if path else "")
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class Folder:
    """The session's folder for its measured tests' children, made when first asked for and removed at its end."""

    def __init__(self) -> None:
        self._path: Path | None = None

    @property
    def path(self) -> Path:
        if self._path is None:
            self._path = Path(tempfile.mkdtemp(prefix="syncguard-children-"))
        return self._path

    def remove(self) -> None:
        if self._path is not None:
            for path in [p for p in _FILES if p.parent == self._path]:
                del _FILES[path]
            shutil.rmtree(self._path, ignore_errors=True)
            self._path = None


def active() -> Path | None:
    """The folder of the children of the test this process is measuring now (None: none, or this is a child)."""
    folder = os.environ.get(FOLDER_VARIABLE)
    return Path(folder) if folder and os.environ.get(OWNER_VARIABLE) == str(os.getpid()) else None


def _children() -> list[Child]:
    folder = active()
    return read(folder) if folder is not None and folder.is_dir() else []


def syncs_in(window: tuple[int, int]) -> tuple[SyncEvent, ...]:
    """The syncs the test's children made inside ``window`` (wall-clock ns): a region's share of them."""
    start, end = window
    return tuple(event for child in _children() for t, event in child.syncs if start <= t <= end)


def compiles_in(window: tuple[int, int]) -> tuple[Compiled, ...]:
    """The compilations the test's children started inside ``window`` (wall-clock ns)."""
    start, end = window
    return tuple(record for child in _children() for t, record in child.compiles if start <= t <= end)


def compiling_in(window: tuple[int, int]) -> tuple[str, ...]:
    """The test's children in a compilation that started inside ``window`` (wall-clock ns) and had not ended when
    their files were read (now), by label: what it compiled is not known yet."""
    start, end = window
    return tuple(
        _child(state.header).label
        for state in _states()
        if state.compiling_since is not None and start <= state.compiling_since <= end
    )


def _states() -> list[_File]:
    """Each file of the test's children read so far, read on now (none where the test measures no children)."""
    folder = active()
    if folder is None or not folder.is_dir():
        return []
    read(folder)
    return [state for path, state in _FILES.items() if path.parent == folder and state.header is not None]


def copies_in(window: tuple[int, int]) -> ChildCopies:
    """What the test's children copied between host and device inside ``window`` (wall-clock ns), and why a child
    that had started by its end could not be watched."""
    states, (start, end) = _states(), window
    return ChildCopies(
        tuple(x for state in states for t, x in state.transfers if start <= t <= end),
        tuple(n for state in states for t, n in state.not_read if start <= t <= end),
        tuple(
            state.not_counted
            for state in states
            if state.not_counted is not None and int(state.header.get("t", 0)) <= end
        ),
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def operators_now() -> dict[int, int]:
    """Each child's operators so far, by pid: the running totals those that imported torch keep in the test's
    folder (:data:`.child.OPERATORS`)."""
    folder = active()
    if folder is None or not folder.is_dir():
        return {}
    found = {}
    for path in folder.glob(f"*{OPERATORS}"):
        with contextlib.suppress(OSError, ValueError):
            found[int(path.stem)] = int.from_bytes(path.read_bytes()[:8], "little")
    return found


def operators_in(window: tuple[int, int], before: Mapping[int, int]) -> tuple[dict[str, int], tuple[str, ...]]:
    """The operators each child ran since ``before`` (:func:`operators_now` at a region's start), by the child's
    label; and the children that imported torch without counting theirs and may have run inside ``window``
    (wall-clock ns): each that started in it, wrote in it, or had started by its end and is still there."""
    now, ran, blind = operators_now(), {}, []
    for state in _states():
        pid, label = int(state.header["pid"]), _child(state.header).label
        if pid in now:
            if now[pid] > before.get(pid, 0):
                ran[f"every operator of {label}"] = now[pid] - before.get(pid, 0)
        elif state.no_operators is not None and _ran(state, window):
            blind.append(f"{label}: {state.no_operators}")
    return ran, tuple(blind)


def _ran(state: _File, window: tuple[int, int]) -> bool:
    """Whether a child may have run inside ``window`` (wall-clock ns): it started in it, wrote in it, or had started
    by its end and is still there (an engine that syncs nothing writes nothing)."""
    start, end = window
    return int(state.header.get("t", 0)) <= end and (state.last_ns >= start or _alive(int(state.header["pid"])))


def ran_in(window: tuple[int, int]) -> tuple[str, ...]:
    """The test's children that may have run inside ``window`` (wall-clock ns), by label."""
    return tuple(_child(state.header).label for state in _states() if _ran(state, window))
