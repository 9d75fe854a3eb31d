"""A 20-token CPU loop's timed region under ``pytest -n 2`` against the same loop run serially, with the plugin's
share of the cores per worker and without it (``OMP_NUM_THREADS`` set to every core, as each worker took before):
medians of each test's timed runs, over ``--rounds`` rounds that run the three variants in a rotating order. CPU.

Run from the repository root: ``python -m bench.bench_xdist_threads [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pytest_syncguard.environment import available_cores
from tests.test_xdist_threads import LOOP

TESTS = 8
#: The loop's size: a few ms per token on the 2-core CPU machine, as the loop the oversubscription was seen on.
WIDTH, BATCH, REPEAT = 512, 64, 5


def run(folder: Path, variant: str) -> list[float]:
    """The median timed region (s) of each test of one pytest run of ``variant``."""
    for stale in folder.glob("threads-*.json"):
        stale.unlink()
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--syncguard"]
    if variant != "serial":
        args += ["-n", "2"]
    if variant == "-n 2, every core per worker":
        env["OMP_NUM_THREADS"] = str(available_cores())
    subprocess.run(args, cwd=folder, env=env, check=True, capture_output=True)
    return [statistics.median(json.loads(p.read_text())["seconds"]) for p in sorted(folder.glob("threads-*.json"))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    variants = ["serial", "-n 2, the plugin's share", "-n 2, every core per worker"]
    found: dict[str, list[float]] = {v: [] for v in variants}
    print(
        f"{available_cores()} cores; {TESTS} tests of 20 tokens (width {WIDTH}, batch {BATCH}), "
        f"{REPEAT} timed runs each",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        for n in range(TESTS):
            (folder / f"test_loop_{n}.py").write_text(LOOP.format(n=n, width=WIDTH, batch=BATCH, repeat=REPEAT))
        for round_ in range(args.rounds):
            for k in range(len(variants)):
                variant = variants[(k + round_) % len(variants)]
                found[variant] += run(folder, variant)
    serial = statistics.median(found["serial"])
    for variant, seconds in found.items():
        median = statistics.median(seconds)
        print(f"{variant:<30} median {median * 1e3:8.1f} ms (x{median / serial:.2f} serial); "
              f"range {min(seconds) * 1e3:.1f}-{max(seconds) * 1e3:.1f} ms", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
