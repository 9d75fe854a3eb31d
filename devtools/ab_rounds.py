"""A held A/B's device time per token, round by round, from its output folder: what each pair of processes measured,
small enough to keep as test data (tests/data/ab_pairs/), and each test judged again from it.

    python devtools/ab_rounds.py OUT/ab --head-results OUT/results-SLUG.json --gpu GPU-933f6650 > rounds.json

``--head-results``: the suite's results that were the head's first round (``syncguard ab --head-results``). The
rounds are read from the round files (``t3-round2-base-2.json``), so an A/B stopped before its report still gives
them. Prints JSON: ``{"gpu": ..., "tests": {node id: [[round, pair, base us, head us], ...]}}``."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from pytest_syncguard.gate.ab.plan import first_round_of, pair_of_round
from pytest_syncguard.gate.ab.sides import read_results

ROUND = re.compile(r"t(\d+)-round(\d+)-(base|head)(?:-(\d+))?\.json")
METRIC = "gpu_us_per_token"


def rounds(folder: Path, head_results: Path | None, processes: int = 2) -> dict[str, list[list[float]]]:
    """Per test, its rounds measured on both sides: [round, pair, base, head]."""
    sides: dict[int, dict[int, dict[str, float]]] = {}
    names: dict[int, str] = {}
    for path in folder.glob("t*-round*-*.json"):
        found = ROUND.fullmatch(path.name)
        if found is None:
            continue
        test, number, side = int(found[1]), int(found[2]), found[3]
        for nodeid, measured in read_results(path).items():
            if METRIC in measured.metrics.values:
                names[test] = nodeid
                sides.setdefault(test, {}).setdefault(number, {})[side] = measured.metrics.values[METRIC]
    suite = first_round_of(head_results).tests if head_results is not None else {}
    table = {}
    for test, by_round in sorted(sides.items()):
        nodeid = names[test]
        if 1 in by_round and "head" not in by_round[1] and nodeid in suite:
            by_round[1]["head"] = suite[nodeid].metrics.values[METRIC]
        table[nodeid] = [[n, pair_of_round(n, processes), round(v["base"], 2), round(v["head"], 2)]
                         for n, v in sorted(by_round.items()) if {"base", "head"} <= set(v)]  # fmt: skip
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--head-results", type=Path)
    parser.add_argument("--gpu", default="", help="the GPU it ran on, kept with the rounds")
    args = parser.parse_args()
    print(json.dumps({"gpu": args.gpu, "metric": METRIC, "tests": rounds(args.folder, args.head_results)}, indent=1))


if __name__ == "__main__":
    main()
