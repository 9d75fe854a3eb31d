"""The child's side of a measured test's child processes: in a Python process the test started (loaded at start-up by
:mod:`.startup`, or after a fork), each sync the process makes is written to its own file in the test's folder for
children as it happens, with the wall-clock time and its call site, and so is each compilation of torch.compile, with
its start, and on CUDA each copy between host and device (the CUDA-call probe's watch, held for the process's life:
its blocking calls outside torch reach the recorder as syncs); the test's regions take those inside their windows
(:mod:`.children`). The file's first line says who the process is (pid, parent, command).

The sync probe is the test process's own (:data:`.syncs.PROBE`), attached with a recorder that writes through: it is
installed when the child imports torch (a process that never does makes no sync), with its Python kernels, which
hand each sync over as it happens (the native ones queue them), so that a sync is in the file before the call that
made it returns (a region that ends after a child answered has its syncs) and a child killed mid-test keeps what it
had written; a forked child first drops the copies of its parent's recorders. It is removed when the process ends (also
through ``os._exit`` from multiprocessing, whose finalizers run first).
"""

from __future__ import annotations

import atexit
import collections
import importlib.abc
import importlib.machinery
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import IO, Any

#: The environment variable that names the test's folder for children (set by the test process while it measures).
FOLDER_VARIABLE = "SYNCGUARD_CHILDREN"
#: The environment variable that names the native extension the test process loaded (empty: none), whose operator
#: counter a child loads from there: the same build, and no builder, hashing or compiler at the child's start.
EXTENSION_VARIABLE = "SYNCGUARD_CHILDREN_EXTENSION"
_started: dict[str, Any] = {}
_forks: list[bool] = []
_registered: list[bool] = []
#: One line at a time into the process's file, whichever thread writes it.
_WRITING = threading.Lock()


class _Written(list):  # type: ignore[type-arg]
    """A recorder's events that are also written, one line each, as they arrive."""

    def __init__(self, out: IO[str]) -> None:
        super().__init__()
        self._out = out
        self._named = False

    def append(self, event: Any) -> None:
        kind, op, syncs, stack, allowed, compiling = event
        line = json.dumps({"t": time.time_ns(), "e": [kind, op, syncs, [list(f) for f in stack], allowed, compiling]})
        with _WRITING:
            if not self._named:  # by its first sync, a multiprocessing child knows the target it runs
                self._named = True
                target = getattr(sys.modules.get("multiprocessing.process"), "_current_process", None)
                name = getattr(getattr(target, "_target", None), "__qualname__", None)
                if name:
                    self._out.write(json.dumps({"name": name}) + "\n")
            self._out.write(line + "\n")
            self._out.flush()


def _file(folder: str) -> IO[str]:
    out = open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a", buffering=1, encoding="utf-8")  # noqa: SIM115
    header = {"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.orig_argv, "t": time.time_ns()}
    out.write(json.dumps(header) + "\n")
    return out


#: The suffix of a child's operator total in the test's folder (the 8 bytes of a running count).
OPERATORS = ".ops"


def _install(out: IO[str], folder: str) -> None:
    """Attach a writing recorder to the sync probe for the rest of the process, and count its operators."""
    import torch

    from .native import NATIVE
    from .syncs import PROBE, SyncRecorder

    PROBE.reset()  # a forked child's copies of its parent's recorders (and their kernels) go
    native, why = NATIVE.load_from(os.environ.get(EXTENSION_VARIABLE, ""))
    NATIVE.switch_off("a child process hands each sync over as it happens: Python kernels")
    if native is None:
        _write(out, {"o": f"the native operator counter {why}"})
    else:  # for the process's life: the test takes the total's difference over each of its regions
        try:
            native.ops_share(os.path.join(folder, f"{os.getpid()}{OPERATORS}"))
            native.ops_start()
        except Exception as exc:  # never the child's import of torch's failure
            _write(out, {"o": f"the operator total could not be shared ({type(exc).__name__}: {exc})"})
    recorder = SyncRecorder(on_device=torch.cuda.is_available())
    recorder.events = _Written(out)
    manager = PROBE.recording(recorder)
    manager.__enter__()

    def stop() -> None:
        if (calls := _started.pop("cuda calls", None)) is not None:
            calls.__exit__(None, None, None)
        if _started.pop("recording", None) is not None:
            manager.__exit__(None, None, None)  # the kernels go before torch is torn down

    _started["recording"] = manager
    if torch.cuda.is_available() and not torch.cuda._is_in_bad_fork():
        # At the process's CUDA initialization (now, where it was done): a child that never uses the device pays
        # nothing for CUPTI.
        lazily = getattr(torch.cuda, "_lazy_call", None)
        if lazily is not None:
            lazily(lambda: _watch_cuda_calls(out))
        else:
            _watch_cuda_calls(out)
    atexit.register(stop)
    import multiprocessing.util

    multiprocessing.util.Finalize(None, stop, exitpriority=100)  # before multiprocessing's own os._exit


def _write(out: IO[str], data: dict[str, Any]) -> None:
    """One line into the process's file, stamped now unless ``data`` has its own time (``t``, wall-clock ns)."""
    line = json.dumps({"t": time.time_ns(), **data}, default=str)
    with _WRITING:
        out.write(line + "\n")
        out.flush()


class _Transfers(list):  # type: ignore[type-arg]
    """The CUDA-call probe's transfers (:class:`.cuda_calls.Transfer`), each written as it is made."""

    def __init__(self, out: IO[str]) -> None:
        super().__init__()
        self._out = out

    def append(self, made: Any) -> None:
        site, caller = (None if f is None else list(f) for f in (made.site, made.caller))
        _write(self._out, {"x": [made.direction, made.size, made.function, site, caller]})


class _NotRead(collections.Counter):  # type: ignore[type-arg]
    """The calls of copy functions whose parameters the CUDA-call probe does not read, each written as made."""

    def __init__(self, out: IO[str]) -> None:
        super().__init__()
        self._out = out

    def __setitem__(self, function: str, calls: int) -> None:
        _write(self._out, {"n": function})


def _watch_cuda_calls(out: IO[str]) -> None:
    """Hold the CUDA-call probe's watch for the rest of the process: each transfer between host and device is
    written, and each blocking CUDA call made outside torch reaches the writing recorder as a sync; where the calls
    cannot be watched (no CUPTI, or its one subscriber taken), the file says why."""
    from .cuda_calls import CUDA_CALLS

    CUDA_CALLS.reset()  # a forked child's copies of its parent's watches go
    manager = CUDA_CALLS.counting()
    try:
        watch = manager.__enter__()
    except Exception as exc:  # never the child's CUDA initialization's failure
        _write(out, {"u": f"the CUDA-call probe could not start ({type(exc).__name__}: {exc})"})
        return
    if watch.not_counted is not None:
        _write(out, {"u": watch.not_counted})
        manager.__exit__(None, None, None)
        return
    watch.transfers = _Transfers(out)
    watch.not_read = _NotRead(out)
    _started["cuda calls"] = manager


class _Compiles(collections.deque):  # type: ignore[type-arg]
    """Dynamo's compilation records (``torch._dynamo.utils._compilation_metrics``), each also written, as dynamo
    appends it once the compilation has ended: its wall-clock start, and what the compile probe reads of it."""

    def __init__(self, kept: collections.deque[Any], out: IO[str]) -> None:
        super().__init__(kept, kept.maxlen)
        self._out = out

    def append(self, record: Any) -> None:
        super().append(record)
        if getattr(record, "is_runtime", False):
            return
        start = getattr(record, "start_time_us", None)
        fields = [record.co_name, record.co_filename, record.co_firstlineno, record.recompile_reason]
        _write(self._out, {"c": fields} if start is None else {"t": int(start) * 1000, "c": fields})


def _watch_compile_starts(callback: ModuleType, out: IO[str]) -> None:
    """Write when each compilation starts (dynamo's start callbacks, run for the outermost one): a region that ends
    before its record is written knows it was still compiling."""
    handler = getattr(callback, "callback_handler", None)
    if handler is not None and hasattr(handler, "register_start_callback") and not _registered:
        _registered.append(True)  # once per process and the processes it forks, which write to their own files
        handler.register_start_callback(lambda *args: _write(_started["out"], {"cs": 1}))


def _watch_compiles(utils: ModuleType, out: IO[str]) -> None:
    kept = getattr(utils, "_compilation_metrics", None)
    if isinstance(kept, _Compiles):
        kept._out = out  # a forked child writes its own records to its own file
    elif isinstance(kept, collections.deque):
        utils._compilation_metrics = _Compiles(kept, out)  # type: ignore[attr-defined]


class _After(importlib.abc.MetaPathFinder):
    """Runs ``then`` with module ``name`` once it has been imported: the sync probe once ``torch`` is (a child that
    never imports it has no sync to count), the compile records' writer once dynamo's utilities are."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self._name = name
        self._then = then

    def find_spec(self, name: str, path: Any, target: ModuleType | None = None) -> Any:
        if name != self._name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader, then = spec.loader, self._then

        class _Then(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                loader.exec_module(module)
                then(module)

        spec.loader = _Then()
        return spec


def watch_forks() -> None:
    """Have every child this process forks from now on :func:`start` (where the folder is set then), once per
    process and those it forks (which inherit the hook)."""
    if not _forks:
        os.register_at_fork(after_in_child=start)
        _forks.append(True)


def start() -> None:
    """Measure this process's syncs into the test's folder for children (once per process); a fork of it starts its
    own file, and drops this one's."""
    folder = os.environ.get(FOLDER_VARIABLE)
    if not folder or _started.get("pid") == os.getpid():
        return
    global _WRITING
    _WRITING = threading.Lock()  # a fork's copy may be held by a thread the fork does not have
    watch_forks()
    _started.clear()
    _started["pid"] = os.getpid()
    out = _file(folder)
    _started["out"] = out
    if "torch" in sys.modules:
        _install(out, folder)
    else:
        sys.meta_path.insert(0, _After("torch", lambda _: _install(out, folder)))
    if (utils := sys.modules.get("torch._dynamo.utils")) is not None:
        _watch_compiles(utils, out)
    else:
        sys.meta_path.insert(0, _After("torch._dynamo.utils", lambda module: _watch_compiles(module, out)))
    if (callback := sys.modules.get("torch._dynamo.callback")) is not None:
        _watch_compile_starts(callback, out)
    else:
        sys.meta_path.insert(0, _After("torch._dynamo.callback", lambda module: _watch_compile_starts(module, out)))
