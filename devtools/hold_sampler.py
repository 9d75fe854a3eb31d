"""Hold the PM sampler of a GPU until killed, as another profiler of the machine would (DCGM's profiling, Nsight
Compute): a pytest run beside it finds the sampler unavailable, and its default timeline falls back to the trace
and says why (how docs/howto/ci-gpu-runner.md's fallback was shown on an H100). ``python -m devtools.hold_sampler
[DEVICE]``; needs CUDA."""

from __future__ import annotations

import sys
import time

import torch

from pytest_syncguard.probes.pm_sampling import PmSampler
from pytest_syncguard.probes.sampler import ACTIVE_CYCLES, BUFFER_BYTES, ELAPSED_CYCLES, INTERVAL_NS


def main() -> None:
    device = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    torch.cuda.init()
    sampler = PmSampler((ACTIVE_CYCLES, ELAPSED_CYCLES), interval_ns=INTERVAL_NS, device=device,
                        buffer_bytes=BUFFER_BYTES)  # fmt: skip
    sampler.enable()
    print(f"holding the PM sampler of GPU {device}", flush=True)
    try:
        while True:
            time.sleep(1)
    finally:
        sampler.disable()


if __name__ == "__main__":
    main()
