"""Instrumented/bare time ratio of a tiny-Llama HF ``generate`` of 64 tokens (the seed issue's benchmark).

Bare and instrumented runs alternate in one process (with a second bare variant, whose ratio to the first is
the noise floor); the result is the median of the per-sample ratios, of wall time and of the main thread's
CPU time (which time stolen by other processes on a shared host does not inflate).
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

    def generate() -> tuple[float, float]:
        if device == "cuda":
            torch.cuda.synchronize()
        start, cpu_start = time.perf_counter(), time.thread_time()
        with torch.inference_mode():
            model.generate(prompt, max_new_tokens=64, min_new_tokens=64, do_sample=False)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, time.thread_time() - cpu_start

    def instrumented() -> tuple[float, float]:
        recorder = SyncRecorder(on_device=device != "cpu")
        with PROBE.recording(recorder):
            return generate()

    variants = {"bare": generate, "instrumented": instrumented, "bare again": generate}
    for _ in range(3):
        for run in variants.values():
            run()
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu_times: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(args.pairs):
        # Rotate the order so that no variant always runs first; each sample sums --runs generates.
        names = list(variants)[i % 3 :] + list(variants)[: i % 3]
        for name in names:
            runs = [variants[name]() for _ in range(args.runs)]
            times[name].append(sum(wall for wall, _ in runs))
            cpu_times[name].append(sum(cpu for _, cpu in runs))
    cpu = f"CPU ({platform.processor() or platform.machine()})"
    machine = torch.cuda.get_device_name() if device == "cuda" else cpu
    print(f"machine: {machine}; torch {torch.__version__}; samples {args.pairs} x {args.runs} generates")
    for clock, samples_of in (("wall", times), ("thread CPU", cpu_times)):
        medians = ", ".join(
            f"{name} {statistics.median(samples) / args.runs * 1e3:.1f} ms" for name, samples in samples_of.items()
        )
        print(f"{clock} time per generate, medians: {medians}")
        for label, over in (("instrumented/bare", "instrumented"), ("bare again/bare (noise floor)", "bare again")):
            ratios = sorted(a / b for a, b in zip(samples_of[over], samples_of["bare"], strict=True))
            quartiles = statistics.quantiles(ratios, n=4)
            print(
                f"  {label} ratio: median {statistics.median(ratios):.3f} "
                f"(quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}, min {ratios[0]:.3f}, max {ratios[-1]:.3f})"
            )


if __name__ == "__main__":
    main()
