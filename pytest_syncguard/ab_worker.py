"""A warm side of ``syncguard ab``: one pytest process that runs its selected tests once per turn, as the A/B tells
it over :class:`.ab_channel.Channel`, and writes each turn's results to the file the turn names.

The process starts, imports and collects once; between turns it keeps what the turn's first test's collectors set
up (module and session fixtures: the model, say), and tears each test down as pytest would. What it says:

- ``{"ready": [node ids collected], "timings_only": true}`` once collected (it can run a turn's timed runs only);
- ``{"done": turn, "measured": n, "stopped": why}`` after each turn (``stopped`` empty unless pytest was told
  to stop: ``-x``, ``--maxfail``).

What it is told: ``{"turn": label, "skip": [node ids], "results": path, "timings_only": bool, "repeat": n or
null}`` (the turn measures timed runs only, as ``--syncguard-timings-only``; ``repeat`` of them per measure(), as
``--syncguard-repeat``), or ``{"stop": true}``; the A/B's end of the pipe closing stops it too."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from .ab_channel import Channel, ChannelClosed

if TYPE_CHECKING:
    from .document.measured import MeasuredTest


class Session(Protocol):
    """What a turn reads and sets of the plugin's session: the measured tests by node id, which each test's report
    fills in, and how the turn measures."""

    results: dict[str, MeasuredTest]
    timings_only: bool
    repeat: int | None


class ABWorker:
    """The pytest plugin of a warm side: it takes over the run loop."""

    def __init__(self, config: pytest.Config, channel: Channel, session: Session) -> None:
        """``session``: the plugin's (:class:`Session`)."""
        if config.getoption("numprocesses", None):
            raise pytest.UsageError("syncguard ab runs each side in one process: leave out -n (pytest-xdist)")
        self.channel = channel
        self.session = session

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        if session.testsfailed and not session.config.option.continue_on_collection_errors:
            raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
        self.channel.send({"ready": [item.nodeid for item in session.items], "timings_only": True})
        try:
            while True:
                message = self.channel.receive()
                if message.get("stop"):
                    break
                skip = set(message.get("skip", ()))
                turn = [item for item in session.items if item.nodeid not in skip]
                self.session.timings_only = bool(message.get("timings_only", False))
                repeat = message.get("repeat")
                self.session.repeat = repeat if isinstance(repeat, int) and repeat >= 0 else None
                measured, stopped = self.run_turn(session, turn, Path(str(message["results"])))
                self.channel.send({"done": message.get("turn", ""), "measured": measured, "stopped": stopped})
                if stopped:
                    break
        except ChannelClosed:  # the A/B is gone: finish as an interrupted run would
            pass
        return True

    def run_turn(self, session: pytest.Session, turn: list[pytest.Item], path: Path) -> tuple[int, str]:
        """Run ``turn``'s tests once each and write their results to ``path``: (tests measured, why pytest
        stopped early or "")."""
        from .document import file as results_file

        results = self.session.results
        for item in turn:
            results.pop(item.nodeid, None)
        stopped = ""
        if turn:
            # What the previous turn left set up and this one's first test does not use goes first (pytest's own
            # set-up stack: the only way to tear down to a given test outside its protocol).
            state: Any = getattr(session, "_setupstate", None)
            if state is not None:
                state.teardown_exact(turn[0])
        for index, item in enumerate(turn):
            # The last test of a turn is torn down to its first test's collectors, which the next turn is likely
            # to need again; never to a test itself, which pytest would then not set up again.
            following = turn[index + 1] if index + 1 < len(turn) else turn[0].parent
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=following)
            if session.shouldfail or session.shouldstop:
                stopped = str(session.shouldfail or session.shouldstop)
                break
        measured = [results[item.nodeid] for item in turn if item.nodeid in results]
        import torch

        results_file.write(path, measured, torch.__version__)
        return len(measured), stopped
