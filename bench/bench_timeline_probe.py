"""Overhead of the timeline probe: the tiny-Llama HF ``generate`` of 64 tokens bare and under the timeline
capture a ``--syncguard`` run with a GPU-timeline budget makes (CUDA activity and the plugin's annotations, export and
analysis not included), interleaved in one process, median of per-sample ratios with a 90% interval (as the
bench_timeline_capture's), and the same for two bare runs (the host's noise floor). Needs CUDA.

Run from the repository root: ``python -m bench.bench_timeline_probe [--samples N]``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

from bench.bench_timeline_capture import ratio_interval
from examples.models import tiny_llama
from pytest_syncguard.guard import SyncGuard
from pytest_syncguard.probes.timeline import TIMELINE


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=11)
    args = parser.parse_args()
    model = tiny_llama("cuda")
    prompt = torch.randint(1, 256, (1, 8), device="cuda")

    def generate() -> None:
        with torch.inference_mode():
            model.generate(prompt, max_new_tokens=64, min_new_tokens=64, do_sample=False)

    def bare() -> float:
        gc.collect()
        torch.cuda.synchronize()
        start = time.perf_counter()
        generate()
        torch.cuda.synchronize()
        return time.perf_counter() - start

    def profiled() -> float:
        guard = SyncGuard("bench")
        gc.collect()
        with TIMELINE.capturing() as files:
            torch.cuda.synchronize()
            start = time.perf_counter()
            with guard.generation(model=model):
                generate()
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
        files[0].unlink()
        return elapsed

    for _ in range(2):
        bare(), profiled()
    ratios, bare_times, profiled_times, noise = [], [], [], []
    for i in range(args.samples):
        if i % 2:
            p, b = profiled(), bare()
        else:
            b, p = bare(), profiled()
        bare_times.append(b)
        profiled_times.append(p)
        ratios.append(p / b)
        first, second = bare(), bare()
        noise.append(second / first if i % 2 else first / second)  # which one is "again" alternates, as above
    print(f"machine: {torch.cuda.get_device_name()}; torch {torch.__version__}; samples {args.samples}")
    print(
        f"bare median {statistics.median(bare_times) * 1e3:.1f} ms; "
        f"timeline probe median {statistics.median(profiled_times) * 1e3:.1f} ms"
    )
    print(
        f"probed/bare ratio: median {statistics.median(ratios):.3f} (90% interval {ratio_interval(ratios)}, min "
        f"{min(ratios):.3f}, max {max(ratios):.3f}); bare again/bare (noise floor): median "
        f"{statistics.median(noise):.3f} (90% interval {ratio_interval(noise)})"
    )


if __name__ == "__main__":
    main()
