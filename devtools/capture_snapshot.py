"""Record the allocator history of a torch.cat loop on CUDA and write it as a snapshot (test data for
tests/test_memory_snapshot.py). Run on a GPU machine: ``python devtools/capture_snapshot.py OUT.pickle``."""

from __future__ import annotations

import sys

import torch


def grow(steps: int) -> torch.Tensor:
    out = torch.empty(8, 0, 4096, device="cuda")
    for _ in range(steps):
        out = torch.cat([out, torch.randn(8, 1, 4096, device="cuda")], dim=1)
    return out


def main() -> None:
    torch.zeros(1, device="cuda")
    torch.cuda.memory._record_memory_history(max_entries=10_000, stacks="python")
    try:
        grow(24)
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(sys.argv[1])
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


if __name__ == "__main__":
    main()
