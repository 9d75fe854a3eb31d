"""Cut a run kept by ``python -m bench.bench_pm_sampling --keep DIR`` (PM samples and CUPTI's device-op records of
one run, on the GPU's clock) to a window of ``--ms`` milliseconds that holds the run's widest gap, for a test data
file: ``python devtools/trim_samples.py KEPT.samples.json.gz OUT.json.gz --ms 60``."""

from __future__ import annotations

import argparse
import gzip
import json


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kept")
    parser.add_argument("out")
    parser.add_argument("--ms", type=float, default=60.0)
    args = parser.parse_args()
    with gzip.open(args.kept, "rt") as source:
        data = json.load(source)
    ops = sorted(data["device_ops_ns"])
    widest, end = (0, ops[0][0]), ops[0][1]
    for start, stop in ops:
        if start - end > widest[0]:
            widest = (start - end, end)
        end = max(end, stop)
    begin = max(ops[0][0], widest[1] - int(args.ms * 1e6 / 3))
    window = (begin, begin + int(args.ms * 1e6))
    kept_ops = [(max(a, window[0]), min(b, window[1])) for a, b in ops if b > window[0] and a < window[1]]
    rows = [
        (a, b, [int(v) for v in values])
        for a, b, values in zip(data["start_ns"], data["end_ns"], data["values"], strict=True)
        if b > window[0] and a < window[1]
    ]
    trimmed = {
        "metrics": data["metrics"], "interval_ns": data["interval_ns"], "start_ns": [r[0] for r in rows],
        "end_ns": [r[1] for r in rows], "values": [r[2] for r in rows], "device_ops_ns": kept_ops,
    }  # fmt: skip
    with gzip.open(args.out, "wt", compresslevel=9) as sink:
        json.dump(trimmed, sink, separators=(",", ":"))
    print(f"{args.out}: {len(rows)} samples, {len(kept_ops)} device ops, window {args.ms} ms")


if __name__ == "__main__":
    main()
