"""The history gate in simulation, from the H100 device times this repository recorded: for each of the 14 strategy
tests, 30 pushes to main, each on one of a pool of ``--hosts`` runners, a change of +3% merged on purpose at push 15,
then pull requests of 0%, +1%, +1.5%, +2% and +3% against the history, each on a runner of the pool (and, in its
own columns, on a runner the history has never seen), each judged by the gate's own code
(:meth:`pytest_syncguard.judge.baselines.Baseline.reference` of :func:`...history.baseline`, and
:func:`...comparison.compare`). Repeated over ``--trials`` seeds: how often each PR is a regression, the false alarms
over 30 unchanged PRs, the tolerance after 10 and 30 runs, and what the intended change does to its own PR and to
the PRs after its merge. CPU.

A test's device time on a run is its level x its runner's offset x the run's own noise. GPUs of one model differ
steadily (bench/data/nvidia-h100-80gb-hbm3.jsonl: 6 pushes recorded on two H100s, 2026-11-26, 3 each; cuda_graph's
hosts lie 1.1% apart, each within ±0.2%). The run's noise is the spread within hosts of that history (pooled, 4
degrees of freedom), at least ``--min-noise``; the runners' offsets make up the rest of the test's spread across
hosts, the larger of that history's and baselines/nvidia-h100-80gb-hbm3.json's (3-5 recordings on 3-4 H100 hosts,
2026-11-24/25). The pushes ran the 7 speed tests only: the 7 timeline tests (marked "assumed") are given the median
run noise of those 7, the rest of their committed spread as the runners' offsets.

Run from the repository root: ``python -m bench.bench_history_gate [--trials 200] [--hosts 4]``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from pathlib import Path
from typing import Any

from pytest_syncguard.judge import history as histories
from pytest_syncguard.judge.comparison import compare, tolerance_of
from pytest_syncguard.judge.history import History, Run, baseline
from pytest_syncguard.metrics import DEVICE_TIME, Metrics

ROOT = Path(__file__).parents[1]
SLUG = "nvidia-h100-80gb-hbm3"
PUSHES, MERGED_AT, STEP = 30, 15, 0.03
PRS = (0.0, 0.01, 0.015, 0.02, 0.03)
UNCHANGED_PRS = 30
NEW_HOST = "unseen"


def recorded_noise(min_noise: float) -> dict[str, tuple[float, float, float]]:
    """Per test with recorded device time: (median, relative SD within a host, relative SD of the hosts' offsets)."""
    committed = json.loads((ROOT / "baselines" / f"{SLUG}.json").read_text())["history"]
    pushed = histories.read(ROOT / "bench" / "data", SLUG)
    assert pushed is not None
    found, unpushed = {}, {}
    for nodeid, metrics in sorted(committed.items()):
        file_values = [r["value"] for r in metrics.get(DEVICE_TIME, [])]
        if len(file_values) < 2:
            continue
        middle = statistics.median(file_values)
        total = statistics.stdev(v / middle for v in file_values)
        by_host: dict[str, list[float]] = {}
        for run, value in pushed.series(nodeid, DEVICE_TIME):
            by_host.setdefault(run.host, []).append(value / middle)
        if not by_host:
            unpushed[nodeid] = (middle, total)
            continue
        degrees = sum(len(v) - 1 for v in by_host.values())
        within = math.sqrt(sum((x - statistics.fmean(v)) ** 2 for v in by_host.values() for x in v) / degrees)
        total = max(total, statistics.stdev(x for v in by_host.values() for x in v))
        noise = max(within, min_noise)
        found[nodeid] = (middle, noise, math.sqrt(max(total**2 - noise**2, 0.0)))
    # Tests the pushes did not run (the timeline tests): a run's noise is the median of the measured tests'.
    typical = statistics.median(noise for _, noise, _ in found.values())
    for nodeid, (middle, total) in unpushed.items():
        noise = min(max(typical, min_noise), max(total, min_noise))
        found[nodeid + " (assumed)"] = (middle, noise, math.sqrt(max(total**2 - noise**2, 0.0)))
    return found


def judge(history: History, nodeid: str, value: float, host: str) -> tuple[str, float]:
    """The PR's status, run on ``host``, and the tolerance it was judged within."""
    entry, spreads = baseline(history).reference(nodeid, host)
    comparison = compare(entry, Metrics({DEVICE_TIME: value}, {DEVICE_TIME: 5}), device="sim", file="history",
                         tolerance=None, spreads=spreads)  # fmt: skip
    (change,) = [c for c in comparison.changes if c.metric == DEVICE_TIME]
    return change.status, tolerance_of(DEVICE_TIME, None, spreads.get(DEVICE_TIME))


def trial(nodeid: str, middle: float, noise: float, offsets: float, hosts: int, rng: random.Random) -> dict[str, Any]:
    pool = [f"host{i}" for i in range(hosts)]
    offset = {h: rng.gauss(0, offsets) for h in [*pool, NEW_HOST]}

    def measured(level: float, host: str) -> float:
        return level * (1 + offset[host]) * (1 + rng.gauss(0, noise))

    runs: list[Run] = []
    found: dict[str, Any] = {"after_merge": []}
    for push in range(1, PUSHES + 1):
        host = rng.choice(pool)
        level = middle * (1 + STEP if push >= MERGED_AT else 1)
        if push == MERGED_AT:  # the intended change's own PR, against the history before its merge
            found["own_pr"] = judge(History("sim", tuple(runs)), nodeid, measured(level, host), host)[0]
        runs.append(Run(f"c{push}", "", host, {nodeid: {DEVICE_TIME: measured(level, host)}}))
        history = History("sim", tuple(runs))
        if push == 10:
            found["tolerance_10"] = judge(history, nodeid, middle, rng.choice(pool))[1]
            found["tolerance_10_new"] = judge(history, nodeid, middle, NEW_HOST)[1]
        if push > MERGED_AT:  # an unchanged PR after the merge, judged against the history so far
            host = rng.choice(pool)
            found["after_merge"].append(judge(history, nodeid, measured(level, host), host)[0])
    history = History("sim", tuple(runs))
    level = middle * (1 + STEP)
    found["tolerance_30"] = judge(history, nodeid, level, rng.choice(pool))[1]
    for delta in PRS:
        host = rng.choice(pool)
        found[f"pr_{delta}"] = judge(history, nodeid, measured(level * (1 + delta), host), host)[0]
        found[f"new_{delta}"] = judge(history, nodeid, measured(level * (1 + delta), NEW_HOST), NEW_HOST)[0]
    unchanged = (judge(history, nodeid, measured(level, h), h)[0] for h in rng.choices(pool, k=UNCHANGED_PRS))
    found["false_alarms"] = sum(status == "regression" for status in unchanged)
    found["false_alarms_new"] = sum(
        judge(history, nodeid, measured(level, NEW_HOST), NEW_HOST)[0] == "regression" for _ in range(UNCHANGED_PRS)
    )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--hosts", type=int, default=4, help="the runners of the GPU model that run the job")
    parser.add_argument("--min-noise", type=float, default=0.001, help="the least relative SD of a run on a host")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    print(f"{args.trials} trials per test, {PUSHES} pushes on {args.hosts} runners, +{STEP:.0%} merged at push "
          f"{MERGED_AT}, a run's noise at least ±{args.min_noise:.1%}; regressions per PR in % of trials, on a runner "
          f"of the pool (and on an unseen one)")  # fmt: skip
    header = ["test", "run noise", "hosts' SD", "tol@10", "tol@30", *(f"+{d:.1%}" for d in PRS), "FA/30",
              "own PR", "after merge", "unseen: tol@10", "+2.0%", "+3.0%", "FA/30"]  # fmt: skip
    print(" | ".join(header))
    alarms = {"pool": 0, "new": 0}
    for name, (middle, noise, offsets) in recorded_noise(args.min_noise).items():
        nodeid = name.removesuffix(" (assumed)")
        runs = [trial(nodeid, middle, noise, offsets, args.hosts, rng) for _ in range(args.trials)]

        def rate(key: str) -> str:
            return f"{100 * sum(r[key] == 'regression' for r in runs) / len(runs):.0f}%"  # noqa: B023

        def median(key: str) -> str:
            return f"{statistics.median(r[key] for r in runs):.2%}"  # noqa: B023

        pool_alarms = sum(r["false_alarms"] for r in runs)
        new_alarms = sum(r["false_alarms_new"] for r in runs)
        alarms["pool"] += pool_alarms
        alarms["new"] += new_alarms
        after = statistics.mean(sum(s == "regression" for s in r["after_merge"]) / len(r["after_merge"]) for r in runs)
        row = [name.split("::")[1], f"±{noise:.2%}", f"±{offsets:.2%}", median("tolerance_10"),
               median("tolerance_30"), *(rate(f"pr_{d}") for d in PRS), f"{pool_alarms / len(runs):.2f}",
               rate("own_pr"), f"{100 * after:.1f}%", median("tolerance_10_new"), rate("new_0.02"), rate("new_0.03"),
               f"{new_alarms / len(runs):.2f}"]  # fmt: skip
        print(" | ".join(row))
    total = args.trials * UNCHANGED_PRS * 14
    print(f"false alarms over all unchanged PRs: {alarms['pool']} of {total} on the pool's runners, "
          f"{alarms['new']} of {total} on an unseen runner")  # fmt: skip


if __name__ == "__main__":
    main()
