"""What a warm side's later A/B round costs, and how a held test's device time moves from run to run.

A warm side's pytest (``--syncguard-ab-worker``) runs in this process while a thread plays ``syncguard ab``: for each
test given, it holds the test (set up, warm-up, the measured call), then replays it ``--replays`` times back to back,
then ``--spaced`` times more with ``--gap`` seconds between them. Per run it prints the round trip, the inclusive time
of the plugin's parts (wrapped here, not changed), and the run's device time per token:

    python devtools/replay_cost.py examples/test_strategies.py::test_speed[cuda_graph] --replays 8 --spaced 4

Options after ``--`` go to the side's pytest."""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

#: The parts timed: module, attribute path.
PARTS = [
    ("pytest_syncguard.probes.memory", "settle_allocator"),
    ("pytest_syncguard.capture", "CallCapture.of"),
    ("pytest_syncguard.capture", "CallCapture.result"),
    ("pytest_syncguard.guard", "GenerationRegion.recording"),
    ("pytest_syncguard.document.file", "write"),
    ("pytest_syncguard.document.file", "record"),
]
spent: dict[str, float] = defaultdict(float)


def _wrap(module: str, path: str) -> None:
    owner: Any = importlib.import_module(module)
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    function = original.__func__ if isinstance(original, (classmethod, staticmethod)) else original
    generator = name == "recording"

    if generator:  # a context manager: time from entry to exit

        @functools.wraps(function)
        def timed_cm(*args: Any, **kwargs: Any) -> Any:
            from contextlib import contextmanager

            @contextmanager
            def around() -> Any:
                began = time.perf_counter()
                with function(*args, **kwargs) as value:
                    yield value
                spent[path] += time.perf_counter() - began

            return around()

        replacement: Any = timed_cm
    else:

        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[path] += time.perf_counter() - began

        replacement = timed
    if isinstance(original, classmethod):
        replacement = classmethod(replacement)
    setattr(owner, name, replacement)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tests", nargs="+")
    parser.add_argument("--replays", type=int, default=8)
    parser.add_argument("--spaced", type=int, default=4)
    parser.add_argument("--gap", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=0, help="timed runs of each replay (--timed-runs)")
    args, pytest_args = parser.parse_known_args()
    for module, path in PARTS:
        _wrap(module, path)
    from pytest_syncguard.ab_channel import Channel

    to_worker, from_worker = os.pipe(), os.pipe()
    out = Path(tempfile.mkdtemp(prefix="replay-cost-"))
    rows: list[dict[str, Any]] = []

    def play() -> None:
        channel = Channel(from_worker[0], to_worker[1])
        channel.receive(900)
        for index, nodeid in enumerate(args.tests):
            runs = [("hold", 0.0)] + [("replay", 0.0)] * args.replays + [("replay", args.gap)] * args.spaced
            for number, (kind, gap) in enumerate(runs):
                time.sleep(gap)
                spent.clear()
                label = f"t{index}-{number}"
                message = {"turn": label, kind: nodeid, "results": str(out / f"{label}.json"),
                           "timings_only": kind == "replay", "repeat": args.repeat}  # fmt: skip
                began = time.perf_counter()
                channel.send(message)
                channel.receive(900)
                trip = time.perf_counter() - began
                tests = json.loads((out / f"{label}.json").read_text())["tests"]
                values = tests[0]["metrics"]["values"] if tests else {}
                spacing = f" +{gap:g}s" if gap else ""
                rows.append({"test": nodeid, "run": f"{kind}{spacing}", "trip_s": trip,
                             "gpu_us_per_token": values.get("gpu_us_per_token"), "seconds": values.get("seconds"),
                             **{k: round(v, 4) for k, v in spent.items()}})  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
        channel.send({"stop": True})

    thread = threading.Thread(target=play, daemon=True)
    thread.start()
    import pytest

    empty = out / "no-baselines"
    empty.mkdir()
    code = pytest.main([*args.tests, f"--syncguard-ab-worker={to_worker[0]},{from_worker[1]}", "--syncguard",
                        f"--syncguard-baselines={empty}", "-p", "no:cacheprovider", "-q", *pytest_args])  # fmt: skip
    thread.join(timeout=60)
    print(f"pytest exit {code}", file=sys.stderr)


if __name__ == "__main__":
    main()
