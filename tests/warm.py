"""Python processes for the suite's pytest runs, forked from a process that has imported torch already.

Most of the suite's CPU went to Python processes that import torch (128 of 531 processes, 279 of their 330 CPU-s on
the 2-core machine); a one-test plugin run took 2.0 s started fresh and 1.0 s forked from here. A run of
``python -m MODULE ...`` that a test starts goes through :func:`popen` instead: one server per test process imports
torch once, and forks a process per run, which takes the run's arguments, working folder, environment and standard
streams and then runs the module as ``-m`` would, in a process of its own that exits with the run's status. Nothing
else of the server is shared: pytest, the plugin and every other module are imported by the run itself.

The processes those runs start are warm too: a run's ``sys.executable`` is a launcher (:data:`_LAUNCHER`) that
forks ``python -m pytest``, an A/B and pytest-xdist's workers from the server as well, and hands every other command
to the interpreter. Tests whose own code starts such processes (pytester's in-process runs, the A/B's tests) put the
launcher in ``sys.executable`` for their duration (:func:`standing_in`). In a logged run of the suite before it,
about 25 nested xdist workers and 40 A/B sides had each spent some 1.5 CPU-s importing torch.

What differs from a fresh interpreter: torch was imported under the server's environment (a run that sets what the
import reads, :data:`IMPORT_SETTINGS`, otherwise starts cold), and what it made is frozen (``gc.freeze``);
``sys.executable`` is the launcher and ``sys.orig_argv`` the server's; the interpreter's start-up
(``sitecustomize``, ``.pth`` files of PYTHONPATH's folders) is not run again: a test of start-up hooks starts its
processes with :mod:`subprocess`; and a run's outermost frame is the server's (``<string>``), which a failure text
that shows the whole user stack would show: tests/test_docs.py runs cold. ``SYNCGUARD_TESTS_COLD=1``
starts every run as a fresh interpreter.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

#: Set to 1 to start every run as a fresh interpreter (to compare, or where a fork misbehaves).
COLD = "SYNCGUARD_TESTS_COLD"
#: Set in a measured test's children (the plugin's start-up hook): their runs start cold, as the hook needs.
CHILDREN = "SYNCGUARD_CHILDREN"
#: What torch reads when it is imported (its thread pool's size): a run whose environment sets them otherwise than
#: the server's did starts cold.
IMPORT_SETTINGS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

_SERVER = r"""
import fcntl, gc, json, os, runpy, select, signal, socket, sys

import torch  # noqa: F401  (the point of this process)

# What the import made stays for the process's life: a run's garbage collections need not walk it (pytest collects
# twice as it ends, about 0.1 s each with torch imported).
gc.freeze()

control = socket.socket(fileno=int(sys.argv[1]))
listener = socket.socket(fileno=int(sys.argv[2]))  # bound by the test process: a launcher can connect at once
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # runs' waiters are reaped by the kernel
startup_path = [p for p in sys.path if p not in ("", *os.environ.get("PYTHONPATH", "").split(os.pathsep))]


def watch(run, reply):
    # A launcher's run (a session of its own) is ended, whole, when the launcher is: its end of the reply closes.
    while True:
        pid, status = os.waitpid(run, os.WNOHANG)
        if pid:
            return status
        if select.select([reply], [], [], 0.05)[0] and not reply.recv(1):
            try:
                os.killpg(run, signal.SIGKILL)
            except OSError:
                pass
            return os.waitpid(run, 0)[1]


def serve():
    while True:
        ready = select.select([control, listener], [], [])[0]
        if control in ready:
            message, fds, _, _ = socket.recv_fds(control, 1 << 20, 4)
            if not message:
                os._exit(0)
        else:
            connection, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 256)
            fds = [*fds, connection.detach()]
        if len(fds) < 4:
            for fd in fds:
                os.close(fd)
            continue
        if os.fork() == 0:  # the waiter: starts the run, reports its pid and then its status
            control.close()
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            reply = socket.socket(fileno=fds[-1])
            request = json.loads(message)
            run = os.fork()
            if run == 0:
                reply.close()
                if request.get("session"):
                    os.setsid()
                return request, fds[:-1]
            reply.sendall(f"{run}\n".encode())
            status = watch(run, reply) if request.get("session") else os.waitpid(run, 0)[1]
            try:
                reply.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            except OSError:
                pass
            os._exit(0)
        for fd in fds:
            os.close(fd)


request, received = serve()
# Each descriptor at the number it had in the launcher (its standard streams, and those it was started with: an A/B
# side's channel), moved out of the way first.
targets = [0, 1, 2, *request.get("fds", [])]
above = max([*targets, *received]) + 1
moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, above) for fd in received]
for fd in received:
    os.close(fd)
for target, fd in zip(targets, moved):
    os.dup2(fd, target)
    os.close(fd)
if request.get("unbuffered"):
    import io
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace")
os.chdir(request["cwd"])
os.environ.clear()
os.environ.update(request["env"])
sys.executable = request["executable"]
extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if "code" in request:
    sys.path[:] = ["", *extra, *startup_path]
    sys.argv = ["-c", *request["args"]]
    exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    sys.exit(0)
sys.path[:] = [os.getcwd(), *extra, *startup_path]
sys.argv = [request["module"], *request["args"]]
runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
"""

#: The interpreter the warm runs see as ``sys.executable``: a launcher that forks ``python -m pytest ...``, an A/B
#: (``python -m pytest_syncguard.gate.cli ab``) and pytest-xdist's worker start from the server too (so an A/B's
#: sides and xdist's workers are warm), and hands every other command to this interpreter (``execv``). Its run is a
#: session of its own, which the signals the launcher gets are passed on to (SIGINT, SIGTERM and SIGHUP to the whole
#: session, as a process group would get them); the server's waiter ends the session when the launcher ends
#: without its run (SIGKILL). Written beside the server's socket.
_LAUNCHER = r"""#!{python} -IS
import json, os, signal, socket, sys

REAL, SOCKET, BOOTSTRAP, IMPORTED_WITH = {python!r}, {socket!r}, {bootstrap!r}, {imported_with!r}


def start(request):
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(SOCKET)
    except OSError:  # the server has ended with its test process
        return None
    inherited = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != connection.fileno() and os.path.exists(f"/proc/self/fd/{{fd}}"):
            inherited.append(fd)
    request.update(cwd=os.getcwd(), env=dict(os.environ), executable=__file__, session=True, fds=inherited)
    socket.send_fds(connection, [json.dumps(request).encode()], [0, 1, 2, *inherited])
    return connection.makefile("r")


def main():
    args = sys.argv[1:]
    flags = []
    while args and args[0] in ("-u", "-B"):
        flags.append(args.pop(0))
    request = None
    settings = {{name: os.environ.get(name) for name in IMPORTED_WITH}}
    # Cold: where asked, in a measured test's children (the start-up hook), and where torch would import otherwise.
    if os.environ.get({cold!r}) != "1" and {children!r} not in os.environ and settings == IMPORTED_WITH:
        if args[:2] == ["-m", "pytest"] or args[:3] == ["-m", "pytest_syncguard.gate.cli", "ab"]:
            request = {{"module": args[1], "args": args[2:]}}
        elif args[:2] == ["-c", BOOTSTRAP]:
            request = {{"code": BOOTSTRAP, "args": args[2:]}}
    reply = start({{**request, "unbuffered": "-u" in flags}}) if request is not None else None
    if reply is None:
        os.execv(REAL, [REAL, *sys.argv[1:]])
    pid = int(reply.readline())

    def forward(signum, frame):
        try:
            (os.killpg if signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) else os.kill)(pid, signum)
        except OSError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    line = reply.readline()
    code = int(line) if line else 1
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


main()
"""


class _Server:
    """The forking server of this process (started at its first run, ended with this process), and its launcher."""

    def __init__(self) -> None:
        folder = tempfile.mkdtemp(prefix="warm-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        address = os.path.join(folder, "socket")
        os.mkdir(os.path.join(folder, "bin"))
        self.launcher = os.path.join(folder, "bin", "python")
        self.imported_with = {name: os.environ.get(name) for name in IMPORT_SETTINGS}
        text = _LAUNCHER.format(python=sys.executable, socket=address, bootstrap=_bootstrap(), cold=COLD,
                                children=CHILDREN, imported_with=self.imported_with)  # fmt: skip
        Path(self.launcher).write_text(text)
        os.chmod(self.launcher, 0o755)
        ours, theirs = socket.socketpair()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(address)
        listener.listen(64)
        self._process = subprocess.Popen(
            [sys.executable, "-c", _SERVER, str(theirs.fileno()), str(listener.fileno())],
            pass_fds=[theirs.fileno(), listener.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # a run's streams are its own: nothing of the test process's is inherited
        )
        theirs.close()
        listener.close()
        self._control = ours
        self._lock = threading.Lock()

    def start(
        self, module: str, args: Sequence[str], cwd: str, env: Mapping[str, str], streams: Sequence[int]
    ) -> WarmProcess:
        ours, theirs = socket.socketpair()
        request = {"module": module, "args": list(args), "cwd": cwd, "env": dict(env), "executable": self.launcher}
        with self._lock:
            socket.send_fds(self._control, [json.dumps(request).encode()], [*streams, theirs.fileno()])
        theirs.close()
        return WarmProcess(ours)

    def alive(self) -> bool:
        return self._process.poll() is None


def _bootstrap() -> str:
    """The command pytest-xdist's workers start with (``python -u -c BOOTSTRAP``), as execnet writes it."""
    try:
        from execnet.gateway_io import popen_bootstrapline
    except ImportError:
        return "import sys;exec(eval(sys.stdin.readline()))"
    return str(popen_bootstrapline)


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


def launcher() -> str | None:
    """The launcher's path (None under :data:`COLD`): named ``python``, alone in its folder, which a ``PATH`` can
    name first."""
    return None if os.environ.get(COLD) == "1" else _the_server().launcher


@contextlib.contextmanager
def standing_in() -> Iterator[None]:
    """The launcher as this process's ``sys.executable`` inside the block (not under :data:`COLD`): the runs it
    starts with it (pytest-xdist's workers, an A/B and its sides) are forked from the server."""
    path = launcher()
    if path is None:
        yield
        return
    real, sys.executable = sys.executable, path
    try:
        yield
    finally:
        sys.executable = real


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
    /dev/null), or None where ``command`` is no such run or ``env`` sets :data:`IMPORT_SETTINGS` otherwise than
    the server's (start it with :mod:`subprocess`)."""
    found = module_of(command)
    if found is None:
        return None
    server, env = _the_server(), env if env is not None else os.environ
    if {name: env.get(name) for name in IMPORT_SETTINGS} != server.imported_with:
        return None  # torch would import otherwise than it did in the server
    opened: list[IO[Any]] = []
    fds = []
    for stream, mode in ((stdin, "r"), (stdout, "w"), (stderr, "w")):
        fd, file = _fd(stream, mode)
        fds.append(fd)
        if file is not None:
            opened.append(file)
    try:
        return server.start(*found, str(cwd or os.getcwd()), env, fds)
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
