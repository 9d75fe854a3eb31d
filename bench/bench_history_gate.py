"""The history gate in simulation, from the H100 device times this repository recorded and their spread across hosts:
for each of the 14 strategy tests, 30 pushes to main with host-to-host noise (6 hosts in turn), a change of +3%
merged on purpose at push 15, then pull requests of 0%, +1%, +1.5%, +2% and +3% against the history, each judged
by the gate's own code (:func:`pytest_syncguard.gate.history.baseline` and :func:`...comparison.compare`). Repeated
over ``--trials`` seeds: how often each PR is a regression, the false alarms over 30 unchanged PRs, the tolerance
after 10 and 30 runs, and what the intended change does to its own PR and to the PRs after its merge. CPU.

The noise of a test is the relative standard deviation of its recordings in baselines/nvidia-h100-80gb-hbm3.json
(3-5 recordings on 3-4 H100 hosts, 2026-11-24/25), or ``--min-noise`` where that is smaller (so few recordings can
understate it).

Run from the repository root: ``python -m bench.bench_history_gate [--trials 200]``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

from pytest_syncguard.gate.comparison import compare, tolerance_of
from pytest_syncguard.gate.history import History, Run, baseline
from pytest_syncguard.metrics import DEVICE_TIME, Metrics

BASELINE = Path(__file__).parents[1] / "baselines" / "nvidia-h100-80gb-hbm3.json"
HOSTS = [f"host{i}" for i in range(6)]
PUSHES, MERGED_AT, STEP = 30, 15, 0.03
PRS = (0.0, 0.01, 0.015, 0.02, 0.03)
UNCHANGED_PRS = 30


def recorded_noise() -> dict[str, tuple[float, float]]:
    """Per test with recorded device time: (median, relative SD) of its recordings."""
    data = json.loads(BASELINE.read_text())
    found = {}
    for nodeid, metrics in sorted(data["history"].items()):
        values = [r["value"] for r in metrics.get(DEVICE_TIME, [])]
        if len(values) >= 2:
            middle = statistics.median(values)
            found[nodeid] = (middle, statistics.stdev(v / middle for v in values))
    return found


def judge(history: History, nodeid: str, value: float) -> tuple[str, float]:
    """The PR's status and the tolerance it was judged within."""
    reference = baseline(history)
    spreads = reference.spreads(nodeid)
    comparison = compare(reference.tests[nodeid], Metrics({DEVICE_TIME: value}, {DEVICE_TIME: 5}), device="sim",
                         file="history", tolerance=None, spreads=spreads)  # fmt: skip
    (change,) = [c for c in comparison.changes if c.metric == DEVICE_TIME]
    return change.status, tolerance_of(DEVICE_TIME, None, spreads.get(DEVICE_TIME))


def trial(nodeid: str, middle: float, noise: float, rng: random.Random) -> dict[str, object]:
    def measured(level: float) -> float:
        return level * (1 + rng.gauss(0, noise))

    runs = []
    found: dict[str, object] = {}
    for push in range(1, PUSHES + 1):
        level = middle * (1 + STEP if push >= MERGED_AT else 1)
        if push == MERGED_AT:  # the intended change's own PR, against the history before its merge
            found["own_pr"] = judge(History("sim", tuple(runs)), nodeid, measured(middle * (1 + STEP)))[0]
        runs.append(Run(f"c{push}", "", HOSTS[push % len(HOSTS)], {nodeid: {DEVICE_TIME: measured(level)}}))
        history = History("sim", tuple(runs))
        if push == 10:
            found["tolerance_10"] = judge(history, nodeid, middle)[1]
        if push >= MERGED_AT:  # an unchanged PR after the merge, judged against the history so far
            found.setdefault("after_merge", []).append(judge(history, nodeid, measured(level))[0])  # type: ignore[union-attr]
    history = History("sim", tuple(runs))
    level = middle * (1 + STEP)
    found["tolerance_30"] = judge(history, nodeid, level)[1]
    for delta in PRS:
        found[f"pr_{delta}"] = judge(history, nodeid, measured(level * (1 + delta)))[0]
    unchanged = (judge(history, nodeid, measured(level))[0] for _ in range(UNCHANGED_PRS))
    found["false_alarms"] = sum(status == "regression" for status in unchanged)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--min-noise", type=float, default=0.002, help="the least relative SD a test is given")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    print(f"{args.trials} trials per test, {PUSHES} pushes, +{STEP:.0%} merged at push {MERGED_AT}, noise at least "
          f"±{args.min_noise:.1%}; regressions per PR in % of trials")  # fmt: skip
    header = ["test", "noise", "tol@10", "tol@30", *(f"+{d:.1%}" for d in PRS), "FA/30", "own PR", "after merge"]
    print(" | ".join(header))
    total_alarms = 0
    for nodeid, (middle, sd) in recorded_noise().items():
        noise = max(sd, args.min_noise)
        runs = [trial(nodeid, middle, noise, rng) for _ in range(args.trials)]
        rate = {d: 100 * sum(r[f"pr_{d}"] == "regression" for r in runs) / len(runs) for d in PRS}
        alarms = sum(int(r["false_alarms"]) for r in runs)  # type: ignore[call-overload]
        total_alarms += alarms
        own = 100 * sum(r["own_pr"] == "regression" for r in runs) / len(runs)
        after = 100 * statistics.mean(sum(s == "regression" for s in r["after_merge"]) / len(r["after_merge"])  # type: ignore[arg-type]
                                      for r in runs)  # fmt: skip
        row = [nodeid.split("::")[1], f"±{noise:.2%}",
               f"{statistics.median(float(r['tolerance_10']) for r in runs):.2%}",  # type: ignore[arg-type]
               f"{statistics.median(float(r['tolerance_30']) for r in runs):.2%}",  # type: ignore[arg-type]
               *(f"{rate[d]:.0f}%" for d in PRS), f"{alarms / len(runs):.2f}", f"{own:.0f}%",
               f"{after:.1f}%"]  # fmt: skip
        print(" | ".join(row))
    print(f"false alarms over all unchanged PRs: {total_alarms} of {args.trials * UNCHANGED_PRS * 14}")


if __name__ == "__main__":
    main()
