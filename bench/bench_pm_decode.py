"""What judging a sampled region costs the host: decoding its PM samples (CUPTI's sample info and counter
evaluation, per sample) and analysing them into a timeline, for one run of a strategy of the suite (GPT-2 124M,
batch 32, prompt 16, 100 new tokens; no_cache by default, about 1.5 s of device time).

On CUDA, per round: one run sampled as the plugin samples it, CUPTI's decode of it into a counter-data image timed
step by step, then the image evaluated by each variant in a rotating order (the Python loop, the native loop on each
of ``--threads``), each checked to give the same values; then the samples compacted (native) and the region
analysed (``judge_sampled_region``), and the same analysis of the samples as decoded, as the plugin analysed them
before compaction. Medians over ``--rounds``.

``--replay FILE --copies N`` (no GPU): the analysis alone, on a kept run of tests/data/sampled_steps repeated N times
(its samples shifted along the clock): compaction in Python and native, and the analysis of the compacted rows
against that of every sample.

Run from the repository root: ``python -m bench.bench_pm_decode [--strategy no_cache] [--rounds 3] [--threads 1,4,8]``
or ``python -m bench.bench_pm_decode --replay tests/data/sampled_steps/h100_no_cache.json.gz --copies 37``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pytest_syncguard.analysis.sampled import IDLE_BELOW
from pytest_syncguard.instruments import judge_sampled_region
from pytest_syncguard.probes import pm_sampling
from pytest_syncguard.probes.sampler import ACTIVE_CYCLES, ELAPSED_CYCLES, SampledRegion, samples_for


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    began = time.perf_counter()
    result = call()
    return time.perf_counter() - began, result


def report(times: dict[str, list[float]]) -> None:
    for name, values in times.items():
        spread = ", ".join(f"{v:.3f}" for v in values)
        print(f"  {name:<34} median {statistics.median(values):8.3f} s  ({spread})", flush=True)


def analysis(region: SampledRegion, times: dict[str, list[float]], native: bool = True) -> None:
    """Compaction and analysis of ``region``, and the analysis of every sample, timed into ``times``."""
    saved = pm_sampling._native
    if not native:
        pm_sampling._native = lambda: None  # type: ignore[assignment]
    try:
        kind = "native" if native else "python"
        took, rows = timed(lambda: region.samples.compacted(ACTIVE_CYCLES, ELAPSED_CYCLES, IDLE_BELOW))
        times.setdefault(f"compaction ({kind})", []).append(took)
    finally:
        pm_sampling._native = saved
    took, compact = timed(lambda: judge_sampled_region(replace(region, samples=rows), 2))
    times.setdefault("analysis of the compacted rows", []).append(took)
    took, whole = timed(lambda: judge_sampled_region(region, 2))
    times.setdefault("analysis of every sample (before)", []).append(took)
    assert compact.timeline is not None and whole.timeline is not None
    assert compact.timeline.gaps_us == whole.timeline.gaps_us or all(
        abs(a - b) < 1e-6 for a, b in zip(compact.timeline.gaps_us, whole.timeline.gaps_us, strict=True)
    )
    print(f"  {len(region.samples.start_ns)} samples -> {len(rows.start_ns)} rows; {len(compact.timeline.gaps_us)} "
          f"gaps, busy {compact.timeline.busy_us:.0f} us", flush=True)  # fmt: skip


def replay(path: Path, copies: int) -> None:
    from bench.bench_sampled_timeline import read_kept

    region, _ = read_kept(path)
    samples = region.samples
    length = samples.end_ns[-1] - samples.start_ns[0]
    shift = [k * length for k in range(copies)]
    starts = [s + k for k in shift for s in samples.start_ns]
    ends = [e + k for k in shift for e in samples.end_ns]
    rows = [row for _ in shift for row in zip(*samples.columns, strict=True)]
    repeated = pm_sampling.Samples.of_rows(samples.metrics, starts, ends, rows, interval_ns=samples.interval_ns)
    whole = SampledRegion(repeated, (region.window[0], region.window[0] + copies * length), None)
    print(f"replay of {path.name} x{copies}: {len(starts)} samples", flush=True)
    times: dict[str, list[float]] = {}
    for _ in range(3):
        analysis(whole, times, native=False)
        analysis(whole, times, native=True)
    report(times)


def device(strategy: str, rounds: int, threads: Sequence[int]) -> None:
    import torch

    from bench.bench_timeline_capture import NEW_TOKENS, workload
    from examples.strategies import STRATEGIES
    from pytest_syncguard.probes.sampler import _enabled_sampler

    model, prompt, eos = workload()
    run = STRATEGIES[strategy]
    print(f"machine: {torch.cuda.get_device_name()} ({torch.cuda.get_device_properties(0).uuid}); torch "
          f"{torch.__version__}; {strategy}", flush=True)  # fmt: skip
    run(model, prompt, NEW_TOKENS, eos)  # warm-up
    pm_sampling._native()  # built (once per machine) before any round times it
    sampler = _enabled_sampler()
    variants: list[tuple[str, bool, int]] = [("python loop", False, 1)]
    variants += [(f"native, {n} thread{'s' if n > 1 else ''}", True, n) for n in threads]
    times: dict[str, list[float]] = {}
    cupti: list[float] = []  # CUPTI's steps per round, together
    try:
        for round_ in range(rounds):
            torch.cuda.synchronize()
            begin = time.time_ns()
            sampler.start()
            run(model, prompt, NEW_TOKENS, eos)
            torch.cuda.synchronize()
            end = time.time_ns()
            sampler.stop()
            parts: dict[str, float] = {}
            # As the plugin decodes a region: into an image sized to its span, the first round's reused after.
            data = sampler.counter_data(samples_for((begin, time.time_ns())), parts)
            for part, took in parts.items():
                times.setdefault(f"CUPTI: {part}", []).append(took)
            cupti.append(sum(parts.values()))
            decoded = {}
            for k in range(len(variants)):
                name, native, count = variants[(k + round_) % len(variants)]
                took, decoded[name] = timed(
                    lambda d=data, n=native, c=count: sampler.evaluate(d, d.completed, native=n, threads=c)
                )
                times.setdefault(f"evaluation: {name}", []).append(took)
            first_name, first = next(iter(decoded.items()))
            for name, arrays in decoded.items():
                # The values must be the same; CUPTI puts the timestamps on the host's clock as it reads them.
                assert arrays[2] == first[2], f"{name} and {first_name} evaluated different values"
                moved = max(abs(a - b) for a, b in zip(arrays[0], first[0], strict=True))
                lengths = sum(1 for a, b, c, d in zip(*arrays[:2], *first[:2], strict=True) if b - a != d - c)
                if moved or lengths:
                    print(f"  {name} vs {first_name}: starts up to {moved} ns apart, {lengths} lengths differ")
            starts, ends, columns = first
            samples = pm_sampling.Samples(sampler.metrics, data.completed, starts, ends, columns, data.overflow,
                                          sampler.interval_ns)  # fmt: skip
            print(f"round {round_ + 1}: {data.completed} samples, overflow {data.overflow}", flush=True)
            analysis(SampledRegion(samples, (begin, end), None), times)
    finally:
        sampler.disable()
    report(times)
    for n in threads:
        name = f"evaluation: native, {n} thread{'s' if n > 1 else ''}"
        total = [cupti[i] + sum(times[k][i] for k in (name, "compaction (native)", "analysis of the compacted rows"))
                 for i in range(rounds)]  # fmt: skip
        print(f"decode + analysis, {name[12:]}: median {statistics.median(total):.3f} s", flush=True)
    before = [cupti[i] + times["evaluation: python loop"][i] + times["analysis of every sample (before)"][i]
              for i in range(rounds)]  # fmt: skip
    print(f"decode + analysis before (Python loop, every sample): median {statistics.median(before):.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="no_cache")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", default="1,4,8", help="thread counts of the native variants")
    parser.add_argument("--replay", type=Path, default=None)
    parser.add_argument("--copies", type=int, default=37)
    args = parser.parse_args()
    if args.replay is not None:
        replay(args.replay, args.copies)
    else:
        device(args.strategy, args.rounds, [int(n) for n in args.threads.split(",")])


if __name__ == "__main__":
    main()
