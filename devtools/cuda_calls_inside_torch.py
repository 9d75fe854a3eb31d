"""What the CUDA-call probe counts for torch calls whose host-blocking CUDA calls torch's probe does not see (a
kernel's own ``cudaMemcpy``, the caching allocator's ``cudaFree``), beside calls torch's probe counts. Needs CUDA.

Run from the repository root: ``python -m devtools.cuda_calls_inside_torch``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from pytest_syncguard.probes.cuda_calls import CUDA_CALLS
from pytest_syncguard.probes.syncs import PROBE, SyncRecorder


def counted(fn: Callable[[], object]) -> str:
    """The syncs recorded for one call of ``fn``, as kind (op) x count, and why CUDA calls were not counted."""
    torch.cuda.synchronize()
    recorder = SyncRecorder(on_device=True)
    with PROBE.recording(recorder), CUDA_CALLS.counting() as watch:
        fn()
    found = [f"{e.kind} ({e.op}) x {e.syncs}" for e in recorder.events]
    return ", ".join(found) or "none" + (f" (not counted: {watch.not_counted})" if watch.not_counted else "")


def main() -> None:
    print(f"machine: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    values = torch.randint(0, 5, (1000,), device="cuda")
    print("torch.mode:", counted(lambda: torch.mode(values)))
    print("nonzero:", counted(lambda: values.nonzero()))
    print(".item():", counted(lambda: values[0].item()))
    cached = torch.empty(1 << 26, device="cuda")
    del cached
    print("empty_cache with one cached block:", counted(torch.cuda.empty_cache))
    print("empty_cache with none:", counted(torch.cuda.empty_cache))
    matrix = torch.ones(64, 64, device="cuda")
    found: list[str] = []
    thread = threading.Thread(target=lambda: found.append(counted(lambda: matrix @ matrix)))
    thread.start()
    thread.join()
    print("a thread's first matrix product (torch creates its cuBLAS handle):", found[0])


if __name__ == "__main__":
    main()
