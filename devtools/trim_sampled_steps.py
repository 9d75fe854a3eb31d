"""Cut a run kept by ``python -m bench.bench_sampled_timeline --keep DIR`` (the plugin's samples, step events and
CUPTI's device records of one region, on the GPU's clock) for a test data file: the samples from the region's start
to the idle ones after its marker kernel (what places the steps), and those of the first ``--ms`` milliseconds of
the judged part with the records that start in them: ``python -m devtools.trim_sampled_steps KEPT.json.gz
OUT.json.gz --ms 30``."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from bench.bench_sampled_timeline import read_kept, write_kept
from pytest_syncguard.analysis import sampled
from pytest_syncguard.budgets import GuardOptions
from pytest_syncguard.probes.sampler import ACTIVE_CYCLES, ELAPSED_CYCLES


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kept")
    parser.add_argument("out")
    parser.add_argument("--ms", type=float, default=30.0)
    parser.add_argument("--warmup-steps", type=int, default=GuardOptions().warmup_steps)
    args = parser.parse_args()
    region, ops = read_kept(Path(args.kept))
    samples = region.samples
    fractions = sampled.active_fractions(samples.column(ACTIVE_CYCLES), samples.column(ELAPSED_CYCLES))
    assert region.events is not None
    placed = sampled.place_steps(
        samples.start_ns, samples.end_ns, fractions, region.window, region.events, samples.interval_ns
    )
    if isinstance(placed, str):
        raise SystemExit(f"{args.kept}: {placed}")
    begin = placed.judged_from(args.warmup_steps)
    until = begin + int(args.ms * 1e6)
    spans = list(zip(samples.start_ns, samples.end_ns, strict=True))
    marker = [i for i, (start, _) in enumerate(spans) if start <= placed.begin_ns + 10_000]  # and 10 us of idle after
    judged = [i for i, (start, end) in enumerate(spans) if end > begin and start < until]
    rows = sorted(set(marker) | set(judged))
    kept = replace(region, samples=samples.picked(rows), window=(region.window[0], until))
    kept_ops = [op for op in ops if op[1] <= placed.begin_ns or begin <= op[0] < until]
    write_kept(Path(args.out), kept, kept_ops)
    print(f"{args.out}: {len(rows)} samples, {len(kept_ops)} device ops, {args.ms} ms judged")


if __name__ == "__main__":
    main()
