"""Which PM-sampling metrics see the device's copies and memsets, which the sampled timeline's compute-engine
metric (``gr__compute_cycles_active``) reads as idle. Needs CUDA.

1. Lists the base metrics PM sampling offers on this GPU (``--out``/base_metrics.txt).
2. Runs a sequence of isolated device ops (each between a device sync and a host pause): a sleep kernel, copies
   device to device, host to device and back (pinned and pageable, large and small), memsets through the driver
   (``cuMemsetD8Async``) and torch's ``zero_``, while CUPTI records every kernel, memcpy and memset with its kind
   on the samples' clock (:class:`DeviceRecords`). Candidate metrics (those of :data:`UNITS`) are sampled beside the
   compute pair, several per configuration where one pass holds them. Per candidate it prints the largest value
   of an idle sample and, per op kind, the share of the samples inside that op's records reading above it.
3. ``--loops``: the strategies run sampled with the candidates that saw every copy and memset (at most
   ``--take``) and the compute pair, the records beside; ``--keep-ms`` of each (from ``--skip-ms`` into the run)
   is written to ``--out`` for analysis on a machine without a GPU.

4. ``--analyse FILES``: from kept loops, on any machine: per kind, the copies and memsets no kernel overlaps, their
   lengths, and how many of them each sampled metric saw.

Run from the repository root: ``python -m bench.bench_copy_metrics --out DIR [--loops a,b]``, then
``python -m bench.bench_copy_metrics --analyse DIR/loop_*.json.gz``.
"""

from __future__ import annotations

import argparse
import bisect
import ctypes
import gzip
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.bench_pm_sampling import DeviceRecords, disable_all, sampling
from bench.bench_timeline_capture import NEW_TOKENS, workload
from examples.strategies import STRATEGIES
from pytest_syncguard.probes import cupti
from pytest_syncguard.probes.cupti import CuptiError
from pytest_syncguard.probes.pm_sampling import Samples, base_metrics
from pytest_syncguard.probes.sampler import ACTIVE_CYCLES, ELAPSED_CYCLES

KIND_NAMES = {1: "memcpy", 2: "memset", 10: "kernel"}
#: Units whose counters may move while a copy engine works (host interface, copy engines, memory, front end,
#: links), in the order they are tried.
UNITS = ("pcie", "ce", "lce", "pce", "copy", "host", "hub", "dram", "fbpa", "fbp", "fe", "lts", "ltc", "nvlrx",
         "nvltx", "nvl", "sys", "gr", "xbar", "mmu", "pda", "gpu")  # fmt: skip
PAUSE_S = 3e-4


def isolated_ops() -> list[tuple[str, Callable[[], object]]]:
    """Device ops of each kind, to be run one at a time with the device idle before and after."""
    driver = ctypes.CDLL("libcuda.so.1")
    stream = torch.cuda.current_stream().cuda_stream
    big = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    other = torch.empty_like(big)
    pinned = torch.empty(16 << 20, dtype=torch.uint8, pin_memory=True)
    pageable = torch.zeros(256, dtype=torch.uint8)

    def memset(count: int) -> Callable[[], object]:
        return lambda: driver.cuMemsetD8Async(ctypes.c_uint64(big.data_ptr()), 0, ctypes.c_size_t(count),
                                              ctypes.c_void_p(stream))  # fmt: skip

    return [
        ("sleep kernel 20k cycles", lambda: torch.cuda._sleep(20_000)),  # type: ignore[no-untyped-call]
        ("memcpy d2d 64 MiB", lambda: other.copy_(big)),
        ("memcpy d2d 4 KiB", lambda: other[:4096].copy_(big[:4096])),
        ("memset driver 64 MiB", memset(64 << 20)),
        ("memset driver 4 KiB", memset(4096)),
        ("memcpy h2d 16 MiB pinned", lambda: big[: 16 << 20].copy_(pinned, non_blocking=True)),
        ("memcpy d2h 16 MiB pinned", lambda: pinned.copy_(big[: 16 << 20], non_blocking=True)),
        ("memcpy h2d 256 B pageable", lambda: big[:256].copy_(pageable)),
        ("torch zero_ 64 MiB", lambda: big.zero_()),
    ]


def run_isolated(ops: list[tuple[str, Callable[[], object]]], repeats: int) -> list[str]:
    labels = []
    for _ in range(repeats):
        for label, op in ops:
            torch.cuda.synchronize()
            time.sleep(PAUSE_S)
            op()
            torch.cuda.synchronize()
            labels.append(label)
    time.sleep(PAUSE_S)
    return labels


def sample(metrics: tuple[str, ...], block: Callable[[], object]) -> Samples:
    """The block sampled every microsecond with ``metrics`` (bench_pm_sampling's sampler, kept enabled for them)."""
    collected: list[Samples] = []
    with sampling(metrics, 1000, collected):
        block()
    return collected[0]


def overlapping(samples: Samples, start: int, end: int) -> list[int]:
    return [i for i, (a, b) in enumerate(zip(samples.start_ns, samples.end_ns, strict=True)) if b > start and a < end]


def judge(samples: Samples, metric: str, records: list[tuple[int, int, int]]) -> tuple[float, dict[str, float]]:
    """The largest value of an idle sample (5 µs or more from every record) and, per record kind, the share of
    samples inside its records that read above it."""
    column = samples.column(metric)
    near = set()
    for _, start, end in records:
        near.update(overlapping(samples, start - 5000, end + 5000))
    idle = [column[i] for i in range(len(column)) if i not in near]
    ceiling = max(idle, default=0.0)
    seen: dict[str, list[bool]] = {}
    for kind, start, end in records:
        inside = overlapping(samples, start, end)
        seen.setdefault(KIND_NAMES[kind], []).extend(column[i] > ceiling for i in inside)
    return ceiling, {k: sum(v) / len(v) for k, v in seen.items() if v}


def explore(candidates: list[str], group: int, records: DeviceRecords, out: Path) -> list[str]:
    """Sample the isolated ops with each group of candidates; returns the candidates that saw every copy and
    memset sample (and the raw samples of groups where one saw them, as JSON under ``out``)."""
    ops = isolated_ops()
    kept: list[dict[str, Any]] = []
    seeing = []
    pending = [candidates[i : i + group] for i in range(0, len(candidates), group)]
    while pending:
        names = pending.pop(0)
        metrics = (ACTIVE_CYCLES, ELAPSED_CYCLES, *(f"{n}.sum" for n in names))
        labels: list[str] = []
        try:
            with records.recording():
                samples = sample(metrics, lambda seen=labels: seen.extend(run_isolated(ops, 3)))
        except CuptiError as exc:
            if len(names) > 1:
                pending[:0] = [[n] for n in names]
            else:
                print(f"  {names[0]:<50} cannot be sampled: {exc}", flush=True)
            continue
        found = sorted(records.kinds, key=lambda r: r[1])
        interesting = False
        for metric in metrics[2:]:
            ceiling, shares = judge(samples, metric, found)
            line = " ".join(f"{k} {v:.0%}" for k, v in sorted(shares.items()))
            print(f"  {metric:<50} idle <= {ceiling:.4g}; inside records above it: {line}", flush=True)
            interesting = interesting or max(shares.get("memcpy", 0), shares.get("memset", 0)) >= 0.5
            if all(shares.get(k, 0) >= 0.8 for k in ("memcpy", "memset")):
                seeing.append(metric)
        if interesting:  # the raw samples of groups in which a metric saw copies or memsets
            rows = [list(row) for row in zip(*samples.columns, strict=True)]
            kept.append({"metrics": metrics, "start_ns": list(samples.start_ns), "end_ns": list(samples.end_ns),
                         "values": rows, "records": found, "labels": labels})  # fmt: skip
        compute = judge(samples, ACTIVE_CYCLES, found)
        print(f"  ({ACTIVE_CYCLES}: idle <= {compute[0]:.4g}; {compute[1]})", flush=True)
    with gzip.open(out / "isolated.json.gz", "wt") as sink:
        json.dump(kept, sink)
    return seeing


def loops(names: list[str], metrics: tuple[str, ...], records: DeviceRecords, args: argparse.Namespace) -> None:
    model, prompt, eos = workload()
    for name in names:
        STRATEGIES[name](model, prompt, NEW_TOKENS, eos)  # warm-up
        torch.cuda.synchronize()
        with records.recording():
            samples = sample(metrics, lambda n=name: STRATEGIES[n](model, prompt, NEW_TOKENS, eos))
        found = sorted(records.kinds, key=lambda r: r[1])
        begin = found[0][1] + int(args.skip_ms * 1e6)
        until = begin + int(args.keep_ms * 1e6)
        rows = [i for i, a in enumerate(samples.start_ns) if begin <= a < until]
        kinds: dict[str, int] = {}
        for kind, _, _ in found:
            kinds[KIND_NAMES[kind]] = kinds.get(KIND_NAMES[kind], 0) + 1
        print(f"{name}: {len(samples.start_ns)} samples, records {kinds}; kept {len(rows)} samples", flush=True)
        data = {
            "metrics": metrics,
            "start_ns": [samples.start_ns[i] for i in rows],
            "end_ns": [samples.end_ns[i] for i in rows],
            "values": [[column[i] for column in samples.columns] for i in rows],
            "records": [r for r in found if r[2] > begin and r[1] < until],
        }
        with gzip.open(args.out / f"loop_{name}.json.gz", "wt") as sink:
            json.dump(data, sink)


def unseen(path: Path, threshold: float) -> None:
    """From a kept loop (no GPU needed): per copy and memset kind, the records no kernel overlaps, their lengths,
    and how many of them each sampled metric saw (compute: a sample at least 2% active; the others: a sample above
    ``threshold``)."""
    with gzip.open(path, "rt") as source:
        data = json.load(source)
    metrics, starts, ends = data["metrics"], data["start_ns"], data["end_ns"]
    records = [r for r in data["records"] if r[1] >= starts[0] and r[2] <= ends[-1]]
    kernels = sorted((a, b) for kind, a, b in records if kind == 10)
    kernel_starts = [a for a, _ in kernels]
    columns = list(zip(*data["values"], strict=True))
    compute = [min(1.0, a / e) if e else 0.0 for a, e in zip(columns[0], columns[1], strict=True)]
    print(f"{path.name}: {len(records)} records in {(ends[-1] - starts[0]) / 1e6:.0f} ms, {len(kernels)} kernels")
    for kind in (1, 2):
        alone = []
        for _, a, b in (r for r in records if r[0] == kind):
            last = bisect.bisect_left(kernel_starts, b)
            if not any(kernels[i][1] > a for i in range(max(0, last - 64), last)):
                alone.append((a, b))
        seen = dict.fromkeys(["compute", *(m.split(".")[0] for m in metrics[2:])], 0)
        for a, b in alone:
            inside = range(bisect.bisect_right(ends, a), bisect.bisect_left(starts, b))
            seen["compute"] += any(compute[i] >= 0.02 for i in inside)
            for index, metric in enumerate(metrics[2:], start=2):
                seen[metric.split(".")[0]] += any(columns[index][i] > threshold for i in inside)
        lengths = sorted((b - a) / 1e3 for a, b in alone)
        spread = f"{statistics.median(lengths):.2f} (max {lengths[-1]:.2f}) us" if lengths else "-"
        total = sum(r[0] == kind for r in records)
        print(f"  {KIND_NAMES[kind]}: {total}, {len(alone)} with no kernel beside them, median {spread}; seen by "
              + ", ".join(f"{m} {n}" for m, n in seen.items()))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--analyse", nargs="*", type=Path, help="kept loops to analyse (no GPU needed)")
    parser.add_argument("--threshold", type=float, default=3e4, help="bytes per sample above the idle noise")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--group", type=int, default=6)
    parser.add_argument("--most", type=int, default=150, help="candidates tried at most")
    parser.add_argument("--loops", default="")
    parser.add_argument("--take", type=int, default=4)
    parser.add_argument("--extra", default="", help="metrics (with rollup) also sampled in the loops")
    parser.add_argument("--skip-ms", type=float, default=100.0)
    parser.add_argument("--keep-ms", type=float, default=30.0)
    args = parser.parse_args()
    if args.analyse:
        for path in args.analyse:
            unseen(path, args.threshold)
        return
    if not torch.cuda.is_available() or args.out is None:
        raise SystemExit("bench_copy_metrics needs CUDA and --out (or --analyse FILES)")
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"machine: {torch.cuda.get_device_name()}; torch {torch.__version__}", flush=True)
    torch.zeros(1, device="cuda")
    names = base_metrics()
    (args.out / "base_metrics.txt").write_text("\n".join(names) + "\n")
    unit = {n: n.split("__")[0] for n in names}
    candidates = sorted((n for n in names if unit[n] in UNITS), key=lambda n: (UNITS.index(unit[n]), n))
    print(f"base metrics: {len(names)}; candidates: {len(candidates)} (trying {min(len(candidates), args.most)})")
    records = DeviceRecords(cupti.library() or cupti.load())
    seeing = explore(candidates[: args.most], args.group, records, args.out)
    print(f"seeing every copy and memset sample: {', '.join(seeing) or 'none'}", flush=True)
    chosen = seeing[: args.take] + [m for m in args.extra.split(",") if m]
    if args.loops:
        loops(args.loops.split(","), (ACTIVE_CYCLES, ELAPSED_CYCLES, *chosen), records, args)
    disable_all()


if __name__ == "__main__":
    main()
