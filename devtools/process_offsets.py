"""How far apart warm processes of one code run a held test, and what closes the gap: N warm sides (``syncguard
ab``'s own, of this checkout) hold the test at once, then replay it round-robin; each process's median device time
per token, their spread, and the spread of one process's replays.

    python devtools/process_offsets.py "examples/test_strategies.py::test_speed[kv_cache]" --processes 4 --replays 4

Run it as it is, under ``taskset -c 2-5`` (every process on the same CPUs), or under ``PYTHONHASHSEED=0 setarch
-R`` (the same hash seed and no address randomization in every process), to see which of them the offsets follow.
Prints one JSON line."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from pytest_syncguard.gate.ab.sides import hold_at_once, warm_sides


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("test")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--replays", type=int, default=4)
    parser.add_argument("--label", default="default")
    parser.add_argument("--metric", default="gpu_us_per_token", help="(seconds on a CPU, with --repeat 2)")
    parser.add_argument("--repeat", type=int, default=0, help="timed runs per replay after the traced one")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="offsets-"))
    path = args.test.split("::")[0]
    began = time.monotonic()
    values: dict[str, list[float]] = {}
    with warm_sides({"p": Path.cwd()}, {"p": [path, "-q"]}, out, 600, print,
                    args.processes) as sides:  # fmt: skip
        hold_at_once({f"hold-{name}": side for name, side in sides.items()}, args.test, 600)  # type: ignore[misc]
        names = list(sides)
        for number in range(args.replays):
            turn = names[number % len(names) :] + names[: number % len(names)]  # each process leads in turn
            for name in turn:
                results = sides[name].replay(f"r{number}-{name}", args.test, 600, repeat=args.repeat)  # type: ignore[attr-defined]
                values.setdefault(name, []).append(results[args.test].metrics.values[args.metric])
    medians = {name: statistics.median(v) for name, v in values.items()}
    middle = statistics.median(medians.values())
    within = statistics.median(statistics.pstdev(v) / statistics.mean(v) for v in values.values())
    print(json.dumps({
        "label": args.label, "test": args.test, "seconds": round(time.monotonic() - began, 1),
        "per_process_us": {n: [round(x, 1) for x in v] for n, v in values.items()},
        "offsets_pct": {n: round(100 * (m / middle - 1), 2) for n, m in medians.items()},
        "spread_pct": round(100 * (max(medians.values()) - min(medians.values())) / middle, 2),
        "within_sd_pct": round(100 * within, 2),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
