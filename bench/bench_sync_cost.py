"""What the sync probe adds to one counted sync: a loop of ``x.sum().item()`` bare and instrumented,
interleaved in one process; the result is the median over pairs of the per-iteration difference, in µs.

With the syncs a workload makes per second, it predicts the probe's overhead independently of the noise of a
whole-generate timing. Run from the repository root: ``python -m bench.bench_sync_cost [--pairs N]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pytest_syncguard.probes.syncs import PROBE, SyncRecorder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=21)
    parser.add_argument("--iterations", type=int, default=2000)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    PROBE.prepare()
    x = torch.ones(4, device=device)

    def loop() -> float:
        start = time.perf_counter()
        for _ in range(args.iterations):
            x.sum().item()
        return (time.perf_counter() - start) / args.iterations * 1e6

    def instrumented() -> float:
        with PROBE.recording(SyncRecorder(on_device=device != "cpu")):
            return loop()

    for _ in range(3):
        loop()
        instrumented()
    bare, probed = [], []
    for i in range(args.pairs):
        if i % 2:
            probed.append(instrumented())
            bare.append(loop())
        else:
            bare.append(loop())
            probed.append(instrumented())
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"machine: {name}; torch {torch.__version__}; {args.pairs} pairs of {args.iterations} iterations")
    print(f"scalar reads and copies counted by the {PROBE.kernels}")
    print(f"bare {statistics.median(bare):.2f} us per .item(), instrumented {statistics.median(probed):.2f} us")
    cost = statistics.median(p - b for p, b in zip(probed, bare, strict=True))
    print(f"probe cost: median {cost:.2f} us per counted sync")


if __name__ == "__main__":
    main()
