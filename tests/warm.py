"""Python processes for the suite's pytest runs, forked from a process that has imported torch already.

Most of the suite's CPU went to Python processes that import torch (128 of 531 processes, 279 of their 330 CPU-s on
the 2-core machine); a one-test plugin run took 2.0 s started fresh and 1.0 s forked from here. A run of
``python -m MODULE ...`` that a test starts goes through :func:`popen` instead: one server per test process imports
torch once, and forks a process per run, which takes the run's arguments, working folder, environment and standard
streams and then runs the module as ``-m`` would, in a process of its own that exits with the run's status. Nothing
else of the server is shared: pytest, the plugin and every other module are imported by the run itself.

What differs from a fresh interpreter: torch was imported under the server's environment (its import reads none of
what the tests set: they set SYNCGUARD_* and PYTHONPATH), ``sys.orig_argv`` is the server's, and the interpreter's
start-up (``sitecustomize``, ``.pth`` files of PYTHONPATH's folders) is not run again: a test of start-up hooks
starts its processes with :mod:`subprocess`; and a run's outermost frame is the server's (``<string>``), which a
failure text that shows the whole user stack would show: tests/test_docs.py runs cold. ``SYNCGUARD_TESTS_COLD=1``
starts every run as a fresh interpreter.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

#: Set to 1 to start every run as a fresh interpreter (to compare, or where a fork misbehaves).
COLD = "SYNCGUARD_TESTS_COLD"

_SERVER = r"""
import json, os, runpy, signal, socket, sys

import torch  # noqa: F401  (the point of this process)

control = socket.socket(fileno=int(sys.argv[1]))
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # runs' waiters are reaped by the kernel
startup_path = [p for p in sys.path if p not in ("", *os.environ.get("PYTHONPATH", "").split(os.pathsep))]


def serve():
    while True:
        message, fds, _, _ = socket.recv_fds(control, 1 << 16, 4)
        if not message:
            os._exit(0)
        if os.fork() == 0:  # the waiter: starts the run, reports its pid and then its status
            control.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            reply = socket.socket(fileno=fds[3])
            run = os.fork()
            if run == 0:
                reply.close()
                return json.loads(message), fds[:3]
            reply.sendall(f"{run}\n".encode())
            _, status = os.waitpid(run, 0)
            reply.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            os._exit(0)
        for fd in fds:
            os.close(fd)


request, streams = serve()
for target, fd in enumerate(streams):
    os.dup2(fd, target)
    os.close(fd)
os.chdir(request["cwd"])
os.environ.clear()
os.environ.update(request["env"])
extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
sys.path[:] = [os.getcwd(), *extra, *startup_path]
sys.argv = [request["module"], *request["args"]]
runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
"""


class _Server:
    """The forking server of this process (started at its first run, ended with this process)."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self._process = subprocess.Popen(
            [sys.executable, "-c", _SERVER, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # a run's streams are its own: nothing of the test process's is inherited
        )
        theirs.close()
        self._control = ours
        self._lock = threading.Lock()

    def start(
        self, module: str, args: Sequence[str], cwd: str, env: Mapping[str, str], streams: Sequence[int]
    ) -> WarmProcess:
        ours, theirs = socket.socketpair()
        message = json.dumps({"module": module, "args": list(args), "cwd": cwd, "env": dict(env)}).encode()
        with self._lock:
            socket.send_fds(self._control, [message], [*streams, theirs.fileno()])
        theirs.close()
        return WarmProcess(ours)

    def alive(self) -> bool:
        return self._process.poll() is None


_server: list[_Server] = []


def _the_server() -> _Server:
    if not _server or not _server[0].alive():
        _server[:] = [_Server()]
    return _server[0]


class WarmProcess:
    """A run started by the server, waited for as a :class:`subprocess.Popen` is (``wait``, ``kill``, ``returncode``)."""

    stdin = None

    def __init__(self, reply: socket.socket) -> None:
        self._reply = reply.makefile("r")
        self.pid = int(self._reply.readline())
        self.returncode: int | None = None
        self._done = threading.Event()
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        line = self._reply.readline()
        self.returncode = int(line) if line else -signal.SIGKILL
        self._done.set()

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        if not self._done.is_set():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _fd(stream: Any, mode: str) -> tuple[int, IO[Any] | None]:
    """A file descriptor for a run's standard stream (and the file opened for it, to close)."""
    if stream is None or stream == subprocess.DEVNULL:
        opened = open(os.devnull, mode)  # noqa: SIM115
        return opened.fileno(), opened
    if isinstance(stream, int):
        return stream, None
    return stream.fileno(), None


def module_of(command: Sequence[str]) -> tuple[str, list[str]] | None:
    """``(module, args)`` where ``command`` runs a module with this interpreter and nothing else (``-m`` only)."""
    if os.environ.get(COLD) == "1" or len(command) < 2 or command[0] != sys.executable:
        return None
    if command[1] == "-m" and len(command) > 2:
        return command[2], list(command[3:])
    if command[1].startswith("-m") and len(command[1]) > 2:
        return command[1][2:], list(command[2:])
    return None


def popen(
    command: Sequence[str],
    *,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    stdin: Any = None,
    stdout: Any = None,
    stderr: Any = None,
) -> WarmProcess | None:
    """Start ``python -m MODULE ARGS`` forked from the server, its streams the given files or descriptors (None:
    /dev/null), or None where ``command`` is no such run (start it with :mod:`subprocess`)."""
    found = module_of(command)
    if found is None:
        return None
    opened: list[IO[Any]] = []
    fds = []
    for stream, mode in ((stdin, "r"), (stdout, "w"), (stderr, "w")):
        fd, file = _fd(stream, mode)
        fds.append(fd)
        if file is not None:
            opened.append(file)
    try:
        return _the_server().start(*found, str(cwd or os.getcwd()), env if env is not None else os.environ, fds)
    finally:
        for file in opened:
            file.close()


def run(
    command: Sequence[str],
    *,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """As ``subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)``, forked
    from the server where ``command`` is ``python -m MODULE ...``."""
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = popen(command, cwd=cwd, env=env, stdout=out, stderr=err)
        if process is None:
            return subprocess.run(list(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise subprocess.TimeoutExpired(list(command), timeout or 0.0) from None
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(list(command), code, out.read(), err.read())
