"""How ``syncguard ab`` runs one side (base or head) of a round: a turn of its warm pytest (:class:`WarmSide`, the
default: one process per side for the whole A/B, started once), or a pytest process of its own
(:class:`FreshSide`, ``--fresh-processes``). Each side imports its own code first (its root, and its ``src/`` if
there is one, lead ``PYTHONPATH``), runs in a process group of its own and writes its results and log under the
A/B's output folder.

No torch here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Protocol

from ...ab_channel import STACKS_ENV, WORKER_OPTION, Channel, ChannelClosed
from ...document import file as results_file
from ...document.measured import MeasuredTest

#: Exit statuses of a round's pytest that still measured: all passed, or some test failed (a budget, say).
MEASURED_EXITS = (0, 1)
#: How long a side's pytest gets to end after it is told to (SIGINT), before its process group is killed.
STOP_GRACE_S = 10.0
#: How long the warm sides get, together, to tear their fixtures down and exit once the A/B is done with them.
FINISH_S = 60.0


class ABError(Exception):
    """An A/B run that cannot go on; the message names the side, round, ref or file at fault."""


class Side(Protocol):
    """One side of the A/B, run once per round."""

    times_only: bool
    """Its code can run a round's timed runs only (a base from before --syncguard-timings-only cannot: then neither
    side does, so that both measure alike)."""

    @property
    def collected(self) -> Sequence[str]:
        """The node ids its pytest collected (empty where they are known only once a round ran: a fresh side)."""
        ...

    def run(
        self, label: str, settled: Sequence[str], timeout: float, timings_only: bool = False, repeat: int | None = None
    ) -> dict[str, MeasuredTest]:
        """The tests measured by the round's run ``label`` (``round3-base``), the ``settled`` ones left out;
        ``timings_only``: their timed runs only (``--syncguard-timings-only``), ``repeat`` of them per measure()
        where given (``--syncguard-repeat``)."""
        ...


def read_results(path: Path) -> dict[str, MeasuredTest]:
    """The measured tests of a round's results file, by node id: also those whose call raised (a test that fails
    on one side is the A/B's first verdict, :func:`.ab.compare_sides`)."""
    try:
        tests = results_file.read(path)
    except results_file.ResultsError as exc:
        raise ABError(str(exc)) from exc
    return {t.nodeid: t for t in tests}


def side_environment(directory: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a side's pytest: its own code first on ``PYTHONPATH``."""
    first = [str(directory)] + ([str(directory / "src")] if (directory / "src").is_dir() else [])
    rest = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**environ, "PYTHONPATH": os.pathsep.join([*first, *rest])}


def _pytest_command(directory: Path, pytest_args: Sequence[str], out: Path, *extra: str) -> list[str]:
    empty = out / "no-baselines"
    empty.mkdir(exist_ok=True)
    return [
        sys.executable,
        "-m",
        "pytest",
        *pytest_args,
        "--syncguard",
        "--syncguard-baselines",
        str(empty),
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(directory),
        *extra,
    ]


def _start(
    command: list[str], directory: Path, log: Path, pass_fds: Sequence[int] = (), stacks: Path | None = None
) -> subprocess.Popen[bytes]:
    environment = side_environment(directory, os.environ)
    if stacks is not None:
        environment[STACKS_ENV] = str(stacks)
    with log.open("w", encoding="utf-8") as sink:
        # In a session of its own: a Ctrl-C in the terminal reaches the A/B alone, which then ends this pytest
        # itself (end_group), instead of the pytest ending half-way while the A/B goes on.
        return subprocess.Popen(
            command,
            cwd=directory,
            env=environment,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
        )


def run_until_done(process: subprocess.Popen[bytes], timeout: float) -> int:
    """Wait for a side's pytest (the leader of its own process group); on a timeout or an interrupt, end its
    whole group first (SIGINT, then SIGKILL after :data:`STOP_GRACE_S`) and re-raise."""
    try:
        return process.wait(timeout=timeout)
    except BaseException:
        end_group(process)
        raise


def end_group(process: subprocess.Popen[bytes]) -> None:
    """End a process and everything it started in its group: SIGINT first (pytest finishes its teardowns), SIGKILL
    after :data:`STOP_GRACE_S`, and SIGKILL to what is left of the group once the leader is gone."""
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    with suppress(subprocess.TimeoutExpired):
        process.wait(timeout=STOP_GRACE_S)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def said(log: Path) -> str:
    """What a side's pytest said last about why it stopped: its ``ERROR:`` line (a usage error, a file not found),
    else its last line."""
    try:
        lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return "its log cannot be read"
    lines = [line for line in lines if line]
    errors = [line for line in lines if line.startswith(("ERROR:", "error:", "E "))]
    return ((errors or lines or ["it printed nothing"])[-1])[:300]


class FreshSide:
    """A pytest process per round, with its own JSON results, JUnit file and log (``round3-base.json``, ...)."""

    #: Whether a fresh pytest knows the option is not asked: its rounds measure everything.
    times_only = False
    collected: Sequence[str] = ()

    def __init__(self, directory: Path, pytest_args: Sequence[str], out: Path) -> None:
        self.directory, self.pytest_args, self.out = directory, tuple(pytest_args), out

    def run(
        self, label: str, settled: Sequence[str], timeout: float, timings_only: bool = False, repeat: int | None = None
    ) -> dict[str, MeasuredTest]:
        results, log, junit = (self.out / f"{label}{suffix}" for suffix in (".json", ".log", ".xml"))
        deselected = (f"--deselect={nodeid}" for nodeid in settled)
        timed = [
            *(["--syncguard-timings-only"] if timings_only else []),
            *([f"--syncguard-repeat={repeat}"] if timings_only and repeat is not None else []),
        ]
        command = _pytest_command(
            self.directory,
            self.pytest_args,
            self.out,
            "--syncguard-json",
            str(results),
            "--junitxml",
            str(junit),
            *timed,
            *deselected,
        )
        process = _start(command, self.directory, log)
        try:
            returncode = run_until_done(process, timeout)
        except subprocess.TimeoutExpired as exc:
            raise ABError(f"{label}: pytest ran over {timeout:.0f} s (log: {log})") from exc
        if returncode not in MEASURED_EXITS:
            raise ABError(f"{label}: pytest exited {returncode} in {self.directory}: {said(log)} (log: {log})")
        if not results.is_file():
            raise ABError(f"{label}: pytest wrote no results (log: {log})")
        return read_results(results)


class WarmSide:
    """One pytest process for all of a side's rounds (:mod:`.ab_worker`): started, its imports done and its tests
    collected once; each round is a turn of it, whose results it writes to ``round3-base.json`` (its log, of every
    turn, is ``base.log``)."""

    def __init__(self, name: str, directory: Path, pytest_args: Sequence[str], out: Path) -> None:
        self.name, self.directory, self.out = name, directory, out
        self.log = out / f"{name}.log"
        self.stacks = out / f"{name}.stacks.txt"
        to_worker, from_worker = os.pipe(), os.pipe()
        fds = f"{to_worker[0]},{from_worker[1]}"
        command = _pytest_command(directory, pytest_args, out, f"{WORKER_OPTION}={fds}")
        try:
            self.process = _start(command, directory, self.log, (to_worker[0], from_worker[1]), self.stacks)
        except BaseException:
            for fd in (*to_worker, *from_worker):
                os.close(fd)
            raise
        os.close(to_worker[0])
        os.close(from_worker[1])
        self.channel = Channel(from_worker[0], to_worker[1])
        self.times_only = False
        self.can_hold = False
        """Its code can hold a test set up across its rounds (:meth:`hold`, :meth:`replay`)."""
        self.collected: list[str] = []
        """The node ids its pytest collected (:meth:`ready`)."""

    def ready(self, timeout: float) -> list[str]:
        """The node ids its pytest collected, once it has (ABError if none, or if it ended first); whether it can
        run timed runs only, it says with them."""
        answer = self._receive("start", timeout)
        self.times_only = answer.get("timings_only") is True
        self.can_hold = answer.get("hold") is True
        collected = answer.get("ready")
        if not isinstance(collected, list) or not collected:
            raise ABError(f"{self.name}: pytest collected no test in {self.directory} (log: {self.log})")
        self.collected = [str(nodeid) for nodeid in collected]
        return self.collected

    def run(
        self, label: str, settled: Sequence[str], timeout: float, timings_only: bool = False, repeat: int | None = None
    ) -> dict[str, MeasuredTest]:
        return self._ask(
            {
                "turn": label,
                "skip": list(settled),
                "timings_only": timings_only,
                "repeat": repeat if timings_only else None,
            },
            timeout,
        )

    def hold(
        self, label: str, nodeid: str, timeout: float, timings_only: bool = False, repeat: int | None = None
    ) -> dict[str, MeasuredTest]:
        """Set up and run the test ``nodeid`` once, as a turn would, and keep it set up for :meth:`replay` until
        anything else is asked (then it is torn down): its results (none where it was not measured)."""
        return self._ask({"turn": label, "hold": nodeid, "timings_only": timings_only, "repeat": repeat}, timeout)

    def replay(
        self, label: str, nodeid: str, timeout: float, timings_only: bool = True, repeat: int | None = None
    ) -> dict[str, MeasuredTest]:
        """Call the held test ``nodeid`` again, its fixtures and warm state kept (no warm-up): its results."""
        return self._ask({"turn": label, "replay": nodeid, "timings_only": timings_only, "repeat": repeat}, timeout)

    def _ask(self, message: dict[str, object], timeout: float) -> dict[str, MeasuredTest]:
        self._send(message)
        return self._answer(str(message["turn"]), timeout)

    def _send(self, message: dict[str, object]) -> None:
        label = str(message["turn"])
        try:
            self.channel.send({**message, "results": str(self.out / f"{label}.json")})
        except ChannelClosed:
            raise ABError(f"{label}: the {self.name}'s pytest has ended ({self._ended()}; log: {self.log})") from None

    def _answer(self, label: str, timeout: float) -> dict[str, MeasuredTest]:
        answer = self._receive(label, timeout)
        if answer.get("stopped"):
            raise ABError(f"{label}: pytest stopped: {answer['stopped']} (log: {self.log})")
        results = self.out / f"{label}.json"
        return read_results(results) if results.is_file() else {}

    def _receive(self, label: str, timeout: float) -> dict[str, object]:
        try:
            return self.channel.receive(timeout)
        except TimeoutError:
            raise ABError(f"{label}: the {self.name}'s pytest ran over {timeout:.0f} s (log: {self.log})") from None
        except ChannelClosed as exc:
            raise ABError(
                f"{label}: the {self.name}'s pytest {self._ended()}: {said(self.log)} ({exc}; log: {self.log})"
            ) from None

    def _ended(self) -> str:
        with suppress(subprocess.TimeoutExpired):
            return f"exited {self.process.wait(timeout=STOP_GRACE_S)}"
        return "stopped answering"

    def tell_to_stop(self) -> None:
        with suppress(ChannelClosed):
            self.channel.send({"stop": True})

    def finish(self, until: float | None = None) -> str:
        """Once told to stop (here, without ``until``), give it until the monotonic time ``until`` (default
        :data:`FINISH_S` from now) to tear down and exit, then end its group: "" where it ended by itself, else
        that it did not, its threads' stacks written to :attr:`stacks`."""
        if until is None:
            self.tell_to_stop()
            until = time.monotonic() + FINISH_S
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=max(until - time.monotonic(), 0.0))
        late = ""
        if self.process.poll() is None:
            with suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGUSR2)
            time.sleep(1.0)  # its stack dump, written from the signal handler
            late = f"the {self.name}'s pytest did not end when told (its stacks: {self.stacks})"
        self.end()
        return late

    def end(self) -> None:
        """End its process group now (what is left of it: end_group copes with a leader that has exited), and close
        the channel."""
        end_group(self.process)
        self.channel.close()


def hold_at_once(holds: Mapping[str, WarmSide], nodeid: str, timeout: float, repeat: int | None = None) -> None:
    """Hold ``nodeid`` on each of ``holds`` (label -> side) at once, timings only: holds that are no round (their
    runs are warm-ups), whose set-ups, compilations and warm-ups may overlap."""
    for label, side in holds.items():
        side._send({"turn": label, "hold": nodeid, "timings_only": True, "repeat": repeat})
    for label, side in holds.items():
        side._answer(label, timeout)


def process_name(side: str, pair: int) -> str:
    """The name of a side's process of pair ``pair`` (from 1): ``base``, ``base-2``; its log is ``NAME.log``."""
    return side if pair == 1 else f"{side}-{pair}"


@contextmanager
def warm_sides(
    folders: Mapping[str, Path],
    pytest_args: Mapping[str, Sequence[str]],
    out: Path,
    timeout: float,
    say: Callable[[str], object],
    processes: int = 1,
) -> Iterator[dict[str, Side]]:
    """``processes`` warm pytests for each side (``{"base": folder, "head": folder}``; the later ones named by
    :func:`process_name`), started at once and collected within ``timeout`` each; told to finish on the way out,
    ended at once on an error or interrupt."""
    sides: dict[str, WarmSide] = {}
    try:
        for pair in range(1, processes + 1):
            for name, folder in folders.items():
                sides[process_name(name, pair)] = WarmSide(process_name(name, pair), folder, pytest_args[name], out)
        counts = {name: len(side.ready(timeout)) for name, side in sides.items()}
        each = "one warm pytest per side" if processes == 1 else f"{processes} warm pytests per side"
        collected = ", ".join(f"{counts[name]} tests on the {name}" for name in folders)
        say(f"syncguard ab: {each}, kept warm across rounds ({collected})")
        yield dict(sides)
    except BaseException:
        for side in sides.values():
            side.end()
        raise
    for side in sides.values():  # all at once: their teardowns overlap
        side.tell_to_stop()
    until = time.monotonic() + FINISH_S
    for side in sides.values():
        if late := side.finish(until):
            say(f"syncguard ab: {late}")


@contextmanager
def fresh_sides(
    folders: Mapping[str, Path], pytest_args: Mapping[str, Sequence[str]], out: Path
) -> Iterator[dict[str, Side]]:
    """A new pytest process for each side in each round."""
    yield {name: FreshSide(folder, pytest_args[name], out) for name, folder in folders.items()}
