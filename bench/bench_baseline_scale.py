"""Baseline files of a large suite: a GPU model's file of ``--tests`` tests written by the project's writer
(:func:`pytest_syncguard.judge.baselines.document`) from the committed H100 file's entries (each test one of its 17
under another name, with its details and level recordings), then read back by :func:`.baselines.read` as a report or
the plugin reads it; its size, the seconds to write and to read, and whether every test came back. CPU.

Run from the repository root: ``python -m bench.bench_baseline_scale [--tests 500 3300 20000]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from pytest_syncguard.judge import baselines

ROOT = Path(__file__).parents[1]
SOURCE = ROOT / "baselines" / "nvidia-h100-80gb-hbm3.json"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tests", type=int, nargs="+", default=[500, 3300, 20000])
    args = parser.parse_args()
    source = baselines.read(SOURCE)
    assert source is not None
    names = sorted(source.tests)
    print(f"from {SOURCE.name} ({len(names)} tests), CPU: {os.cpu_count()} cores")
    print("tests | file MB | kB a test | write s | read s | read back whole")
    for count in args.tests:
        tests, details, history = {}, {}, {}
        for i in range(count):
            real = names[i % len(names)]
            nodeid = f"{real}[{i}]"
            tests[nodeid] = source.tests[real]
            if real in source.details:
                details[nodeid] = source.details[real]
            if real in source.history:
                history[nodeid] = source.history[real]
        path = Path(tempfile.mkdtemp()) / f"{source.device}.json"
        began = time.perf_counter()
        text = baselines.document(source.device, source.fingerprint, tests, details, history)
        path.write_text(text)
        written = time.perf_counter() - began
        began = time.perf_counter()
        back = baselines.read(path)
        read = time.perf_counter() - began
        whole = back is not None and back.tests == tests and back.history == history
        size = path.stat().st_size
        print(f"{count} | {size / 1e6:.1f} | {size / count / 1e3:.1f} | {written:.1f} | {read:.1f} | {whole}")
        path.unlink()


if __name__ == "__main__":
    main()
