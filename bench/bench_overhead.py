"""Instrumented/bare time ratio of a tiny-Llama HF ``generate`` of 64 tokens (the seed issue's benchmark).

"instrumented" is a measured region as a test makes it (``syncguard.generation``): the sync probe and the
counters that need no timeline capture (operators, torch.compile's records, on CUDA the allocator's driver
calls). "timed run" is a timed run of ``syncguard.measure()``, which counts no operators; "sync probe only" and
"op counter only" tell the two probes apart.

Bare and instrumented runs alternate in one process (with a second bare variant, whose ratio to the first is
the noise floor); the result is the median of the per-sample ratios, of wall time and of the main thread's
CPU time (which time stolen by other processes on a shared host does not inflate).
``--parts`` adds variants that tell the probe's costs apart: the probe with its Python kernels for scalar reads
and copies instead of the native ones (when those are built), no probe but a Python kernel that only
redispatches each scalar read (what any Python kernel costs), the probe without its dispatcher kernels, and on CUDA
without its copy_ kernel (the copy checks).
Run from the repository root: ``python -m bench.bench_overhead [--pairs N] [--runs K] [--parts]``; it prints
the machine it ran on.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import torch

from examples.models import tiny_llama
from pytest_syncguard import SyncGuard
from pytest_syncguard.guard import GenerationRegion
from pytest_syncguard.probes import ops, syncs
from pytest_syncguard.probes.syncs import PROBE, SyncRecorder

Sample = tuple[float, float]
"""Wall time and main-thread CPU time of one run, in seconds."""


def generate_run(device: str) -> Callable[[], Sample]:
    """One timed tiny-Llama generate of 64 tokens on ``device``."""
    model = tiny_llama(device)
    prompt = torch.randint(1, 256, (1, 8), device=device)

    def run() -> Sample:
        if device == "cuda":
            torch.cuda.synchronize()
        start, cpu_start = time.perf_counter(), time.thread_time()
        with torch.inference_mode():
            model.generate(prompt, max_new_tokens=64, min_new_tokens=64, do_sample=False)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, time.thread_time() - cpu_start

    return run


def instrumented(run: Callable[[], Sample], device: str, *, races: bool = False) -> Callable[[], Sample]:
    """``run`` inside a measured region, as a test measures it (``races``: with the race check, as under
    --syncguard on CUDA)."""
    guard = SyncGuard("bench", device=device, needs=frozenset({"races"}) if races else frozenset())

    def variant() -> Sample:
        with guard.generation(tokens=64):
            return run()

    return variant


def timed_run(run: Callable[[], Sample], device: str) -> Callable[[], Sample]:
    """``run`` as a timed run of ``syncguard.measure()``: a region that does not count operators."""

    def variant() -> Sample:
        with GenerationRegion(64, device, count_ops=False).recording():
            return run()

    return variant


def sync_probe_only(run: Callable[[], Sample], on_device: bool) -> Callable[[], Sample]:
    def variant() -> Sample:
        with PROBE.recording(SyncRecorder(on_device=on_device)):
            return run()

    return variant


def op_counter_only(run: Callable[[], Sample]) -> Callable[[], Sample]:
    def variant() -> Sample:
        with ops.counting([]):
            return run()

    return variant


def without(patches: Callable[[], Iterator[None]], run: Callable[[], Sample]) -> Callable[[], Sample]:
    """``run`` with parts of the probe switched off by ``patches`` (a generator: patch, yield, restore)."""
    scoped = contextmanager(patches)

    def variant() -> Sample:
        with scoped():
            return run()

    return variant


def no_kernels() -> Iterator[None]:
    with mock.patch.object(syncs, "CATALOGUE", ()):
        yield


def no_copy_checks() -> Iterator[None]:
    with mock.patch.object(syncs, "CATALOGUE", tuple(e for e in syncs.CATALOGUE if e.name != "copy_")):
        yield


def python_kernel() -> Iterator[None]:
    """The probe with its Python kernels for scalar reads and copies instead of the native ones."""
    with mock.patch.object(syncs.NATIVE, "load", return_value=None):
        yield


def pass_through_kernel() -> Iterator[None]:
    """Only a Python kernel that redispatches, on ``_local_scalar_dense``: the floor of the probe's design."""
    op = torch.ops.aten._local_scalar_dense.default
    after = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect)
    redispatch = op._handle.redispatch_boxed

    def kernel(keyset: Any, tensor: torch.Tensor) -> Any:
        return redispatch(keyset & after, tensor)

    library = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
    library.impl("_local_scalar_dense", kernel, "BackendSelect", with_keyset=True)  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        library._destroy()  # type: ignore[no-untyped-call]


def interleave(variants: dict[str, Callable[[], Sample]], pairs: int, runs: int) -> dict[str, list[Sample]]:
    """``pairs`` samples of each variant, each the sum of ``runs`` runs, in a rotating order."""
    for _ in range(3):
        for run in variants.values():
            run()
    samples: dict[str, list[Sample]] = {name: [] for name in variants}
    names = list(variants)
    for i in range(pairs):
        # Rotate the order so that no variant always runs first.
        for name in names[i % len(names) :] + names[: i % len(names)]:
            measured = [variants[name]() for _ in range(runs)]
            samples[name].append((sum(wall for wall, _ in measured), sum(cpu for _, cpu in measured)))
    return samples


def report(samples: dict[str, list[Sample]], runs: int) -> None:
    for clock, index in (("wall", 0), ("thread CPU", 1)):
        times = {name: [sample[index] for sample in values] for name, values in samples.items()}
        medians = ", ".join(f"{name} {statistics.median(t) / runs * 1e3:.1f} ms" for name, t in times.items())
        print(f"{clock} time per generate, medians: {medians}")
        for name, values in times.items():
            if name == "bare":
                continue
            ratios = sorted(a / b for a, b in zip(values, times["bare"], strict=True))
            quartiles = statistics.quantiles(ratios, n=4)
            label = f"{name}/bare" + (" (noise floor)" if name == "bare again" else "")
            print(
                f"  {label} ratio: median {statistics.median(ratios):.3f} "
                f"(quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}, min {ratios[0]:.3f}, max {ratios[-1]:.3f})"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=15, help="samples of each variant")
    parser.add_argument("--runs", type=int, default=3, help="generates per sample")
    parser.add_argument("--parts", action="store_true", help="add variants without parts of the probe")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    PROBE.prepare()
    run = generate_run(device)
    probed = sync_probe_only(run, on_device=device != "cpu")
    variants = {"bare": run, "instrumented": instrumented(run, device), "timed run": timed_run(run, device)}
    if device == "cuda":
        variants["instrumented, race check"] = instrumented(run, device, races=True)
    if args.parts:
        variants["sync probe only"] = probed
        variants["op counter only"] = op_counter_only(run)
        if syncs.NATIVE.unavailable is None:
            variants["Python kernel"] = without(python_kernel, probed)
        variants["pass-through kernel"] = without(pass_through_kernel, run)
        variants["no kernels"] = without(no_kernels, probed)
        if device == "cuda":
            variants["no copy checks"] = without(no_copy_checks, probed)
    variants["bare again"] = run
    samples = interleave(variants, args.pairs, args.runs)
    cpu = f"CPU ({platform.processor() or platform.machine()})"
    machine = torch.cuda.get_device_name() if device == "cuda" else cpu
    print(f"machine: {machine}; torch {torch.__version__}; samples {args.pairs} x {args.runs} generates")
    print(f"scalar reads and copies counted by the {PROBE.kernels}; operators {ops.unavailable() or 'counted'}")
    report(samples, args.runs)
    if device == "cuda":
        from pytest_syncguard.probes.races import RACES

        seen = RACES.seen
        instrumented(run, device, races=True)()
        print(f"race check: {RACES.seen - seen} non_blocking copies watched in {args.runs} instrumented generates")
    recorder = SyncRecorder(on_device=device != "cpu")
    with PROBE.recording(recorder):
        run()
    kinds = Counter(f"{event.op} ({event.kind})" for event in recorder.events for _ in range(event.syncs))
    print(f"syncs counted in one instrumented generate: {dict(kinds)}")


if __name__ == "__main__":
    main()
