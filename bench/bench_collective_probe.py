"""Host time per decode step of examples/test_tensor_parallel.py's loop, bare and with the collective probe
recording, under torchrun (2 ranks): what the probe costs a host-bound tensor-parallel loop. Medians of 7 runs of
32 steps, the two variants interleaved; rank 0 prints.

    torchrun --nproc-per-node 2 bench/bench_collective_probe.py [HIDDEN BATCH]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.argv += [] if len(sys.argv) > 2 else ["2048", "8"]
os.environ["SYNCGUARD_TP_HIDDEN"], os.environ["SYNCGUARD_TP_BATCH"] = sys.argv[1], sys.argv[2]

from examples import test_tensor_parallel as tp  # noqa: E402  (the shapes above first)
from pytest_syncguard.probes.collectives import PROBE  # noqa: E402


def main() -> None:
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    model = tp.ShardedMLP(torch.device("cuda", local))
    x = torch.randn(tp.BATCH, tp.HIDDEN, device="cuda", dtype=torch.bfloat16)
    times: dict[str, list[float]] = {"bare": [], "probe": []}
    for round_ in range(8):
        for name in times:
            calls: list[str] = []
            dist.barrier()
            torch.cuda.synchronize()
            start = time.perf_counter()
            if name == "probe":
                with PROBE.recording(calls):
                    tp.decode(model, x)
            else:
                tp.decode(model, x)
            torch.cuda.synchronize()
            if round_:  # the first round warms up
                times[name].append((time.perf_counter() - start) / tp.STEPS * 1e6)
    if dist.get_rank() == 0:
        bare, probe = statistics.median(times["bare"]), statistics.median(times["probe"])
        print(f"hidden {tp.HIDDEN} batch {tp.BATCH} on {torch.cuda.get_device_name()}: us per step, medians of 7: "
              f"bare {bare:.0f}, probe {probe:.0f} (x{probe / bare:.3f}); runs bare {[round(t) for t in times['bare']]}"
              f" probe {[round(t) for t in times['probe']]}")  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
