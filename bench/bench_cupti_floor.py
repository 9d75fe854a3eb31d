"""What CUPTI itself costs a launch-bound loop, without torch.profiler: the floor under any capture that takes
kernel timestamps from CUPTI. Needs CUDA.

A minimal tracer (:class:`CuptiTracer`, CUPTI's activity API through ctypes: buffers handed out and counted,
records not decoded) enables only the CUPTI activity kinds it is given, from the start, and CUPTI is finalized
(detached) after each traced run, as torch.profiler's kineto does after a capture. The loops are those of
bench_timeline_capture.py: ``launch_loop`` (one in-place add on a one-element CUDA tensor per iteration: one
operator, one kernel launch) and ``op_loop`` (one view: one operator, no launch).

Variants, each timed next to a bare run of its own (which goes first alternates), the order rotating each round:
a second bare run (the noise floor), CUPTI with concurrent-kernel records only, with kernel and runtime-call
records, CUPTI attached with a kind enabled and disabled again before the run, syncguard's capture, and a bare
run right after a capture that left CUPTI attached (kineto's default) or detached it (syncguard's). It
prints, per loop and variant, the µs each adds per iteration (median paired difference, 90% signed-rank
interval) and the kernel records the tracer counted per run (every launch must have one).

Run from the repository root: ``python -m bench.bench_cupti_floor [--rounds N]``; it prints the machine.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from bench.bench_timeline_capture import ITERATIONS, LOOPS, discarded_capture, per_iteration, timed
from pytest_syncguard.probes import cupti
from pytest_syncguard.probes.timeline import TEARDOWN

#: CUpti_ActivityKind values (cupti_activity.h).
RUNTIME, CONCURRENT_KERNEL = 5, 10
_BUFFER_BYTES = 8 << 20
_REQUEST = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                            ctypes.POINTER(ctypes.c_size_t))  # fmt: skip
_COMPLETE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t,
                             ctypes.c_size_t)  # fmt: skip


class CuptiTracer:
    """CUPTI's activity API with the given kinds enabled: counts the records of each kind it receives."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.cupti = library
        self.buffers: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self.records: dict[int, int] = {}
        self._request = _REQUEST(self._requested)
        self._complete = _COMPLETE(self._completed)

    def _call(self, name: str, *args: Any) -> None:
        status = getattr(self.cupti, name)(*args)
        if status != 0:
            raise RuntimeError(f"{name}{args} returned CUPTI status {status}")

    def _requested(self, buffer: Any, size: Any, max_records: Any) -> None:
        memory = ctypes.create_string_buffer(_BUFFER_BYTES)
        self.buffers[ctypes.addressof(memory)] = memory
        buffer[0] = ctypes.addressof(memory)
        size[0] = _BUFFER_BYTES
        max_records[0] = 0

    def _completed(self, context: Any, stream: Any, buffer: int, size: int, valid: int) -> None:
        record = ctypes.c_void_p()
        while self.cupti.cuptiActivityGetNextRecord(ctypes.c_void_p(buffer), ctypes.c_size_t(valid),
                                                    ctypes.byref(record)) == 0:  # fmt: skip
            kind = ctypes.c_uint32.from_address(record.value).value  # every record begins with its kind
            self.records[kind] = self.records.get(kind, 0) + 1
        self.buffers.pop(buffer, None)

    @contextmanager
    def tracing(self, kinds: tuple[int, ...], *, disable_before: bool = False, detach: bool = True) -> Iterator[None]:
        """CUPTI attached with ``kinds`` enabled over the block (``disable_before``: enabled and disabled again
        before it: what an attached CUPTI costs with nothing enabled); detached afterwards unless not ``detach``."""
        self.records.clear()
        self._call("cuptiActivityRegisterCallbacks", self._request, self._complete)
        for kind in kinds:
            self._call("cuptiActivityEnable", kind)
        if disable_before:
            for kind in kinds:
                self._call("cuptiActivityDisable", kind)
        try:
            yield
        finally:
            torch.cuda.synchronize()
            for kind in kinds if not disable_before else ():
                self._call("cuptiActivityDisable", kind)
            self._call("cuptiActivityFlushAll", 1)  # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
            if detach:
                self._call("cuptiFinalize")


def _capture_one_launch() -> None:
    with discarded_capture():
        torch.zeros(1, device="cuda").add_(1)


@contextmanager
def after_a_capture(*, attached: bool) -> Iterator[None]:
    """A bare run right after a capture of one launch, which left CUPTI attached (``TEARDOWN_CUPTI=0``, kineto's
    default) or detached it (syncguard's): what a capture costs the tests after it. CUPTI left attached is
    detached afterwards by a capture of syncguard's, so that kineto's state stays its own."""
    if attached:
        os.environ[TEARDOWN] = "0"
        try:
            _capture_one_launch()
        finally:
            del os.environ[TEARDOWN]
    else:
        _capture_one_launch()
    yield
    if attached:
        _capture_one_launch()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_cupti_floor needs CUDA")
    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    with discarded_capture():  # loads CUPTI into the process, as a first capture does
        x.add_(1)
    library = cupti.library()
    if library is None:
        raise SystemExit("no libcupti found in this process")
    tracer = CuptiTracer(library)
    variants: dict[str, Callable[[], Any]] = {
        "bare again": nullcontext,
        "kernel records": lambda: tracer.tracing((CONCURRENT_KERNEL,)),
        "kernel + runtime records": lambda: tracer.tracing((CONCURRENT_KERNEL, RUNTIME)),
        "attached, none enabled": lambda: tracer.tracing((CONCURRENT_KERNEL,), disable_before=True),
        "syncguard capture": discarded_capture,
        "after a capture, attached": lambda: after_a_capture(attached=True),
        "after a capture, detached": lambda: after_a_capture(attached=False),
    }
    print(f"machine: {torch.cuda.get_device_name()}; torch {torch.__version__}; {ITERATIONS} iterations per run, "
          f"{args.rounds} rounds, variants interleaved; {TEARDOWN}={os.environ.get(TEARDOWN, '(unset)')}")  # fmt: skip
    for name, loop in LOOPS.items():
        bare: list[float] = []
        differences: dict[str, list[float]] = {v: [] for v in variants}
        kernels: dict[str, list[int]] = {v: [] for v in variants}
        for variant in variants.values():  # warm-up
            with variant():
                loop(None, x, 0, 0)
        tracer.records.clear()
        names = list(variants)
        for r in range(args.rounds):
            for i, variant in enumerate(names[r % len(names) :] + names[: r % len(names)]):
                run = functools.partial(loop, None, x, 0, 0)
                times = {}
                for first_bare in (True, False) if (r + i) % 2 == 0 else (False, True):
                    if first_bare:
                        times["bare"] = timed(run)
                    else:
                        with variants[variant]():
                            times[variant] = timed(run)
                        kernels[variant].append(tracer.records.get(CONCURRENT_KERNEL, 0))
                        tracer.records.clear()
                bare.append(times["bare"])
                differences[variant].append(times[variant] - times["bare"])
        print(
            f"{name}: bare {statistics.median(bare) / ITERATIONS * 1e6:.2f} us per iteration; added per "
            "iteration, us (90% interval), kernel records per run:"
        )
        for variant in variants:
            added, records = per_iteration(differences[variant]), statistics.median(kernels[variant])
            print(f"  {variant:<26} {added:<24} {records:.0f}", flush=True)


if __name__ == "__main__":
    main()
