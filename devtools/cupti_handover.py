"""Whether a profiler capture keeps its last kernels (judged by its sentinel, ``reliability.sentinel_problem``) when
the CUDA-call probe is used inside it (its subscription refused; a new probe loading CUPTI there), and when taken
after the probe subscribed to CUPTI (and after the PM sampler ran): per variant, a capture, then what the variant
does, then a capture. Needs CUDA.

Run from the repository root: ``python -m devtools.cupti_handover``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pytest_syncguard.analysis import trace_file
from pytest_syncguard.analysis.reliability import sentinel_problem
from pytest_syncguard.probes import cupti
from pytest_syncguard.probes.cuda_calls import CUDA_CALLS, CudaCallProbe
from pytest_syncguard.probes.sampler import SAMPLER
from pytest_syncguard.probes.timeline import TIMELINE

_regions = iter(range(1, 1 << 30))


def work() -> None:
    x = torch.ones(1 << 20, device="cuda")
    for _ in range(300):
        x.mul_(1.0001)
    torch.cuda.synchronize()


def capture(inside: Callable[[], None] = work) -> str:
    with TIMELINE.per_region() as files, TIMELINE.region_capture():
        inside()
    try:
        return sentinel_problem(trace_file.load(files[0])) or "kept"
    finally:
        for path in files:
            path.unlink(missing_ok=True)


def subscribed() -> None:
    with CUDA_CALLS.counting():
        work()


def finalized() -> None:
    subscribed()
    torch.cuda.synchronize()
    print("    cuptiFinalize:", cupti.load().cuptiFinalize())


def sampled() -> None:
    with SAMPLER.arming(), SAMPLER.region(next(_regions)):
        work()


def sampled_subscribed() -> None:
    with SAMPLER.arming(), SAMPLER.region(next(_regions)), CUDA_CALLS.counting():
        work()


def sampled_subscribed_finalized() -> None:
    sampled_subscribed()
    torch.cuda.synchronize()
    print("    cuptiFinalize:", cupti.load().cuptiFinalize())


VARIANTS: dict[str, Callable[[], None]] = {
    "nothing": work,
    "subscribed": subscribed,
    "subscribed, finalized": finalized,
    "sampled": sampled,
    "sampled and subscribed": sampled_subscribed,
    "sampled and subscribed, finalized": sampled_subscribed_finalized,
}


def counted_inside() -> None:
    """A region inside the capture: its subscription is refused (the capture holds CUPTI)."""
    with CUDA_CALLS.counting() as watch:
        work()
    print(f"    inside the capture: {watch.not_counted}")


def loaded_inside() -> None:
    """A probe whose first use (CUPTI loaded, its callbacks looked up) is inside the capture."""
    with CudaCallProbe().counting() as watch:
        work()
    print(f"    a new probe inside the capture: {watch.not_counted}")


def main() -> None:
    print(f"machine: {torch.cuda.get_device_name()}; torch {torch.__version__}", flush=True)
    work()
    for name, inside in (("a new probe inside", loaded_inside), ("a region inside", counted_inside)):
        for attempt in range(3):
            print(
                f"{name:<36} #{attempt}: that capture {capture(inside)}, the capture after it {capture()}", flush=True
            )
    for name, between in VARIANTS.items():
        for attempt in range(3):
            first = capture()
            between()
            print(f"{name:<36} #{attempt}: first capture {first}, the capture after it {capture()}", flush=True)


if __name__ == "__main__":
    main()
