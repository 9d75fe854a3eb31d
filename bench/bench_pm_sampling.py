"""CUPTI's PM sampler (the source of ``--syncguard-timeline=sampled``) against unprofiled runs and against the
kernels CUPTI records, on the decoding strategies (GPT-2 124M, batch 32, prompt 16, 100 new tokens). Needs CUDA.

It prints, in this order:

1. the sampler's busy/idle metrics on this GPU, and the metric pairs it samples (``--pairs``: ``grc`` is the
   plugin's, ``gr__compute_cycles_active`` over ``gr__cycles_elapsed``; ``sm``, ``gr``, ``gpc``, ``tpc`` others);
2. the sampler's clock against the host's (``time.time_ns()``): a ~1 ms sleep kernel between two host stamps;
3. ``--agreement``: per strategy, one run sampled while CUPTI records every kernel, memcpy and memset (a minimal
   ctypes tracer, on the same GPU clock as the samples): busy time and gaps of both, per metric pair
   (``--keep DIR`` writes each run's samples and device records: the test data of
   tests/test_sampled_timeline.py, through devtools/trim_samples.py);
4. per strategy (``--strategies``; ``launch_loop`` prints µs added per launch), rounds in which a sampled run and
   a second bare run each run next to a bare run of their own (which one goes first alternates): wall-time
   ratios with 90% signed-rank intervals; ``--capture`` then does the same for syncguard's trace capture;
5. whether the sampler can be enabled after a capture that finalized CUPTI, and what brings it back.

Run from the repository root: ``python -m bench.bench_pm_sampling [--pairs grc] [--rounds N] [--interval-ns N]
[--strategies a,b] [--agreement a,b] [--capture] [--keep DIR]``.
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import json
import re
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import torch

from bench.bench_cupti_floor import CuptiTracer
from bench.bench_timeline_capture import (
    LOOPS,
    NEW_TOKENS,
    discarded_capture,
    per_iteration,
    ratio_interval,
    timed,
    workload,
)
from examples.strategies import STRATEGIES
from pytest_syncguard.analysis import gaps, sampled
from pytest_syncguard.analysis.trace_file import GpuOp
from pytest_syncguard.probes import cupti
from pytest_syncguard.probes.cupti import CuptiError
from pytest_syncguard.probes.pm_sampling import PmSampler, Samples, base_metrics

#: Pairs of (active cycles, elapsed cycles) that may tell a busy device from an idle one.
PAIRS = {
    "sm": ("sm__cycles_active.max", "sm__cycles_elapsed.max"),
    "gr": ("gr__cycles_active.sum", "gr__cycles_elapsed.max"),
    "gpc": ("gpc__cycles_active.max", "gpc__cycles_elapsed.max"),
    "tpc": ("tpc__cycles_active.max", "tpc__cycles_elapsed.max"),
    "grc": ("gr__compute_cycles_active.sum", "gr__cycles_elapsed.max"),
}
ANALYSED = 1
#: Room for a 1.5 s run sampled every microsecond.
MAX_SAMPLES = 2_000_000
#: The sampler's hardware buffer (device memory): a 1.7 s run of seven metrics every microsecond overflowed 512 MiB.
BUFFER_BYTES = 3 << 30
#: CUPTI activity kinds whose records are device work (cupti_activity.h): memcpy, memset, concurrent kernel.
DEVICE_KINDS = (1, 2, 10)
#: ``CUPTI_ACTIVITY_MEMCPY_KIND_DTOD``: a memcpy record's ``copyKind`` (the byte after its kind) for a copy
#: between two places in device memory, which the runtime runs as a kernel.
MEMCPY_DTOD = 8
#: How a device record is labelled (:attr:`DeviceRecords.ops`), and the trace event each label stands for, so that
#: the one definition of busy (:func:`pytest_syncguard.analysis.gaps.occupies`) reads records as it reads traces.
RECORD_LABELS = {
    "kernel": ("kernel", "kernel"),
    "dtod": ("gpu_memcpy", "Memcpy DtoD (Device -> Device)"),
    "copy": ("gpu_memcpy", "Memcpy"),
    "memset": ("gpu_memset", "Memset"),
}


@contextmanager
def sampling(
    metrics: tuple[str, ...], interval_ns: int, collected: list[Samples], evaluate: bool = True
) -> Iterator[None]:
    """Sample the block with a sampler of these metrics, enabled on first use and kept (:func:`disable_all`)."""
    key = (metrics, interval_ns)
    if key not in SAMPLERS:
        for other in list(SAMPLERS):  # one sampler per device at a time
            SAMPLERS.pop(other).disable()
        sampler = PmSampler(metrics, interval_ns=interval_ns, buffer_bytes=BUFFER_BYTES)
        began = time.perf_counter()
        sampler.enable()
        SETUP.append(time.perf_counter() - began)
        SAMPLERS[key] = sampler
    with SAMPLERS[key].sampling(collected, max_samples=LIMITS["samples"], evaluate=evaluate):
        yield
        DECODE.append(time.perf_counter())
    DECODE[-1] = time.perf_counter() - DECODE[-1]


#: The most samples decoded per sampled run (--max-samples).
LIMITS = {"samples": MAX_SAMPLES}
#: Seconds each sampled block took to decode (and evaluate) its samples after it ended.
DECODE: list[float] = []


SAMPLERS: dict[tuple[tuple[str, ...], int], PmSampler] = {}


def disable_all() -> None:
    for key in list(SAMPLERS):
        SAMPLERS.pop(key).disable()


SETUP: list[float] = []


def pairs_of(metrics: tuple[str, ...]) -> list[tuple[str, str]]:
    return [p for p in PAIRS.values() if p[0] in metrics and p[1] in metrics]


def fractions(samples: Samples, pair: tuple[str, str]) -> list[float]:
    return sampled.active_fractions(samples.column(pair[0]), samples.column(pair[1]))


def choose_metrics(interval_ns: int, chosen: list[str]) -> tuple[str, ...] | None:
    try:
        names = base_metrics()
    except CuptiError as exc:
        print(f"base metrics: {exc}")
        names = []
    shown = [n for n in names if re.search(r"^[a-z]+__(compute_)?cycles_(active|elapsed)$", n)]
    print(f"base metrics: {len(names)}; busy/idle candidates: {', '.join(shown)}", flush=True)
    everything = tuple(dict.fromkeys(m for c in chosen for m in PAIRS[c] if m.split(".")[0] in names))
    for metrics in [everything, *(PAIRS[c] for c in chosen)]:
        try:
            with sampling(tuple(metrics), interval_ns, []):
                torch.cuda._sleep(1000)  # type: ignore[no-untyped-call]
                torch.cuda.synchronize()
        except CuptiError as exc:
            disable_all()
            print(f"sampler {metrics} at {interval_ns} ns: {exc}", flush=True)
            continue
        print(f"sampling {', '.join(metrics)} every {interval_ns} ns; enable took {SETUP[-1] * 1e3:.0f} ms", flush=True)
        return tuple(metrics)
    return None


def clock_check(metrics: tuple[str, ...], interval_ns: int) -> None:
    for _ in range(3):
        collected: list[Samples] = []
        with sampling(metrics, interval_ns, collected):
            torch.cuda.synchronize()
            host_before = time.time_ns()
            torch.cuda._sleep(2_000_000)  # type: ignore[no-untyped-call]
            torch.cuda.synchronize()
            host_after = time.time_ns()
        samples = collected[0]
        busy = [i for i, f in enumerate(fractions(samples, pairs_of(metrics)[0])) if f >= 0.5]
        if not busy:
            print(f"clock: no active sample among {samples.completed}", flush=True)
            continue
        first, last = samples.start_ns[busy[0]], samples.end_ns[busy[-1]]
        print(
            f"clock: {samples.completed} samples; sleep kernel active {(last - first) / 1e3:.1f} us, began "
            f"{(first - host_before) / 1e3:+.1f} us after the host stamp before it, ended "
            f"{(last - host_after) / 1e3:+.1f} us after the host stamp after it",
            flush=True,
        )


class DeviceRecords(CuptiTracer):
    """The tracer of bench_cupti_floor keeping each device op's (start, end, label), GPU timestamps (ns), which the
    sampler's clock shares, and in :attr:`kinds` its activity kind too; CUPTI is not finalized afterwards (that
    would end the sampler's profiler too)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        super().__init__(library)
        self.ops: list[tuple[int, int, str]] = []
        """(start, end, label) of each device op: a :data:`RECORD_LABELS` key."""
        self.kinds: list[tuple[int, int, int]] = []
        """(kind, start, end) of each device op: ``DEVICE_KINDS``."""

    def _completed(self, context: Any, stream: Any, buffer: int, size: int, valid: int) -> None:
        record = ctypes.c_void_p()
        while self.cupti.cuptiActivityGetNextRecord(ctypes.c_void_p(buffer), ctypes.c_size_t(valid),
                                                    ctypes.byref(record)) == 0:  # fmt: skip
            kind = ctypes.c_uint32.from_address(record.value).value
            if kind in DEVICE_KINDS:  # start at 16, end at 24 in all
                times = (ctypes.c_uint64 * 2).from_address(record.value + 16)
                self.ops.append((times[0], times[1], _label(kind, record.value)))
                self.kinds.append((kind, times[0], times[1]))
        self.buffers.pop(buffer, None)

    def recording(self) -> AbstractContextManager[None]:
        """Device ops of the block; CUPTI stays attached (finalizing it would end the sampler's profiler too)."""
        self.ops.clear()
        self.kinds.clear()
        return self.tracing(DEVICE_KINDS, detach=False)


def _label(kind: int, address: int) -> str:
    if kind == 10:
        return "kernel"
    if kind == 2:
        return "memset"
    return "dtod" if ctypes.c_uint8.from_address(address + 4).value == MEMCPY_DTOD else "copy"


def as_gpu_op(start_ns: int, end_ns: int, label: str, origin_ns: int = 0) -> GpuOp:
    """A device record as the trace analysis reads an op (µs from ``origin_ns``)."""
    category, name = RECORD_LABELS[label]
    return GpuOp((start_ns - origin_ns) / 1e3, (end_ns - origin_ns) / 1e3, 0, name, category, None)


def truth(ops: Sequence[tuple[int, int, str]]) -> tuple[float, list[float]]:
    """Busy time and gaps (us) of device records (ns), by the one definition: the union of the records that occupy
    the GPU (kernels, device-to-device copies), idle stretches under a microsecond busy. Times are taken from the
    first record: as µs since 1970 (about 1.8e15) a float holds them only to a quarter of a microsecond, which moved
    thousands of no_cache's gaps across the microsecond (docs/explanation/timeline.md)."""
    records = sorted(ops)
    origin = records[0][0] if records else 0
    busy, found = gaps.merge([op for op in (as_gpu_op(*r, origin) for r in records) if gaps.occupies(op)])
    return busy, [g.duration for g in found]


def agreement(
    name: str, fn: Callable[[], object], metrics: tuple[str, ...], interval_ns: int, records: DeviceRecords,
    keep: Path | None,
) -> None:  # fmt: skip
    """One run sampled with CUPTI's device-op records beside it (same GPU clock): busy time and gaps of both."""
    collected: list[Samples] = []
    with records.recording(), sampling(metrics, interval_ns, collected):
        torch.cuda.synchronize()
        fn()
        torch.cuda.synchronize()
    ops = sorted(records.ops)
    busy, true_gaps = truth(ops)
    window = (ops[0][0], max(op[1] for op in ops))
    samples = collected[0]
    stat = gaps.gap_stat
    print(
        f"{name:<16} {len(ops)} device ops, span {(window[1] - window[0]) / 1e3:.0f} us, busy {busy:.0f} us "
        f"({busy * 1e3 / (window[1] - window[0]):.3f}); gaps max {stat(true_gaps, 'max'):.1f} p99 "
        f"{stat(true_gaps, 'p99'):.1f} p90 {stat(true_gaps, 'p90'):.1f}, >=5us {sum(g >= 5 for g in true_gaps)}, "
        f">=50us {sum(g >= 50 for g in true_gaps)}; {samples.completed} samples, overflow {samples.overflow}, "
        f"decoded in {DECODE[-1]:.1f} s",
        flush=True,
    )
    for pair in pairs_of(metrics):
        found = sampled.analyze(samples.start_ns, samples.end_ns, fractions(samples, pair), window)
        spread = " ".join(f"{q} {stat(found.gaps_us, q):.1f}" for q in ("max", "p99", "p90"))
        print(
            f"    {pair[0]:<30} busy {found.busy_us:.0f} us ({found.busy_us / busy - 1:+.2%}); gaps {spread}"
            f", >=5us {sum(g >= 5 for g in found.gaps_us)}, >=50us {sum(g >= 50 for g in found.gaps_us)}",
            flush=True,
        )
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        bounds = enumerate(zip(samples.start_ns, samples.end_ns, strict=True))
        inside = [i for i, (a, b) in bounds if b > window[0] and a < window[1]]
        with gzip.open(keep / f"{name}.samples.json.gz", "wt") as sink:
            json.dump(
                {"metrics": samples.metrics, "interval_ns": interval_ns,
                 "start_ns": [samples.start_ns[i] for i in inside], "end_ns": [samples.end_ns[i] for i in inside],
                 "values": [[column[i] for column in samples.columns] for i in inside], "device_ops_ns": ops},
                sink,
            )  # fmt: skip


def overhead(
    name: str, fn: Callable[[], object], metrics: tuple[str, ...] | None, interval_ns: int, rounds: int,
    others: list[str],
) -> None:  # fmt: skip
    walls: dict[str, list[float]] = {"bare": [], **{o: [] for o in others}}
    ratios: dict[str, list[float]] = {k: [] for k in walls}
    differences: dict[str, list[float]] = {k: [] for k in walls}
    busy: list[float] = []
    device_us: list[float] = []

    def run(variant: str, analysed: bool) -> None:
        if variant == "sampled":
            assert metrics is not None
            collected: list[Samples] = []
            with sampling(metrics, interval_ns, collected, evaluate=analysed):
                walls[variant].append(timed(fn))
            if analysed:
                s = collected[0]
                found = sampled.analyze(s.start_ns, s.end_ns, fractions(s, pairs_of(metrics)[0]))
                busy.append(found.busy_fraction)
                device_us.append(found.busy_us)
        elif variant == "capture":
            with discarded_capture():
                walls[variant].append(timed(fn))
        else:
            walls[variant].append(timed(fn))

    for variant in ["bare", *others]:
        run(variant, analysed=False)  # warm-up
    for values in walls.values():
        values.clear()
    for r in range(rounds):
        for i, variant in enumerate(others[r % len(others) :] + others[: r % len(others)]):
            for side in ("bare", variant) if (r + i) % 2 == 0 else (variant, "bare"):
                run(side, analysed=side == "sampled" and len(busy) < ANALYSED)
            ratios[variant].append(walls[variant][-1] / walls["bare"][-1])
            differences[variant].append(walls[variant][-1] - walls["bare"][-1])
    median = statistics.median
    line = f"{name:<16} bare {median(walls['bare']) * 1e3:7.1f} ms"
    for variant in others:
        line += f" | {variant} {median(ratios[variant]):.3f} ({ratio_interval(ratios[variant])})"
    if name in LOOPS:
        line += " | added per iteration, us: " + ", ".join(f"{v} {per_iteration(differences[v])}" for v in others)
    elif busy:
        line += f" | sampled busy {median(busy):.3f} (first pair, whole run)"
    print(line, flush=True)


def recovery(metrics: tuple[str, ...], interval_ns: int) -> None:
    """Whether the sampler can be enabled after a capture that finalized CUPTI, and what brings it back."""
    with discarded_capture():
        torch.zeros(1, device="cuda").add_(1)
    library = cupti.library()
    attempts: list[tuple[str, Callable[[], object]]] = [
        ("right after", lambda: None),
        ("after cuptiGetTimestamp", lambda: library.cuptiGetTimestamp(ctypes.byref(ctypes.c_uint64()))),
        ("after cuptiActivityFlushAll", lambda: library.cuptiActivityFlushAll(0)),
        ("after enable/disable of kernel records", lambda: (library.cuptiActivityEnable(10),
                                                             library.cuptiActivityDisable(10))),
        ("after a second capture", lambda: discarded_capture().__enter__()),
    ]  # fmt: skip
    for label, action in attempts:
        if library is not None:
            action()
        try:
            with sampling(metrics, interval_ns, []):
                torch.cuda._sleep(1000)  # type: ignore[no-untyped-call]
                torch.cuda.synchronize()
        except CuptiError as exc:
            SAMPLERS.clear()  # its enable failed and undid itself
            print(f"recovery {label}: {exc}", flush=True)
            continue
        print(f"recovery {label}: the sampler works", flush=True)
        return


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--interval-ns", type=int, default=1000)
    parser.add_argument("--agreement-interval-ns", type=int, default=2000)
    parser.add_argument("--pairs", default="grc", help=f"metric pairs ({', '.join(PAIRS)}); the first times runs")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--agreement", default="", help="strategies run sampled with CUPTI's device records beside")
    parser.add_argument("--capture", action="store_true", help="also time syncguard's capture (last: it ends CUPTI)")
    parser.add_argument("--keep", type=Path, default=None)
    parser.add_argument("--max-samples", type=int, default=MAX_SAMPLES, help="decoded per sampled run")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_pm_sampling needs CUDA")
    LIMITS["samples"] = args.max_samples
    model, prompt, eos = workload()
    print(f"machine: {torch.cuda.get_device_name()}; torch {torch.__version__}; {args.rounds} rounds", flush=True)
    metrics = choose_metrics(args.agreement_interval_ns, args.pairs.split(","))
    names = [n for n in args.strategies.split(",") if n]
    every = {**STRATEGIES, **LOOPS}
    runs = {n: (lambda s=every[n]: s(model, prompt, NEW_TOKENS, eos)) for n in every}
    if metrics is not None:
        clock_check(metrics, args.agreement_interval_ns)
        library = cupti.library() or cupti.load()
        records = DeviceRecords(library)
        for name in [n for n in args.agreement.split(",") if n]:
            runs[name]()  # warm-up
            try:
                agreement(name, runs[name], metrics, args.agreement_interval_ns, records, args.keep)
            except CuptiError as exc:
                print(f"{name:<16} agreement: {exc}", flush=True)
        timed_metrics = PAIRS[args.pairs.split(",")[0]]
        for name in names:
            try:
                overhead(name, runs[name], timed_metrics, args.interval_ns, args.rounds, ["sampled", "bare again"])
            except CuptiError as exc:
                print(f"{name:<16} sampled: {exc}", flush=True)
        print(f"sampler enable: {', '.join(f'{t * 1e3:.0f}' for t in SETUP)} ms", flush=True)
        disable_all()
    if args.capture:
        for name in names:
            overhead(name, runs[name], None, args.interval_ns, args.rounds, ["capture", "bare again"])
    if metrics is not None:
        recovery(PAIRS[args.pairs.split(",")[0]], args.interval_ns)
        disable_all()


if __name__ == "__main__":
    main()
