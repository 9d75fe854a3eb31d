"""A warm side of ``syncguard ab``: one pytest process that runs its selected tests as the A/B tells it over
:class:`.ab_channel.Channel`, and writes the results of each thing it ran to the file the A/B names.

The process starts, imports and collects once. It runs tests in one of two ways:

- a turn: the selected tests once each, each torn down as pytest would; between turns it keeps what the turn's
  first test's collectors set up (module and session fixtures: the model, say);
- a held test: one test set up and called, then, before its teardown, called again for each replay the A/B asks
  for, with its fixtures (and what its warm-up made) still set up; it is torn down when the A/B asks for anything
  else.

What it says:

- ``{"ready": [node ids collected], "timings_only": true, "hold": true}`` once collected (it can run a turn's
  timed runs only, and hold a test);
- ``{"done": label, "measured": n, "stopped": why}`` after each turn, hold or replay (``stopped`` empty unless
  pytest was told to stop: ``-x``, ``--maxfail``).

What it is told: ``{"turn": label, "skip": [node ids], "results": path, "timings_only": bool, "repeat": n or
null}`` (the turn measures timed runs only, as ``--syncguard-timings-only``; ``repeat`` of them per measure(), as
``--syncguard-repeat``); ``{"hold": node id, "turn": label, "results": path, "timings_only": bool, "repeat": n or
null}``; ``{"replay": node id, "turn": label, "results": path, "timings_only": bool, "repeat": n or null}`` (of
the test held); or ``{"stop": true}``; the A/B's end of the pipe closing stops it too.

Between its turns a held test's process gives its allocator's cached memory back (other warm sides run on the same
GPU meanwhile: four processes each caching a test's working memory, 40 GB on an H200, ran it out), and SIGUSR2 makes
it write every thread's Python stack to the file ``SYNCGUARD_AB_STACKS`` names (the A/B asks for it before it ends a
side that did not end when told)."""

from __future__ import annotations

import faulthandler
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from .ab_channel import STACKS_ENV, Channel, ChannelClosed

if TYPE_CHECKING:
    from .document.measured import MeasuredTest


class Session(Protocol):
    """What a turn reads and sets of the plugin's session: the measured tests by node id, which each test's report
    fills in, and how the turn measures."""

    results: dict[str, MeasuredTest]
    timings_only: bool
    repeat: int | None

    def again(self, item: pytest.Item) -> None:
        """Ready a test for another call with its fixtures still set up."""


class ABWorker:
    """The pytest plugin of a warm side: it takes over the run loop."""

    def __init__(self, config: pytest.Config, channel: Channel, session: Session) -> None:
        """``session``: the plugin's (:class:`Session`)."""
        if config.getoption("numprocesses", None):
            raise pytest.UsageError("syncguard ab runs each side in one process: leave out -n (pytest-xdist)")
        self.channel = channel
        self.session = session
        self.held: pytest.Item | None = None
        """The test being held: set up and called, its teardown waiting for the A/B's replays of it."""
        self.hold_message: dict[str, Any] = {}
        self.pending: dict[str, Any] | None = None
        """A message read while a test was held, for the run loop."""
        self.stacks = None
        if os.environ.get(STACKS_ENV):
            self.stacks = open(os.environ[STACKS_ENV], "w", encoding="utf-8")  # noqa: SIM115 (open for the process)
            faulthandler.register(signal.SIGUSR2, file=self.stacks, all_threads=True)

    def pytest_unconfigure(self) -> None:
        if self.stacks is not None:
            faulthandler.unregister(signal.SIGUSR2)
            self.stacks.close()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        if session.testsfailed and not session.config.option.continue_on_collection_errors:
            raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
        self.channel.send({"ready": [item.nodeid for item in session.items], "timings_only": True, "hold": True})
        try:
            while True:
                message, self.pending = self.pending or self.channel.receive(), None
                if message.get("stop"):
                    break
                self.measure_as(message)
                if "hold" in message:
                    stopped = self.hold(session, message)
                elif "replay" in message:  # its test is no longer held (it failed, or pytest stopped)
                    self.channel.send({"done": message.get("turn", ""), "measured": 0, "stopped": ""})
                    continue
                else:
                    skip = set(message.get("skip", ()))
                    turn = [item for item in session.items if item.nodeid not in skip]
                    measured, stopped = self.run_turn(session, turn, Path(str(message["results"])))
                    self.channel.send({"done": message.get("turn", ""), "measured": measured, "stopped": stopped})
                if stopped:
                    break
        except ChannelClosed:  # the A/B is gone: finish as an interrupted run would
            pass
        return True

    def measure_as(self, message: dict[str, Any]) -> None:
        """How the next run measures, as ``message`` says."""
        self.session.timings_only = bool(message.get("timings_only", False))
        repeat = message.get("repeat")
        self.session.repeat = repeat if isinstance(repeat, int) and repeat >= 0 else None

    def run_turn(self, session: pytest.Session, turn: list[pytest.Item], path: Path) -> tuple[int, str]:
        """Run ``turn``'s tests once each and write their results to ``path``: (tests measured, why pytest
        stopped early or "")."""
        results = self.session.results
        for item in turn:
            results.pop(item.nodeid, None)
        stopped = ""
        if turn:
            _tear_down_to(session, turn[0])
        for index, item in enumerate(turn):
            # The last test of a turn is torn down to its first test's collectors, which the next turn is likely
            # to need again; never to a test itself, which pytest would then not set up again.
            following = turn[index + 1] if index + 1 < len(turn) else turn[0].parent
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=following)
            if stopped := _stopped(session):
                break
        return self.write(turn, path), stopped

    def hold(self, session: pytest.Session, message: dict[str, Any]) -> str:
        """Run the test ``message`` names through pytest's protocol, serving replays of it before its teardown
        (:meth:`pytest_runtest_teardown`); why pytest stopped, or ""."""
        nodeid = str(message["hold"])
        item = next((i for i in session.items if i.nodeid == nodeid), None)
        if item is None:
            self.channel.send({"done": message.get("turn", ""), "measured": 0, "stopped": ""})
            return ""
        self.session.results.pop(nodeid, None)
        _tear_down_to(session, item)
        self.held, self.hold_message = item, message
        try:
            # Torn down to its own collectors: the next test held, likely of the same module, keeps the model.
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=item.parent)
        finally:
            self.held = None
        return _stopped(session)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        if item is self.held:
            self.serve_replays(item)
        return (yield)

    def serve_replays(self, item: pytest.Item) -> None:
        """Answer the hold of ``item`` with its results, then call it again for each replay of it the A/B asks
        for; the first other message is kept for the run loop. A test not measured (its setup failed, it was
        skipped) or whose run stopped pytest is not held."""
        message = self.hold_message
        while True:
            measured = self.write([item], Path(str(message["results"])))
            _give_back_cache()
            stopped = _stopped(item.session)
            self.channel.send({"done": message.get("turn", ""), "measured": measured, "stopped": stopped})
            if not measured or stopped:
                return
            try:
                message = self.channel.receive()
            except ChannelClosed:
                self.pending = {"stop": True}
                return
            if message.get("replay") != item.nodeid:
                self.pending = message
                return
            self.measure_as(message)
            self.session.again(item)
            # The call phase as pytest runs it (its hooks: capture, the plugin's measurement), reported to the
            # plugin (which keeps the result) but not logged: a replay is no test of the session's own.
            call = pytest.CallInfo.from_call(
                lambda: item.ihook.pytest_runtest_call(item=item),
                when="call",
                reraise=(pytest.exit.Exception, KeyboardInterrupt),
            )
            item.ihook.pytest_runtest_makereport(item=item, call=call)

    def write(self, items: list[pytest.Item], path: Path) -> int:
        """The results of ``items`` measured in the last run, to ``path``; how many."""
        from .document import file as results_file

        measured = [self.session.results[item.nodeid] for item in items if item.nodeid in self.session.results]
        import torch

        results_file.write(path, measured, torch.__version__)
        return len(measured)


def _give_back_cache() -> None:
    """The allocator's cached segments back to the driver, while other processes take their turn on the GPU (the
    next measurement settles the allocator first anyway: :func:`.probes.memory.settle_allocator`)."""
    from .probes.memory import settle_allocator

    settle_allocator()


def _tear_down_to(session: pytest.Session, item: pytest.Item) -> None:
    """What is set up and ``item`` does not use goes first (pytest's own set-up stack: the only way to tear down to
    a given test outside its protocol)."""
    state: Any = getattr(session, "_setupstate", None)
    if state is not None:
        state.teardown_exact(item)


def _stopped(session: pytest.Session) -> str:
    """Why pytest was told to stop (``-x``, ``--maxfail``), or ""."""
    return str(session.shouldfail or session.shouldstop or "")
