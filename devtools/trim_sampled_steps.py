"""Cut a run kept by ``python -m bench.bench_sampled_timeline --keep DIR`` (the plugin's samples, step events and
CUPTI's device records of one region, on the GPU's clock) for a test data file: the samples from the region's start
to the idle ones after its marker kernel (what places the steps), and those of the first ``--ms`` milliseconds of
the judged part with the records that start in them: ``python devtools/trim_sampled_steps.py KEPT.json.gz
OUT.json.gz --ms 30``."""

from __future__ import annotations

import argparse
import gzip
import json
from itertools import accumulate

from pytest_syncguard.analysis import sampled
from pytest_syncguard.budgets import GuardOptions


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kept")
    parser.add_argument("out")
    parser.add_argument("--ms", type=float, default=30.0)
    parser.add_argument("--warmup-steps", type=int, default=GuardOptions().warmup_steps)
    args = parser.parse_args()
    with gzip.open(args.kept, "rt") as source:
        data = json.load(source)
    starts = list(accumulate(data["start_step_ns"], initial=data["first_ns"]))[1:]
    ends = [start + length for start, length in zip(starts, data["length_ns"], strict=True)]
    fractions = sampled.active_fractions(data["active"], data["elapsed"])
    events = sampled.StepEvents(data["marker_end_us"], tuple(data["steps_us"]), data["steps_from"])
    placed = sampled.place_steps(starts, ends, fractions, tuple(data["window_ns"]), events)
    if isinstance(placed, str):
        raise SystemExit(f"{args.kept}: {placed}")
    begin = placed.judged_from(args.warmup_steps)
    until = begin + int(args.ms * 1e6)
    marker = [i for i, start in enumerate(starts) if start <= placed.begin_ns + 10_000]  # and 10 us of idle after it
    judged = [i for i, (start, end) in enumerate(zip(starts, ends, strict=True)) if end > begin and start < until]
    rows = sorted(set(marker) | set(judged))
    kept_starts = [starts[i] for i in rows]
    kept = {
        **{key: data[key] for key in ("marker_end_us", "steps_us", "steps_from")},
        "window_ns": [data["window_ns"][0], until],
        "first_ns": kept_starts[0],
        "start_step_ns": [b - a for a, b in zip([kept_starts[0], *kept_starts[:-1]], kept_starts, strict=True)],
        "length_ns": [data["length_ns"][i] for i in rows],
        "active": [data["active"][i] for i in rows],
        "elapsed": [data["elapsed"][i] for i in rows],
        "device_ops_ns": [op for op in data["device_ops_ns"] if op[1] <= placed.begin_ns or begin <= op[0] < until],
    }
    with gzip.open(args.out, "wt", compresslevel=9) as sink:
        json.dump(kept, sink, separators=(",", ":"))
    print(f"{args.out}: {len(rows)} samples, {len(kept['device_ops_ns'])} device ops, {args.ms} ms judged")


if __name__ == "__main__":
    main()
