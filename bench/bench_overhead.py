"""Instrumented/bare time ratio of a tiny-Llama HF ``generate`` of 64 tokens (the seed issue's benchmark).

Bare and instrumented runs alternate in one process (with a second bare variant, whose ratio to the first is
the noise floor); the result is the median of the per-sample ratios.
Run from the repository root: ``python -m bench.bench_overhead [--pairs N] [--runs K]``; it prints the
machine it ran on.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from examples.models import tiny_llama
from pytest_syncguard.probes.syncs import PROBE, SyncRecorder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=15, help="samples of each variant")
    parser.add_argument("--runs", type=int, default=3, help="generates per sample")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = tiny_llama(device)
    prompt = torch.randint(1, 256, (1, 8), device=device)

    def generate() -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(prompt, max_new_tokens=64, min_new_tokens=64, do_sample=False)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    def instrumented() -> float:
        recorder = SyncRecorder(on_device=device != "cpu")
        with PROBE.recording(recorder):
            return generate()

    variants = {"bare": generate, "instrumented": instrumented, "bare again": generate}
    for _ in range(3):
        for run in variants.values():
            run()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(args.pairs):
        # Rotate the order so that no variant always runs first; each sample sums --runs generates.
        names = list(variants)[i % 3 :] + list(variants)[: i % 3]
        for name in names:
            times[name].append(sum(variants[name]() for _ in range(args.runs)))
    cpu = f"CPU ({platform.processor() or platform.machine()})"
    machine = torch.cuda.get_device_name() if device == "cuda" else cpu
    print(f"machine: {machine}; torch {torch.__version__}; samples {args.pairs} x {args.runs} generates")
    for name, samples in times.items():
        print(f"{name} median {statistics.median(samples) / args.runs * 1e3:.1f} ms per generate")
    for label, over in (("instrumented/bare", "instrumented"), ("bare again/bare (noise floor)", "bare again")):
        ratios = [a / b for a, b in zip(times[over], times["bare"], strict=True)]
        low, high = min(ratios), max(ratios)
        print(f"{label} ratio: median {statistics.median(ratios):.3f} (min {low:.3f}, max {high:.3f})")


if __name__ == "__main__":
    main()
