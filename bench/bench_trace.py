"""Time of the ``syncguard trace`` analysis (parsing included) on a large real trace, against
HolisticTraceAnalysis (HTA) on the same file, and the agreement of their idle and busy times.

Input: bench/data/gpt2_b32_100.trace.json.gz (HF generate, GPT-2 124M config, batch 32, 100 new tokens, on an
H100: 258k events, 65.6 MB of JSON; see tests/data/README.md). It is decompressed once to a temporary folder,
and both tools read the same JSON file. HTA is optional: ``pip install holistictraceanalysis psutil``.

Run from the repository root: ``python -m bench.bench_trace [--runs N]``; it prints the machine it ran on.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from pytest_syncguard.analysis import gaps, trace_file

TRACE = Path(__file__).parent / "data" / "gpt2_b32_100.trace.json.gz"


def ours(path: Path) -> tuple[float, gaps.Timeline]:
    start = time.perf_counter()
    timeline = gaps.analyze(trace_file.load(path))
    elapsed = time.perf_counter() - start
    assert timeline is not None
    return elapsed, timeline


def hta(folder: Path) -> tuple[float, float, float, float]:
    """HTA's temporal breakdown (idle and kernel time of rank 0), its idle-time breakdown, and the seconds."""
    from hta.trace_analysis import TraceAnalysis

    start = time.perf_counter()
    analysis = TraceAnalysis(trace_dir=str(folder))
    temporal = analysis.get_temporal_breakdown(visualize=False)
    analysis.get_idle_time_breakdown(visualize=False)
    elapsed = time.perf_counter() - start
    row = temporal.iloc[0]
    return (
        elapsed,
        float(row["idle_time(us)"]),
        float(row["compute_time(us)"] + row["non_compute_time(us)"]),
        float(row["idle_time_pctg"]),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hta-runs", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="syncguard-bench-"))
    try:
        path = folder / "rank0.json"
        with gzip.open(TRACE, "rb") as source, path.open("wb") as sink:
            shutil.copyfileobj(source, sink)
        # HTA reads the rank from the trace's distributedInfo; add it to a copy when missing.
        data = json.loads(path.read_bytes())
        events = len(data["traceEvents"])
        data.setdefault("distributedInfo", {"rank": 0})
        path.write_text(json.dumps(data))
        del data
        size = os.path.getsize(path) / 1e6
        print(
            f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; trace {events} events, "
            f"{size:.1f} MB of JSON"
        )
        parse_only = []
        for _ in range(args.runs):
            start = time.perf_counter()
            trace_file.load(path)
            parse_only.append(time.perf_counter() - start)
        times, timeline = zip(*(ours(path) for _ in range(args.runs)), strict=True)
        t = timeline[0]
        idle = t.span_us - t.busy_us
        print(
            f"syncguard: median {statistics.median(times):.3f} s over {args.runs} runs (parsing alone "
            f"{statistics.median(parse_only):.3f} s); busy {t.busy_us:.0f} us, idle {idle:.0f} us of a "
            f"{t.span_us:.0f} us span, busy fraction {t.busy_fraction:.4f}, {len(t.gaps_us)} gaps"
        )
        try:
            import hta as _
        except ImportError:
            print("HTA not installed: pip install holistictraceanalysis psutil")
            return
        runs = [hta(folder) for _ in range(args.hta_runs)]
        seconds = statistics.median(r[0] for r in runs)
        _, hta_idle, hta_busy, hta_pct = runs[0]
        print(
            f"HTA: median {seconds:.3f} s over {args.hta_runs} runs; busy {hta_busy:.0f} us, idle {hta_idle:.0f} us "
            f"({hta_pct:.2f}% idle), busy fraction {hta_busy / (hta_busy + hta_idle):.4f}"
        )
        print(
            f"difference: busy {t.busy_us - hta_busy:+.0f} us ({(t.busy_us - hta_busy) / t.busy_us:+.2%}), "
            f"idle {idle - hta_idle:+.0f} us; speed-up {seconds / statistics.median(times):.1f}x"
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
