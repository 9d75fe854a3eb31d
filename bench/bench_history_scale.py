"""The history at a team's scale: a GPU model's history of ``--tests`` tests x ``--runs`` pushes written by the
project's own writer, each test one of the real H100 strategy tests (tests/data/h100_pr/unchanged.json.gz) under
another name, its device time moved by a runner's offset (4 runners) and run noise, kept as the store keeps it
(closed segments of :data:`.history.SEGMENT` runs, the checkpoint, the open segment, written a segment at a time);
then, timed on this machine: recording one more push (``history record``) into the open segment (``runs`` % SEGMENT
runs) and into one that the push closes, ``syncguard report --history`` of a pull request that changes nothing,
regresses one test, and regresses every test (+10% device time), each to its Markdown comment, and ``history page``:
its time, its size, and its first frame in headless Chromium (less an empty page's). CPU.

Run from the repository root: ``python -m bench.bench_history_scale [--tests 500] [--runs 1100 10100]``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pytest_syncguard.judge import history as histories
from pytest_syncguard.judge.history import History, Replay, Run, run_of
from pytest_syncguard.metrics import DEVICE_TIME

ROOT = Path(__file__).parents[1]
DATA = ROOT / "tests" / "data" / "h100_pr" / "unchanged.json.gz"
HOSTS = ("h100-a", "h100-b", "h100-c", "h100-d")


def suite(tests: int) -> dict[str, Any]:
    """A results document of ``tests`` tests: the real ones repeated under other names."""
    document = json.loads(gzip.decompress(DATA.read_bytes()))
    real = document["tests"]
    document["tests"] = [
        {**real[i % len(real)], "nodeid": f"{real[i % len(real)]['nodeid']}[{i}]"} for i in range(tests)
    ]
    return document


def runs_of(document: dict[str, Any], runs: int, seed: int = 0) -> Iterator[Run]:
    """``runs`` pushes of the suite, oldest first, made one at a time (a year of a large suite does not fit in
    memory at once)."""
    from pytest_syncguard.document import file as results_file

    path = Path(tempfile.mkdtemp()) / "suite.json"
    path.write_text(json.dumps(document))
    base = run_of(results_file.read(path), "0" * 40, "2026-01-01T00:00:00Z")
    rng = random.Random(seed)
    offsets = {h: 1 + rng.gauss(0, 0.005) for h in HOSTS}
    for n in range(runs):
        host = HOSTS[n % len(HOSTS)]
        tests = {
            nodeid: {
                name: (value * offsets[host] * (1 + rng.gauss(0, 0.002)) if name == DEVICE_TIME else value)
                for name, value in values.items()
            }
            for nodeid, values in base.tests.items()
        }
        yield Run(f"{n:040x}", f"2026-01-01T{n % 24:02d}:00:00Z", host, tests)


def write_segmented(folder: Path, slug: str, runs: Iterator[Run], count: int, open_runs: int) -> None:
    """The store of ``count`` runs as records leave it, with ``open_runs`` in the open segment: each closed segment
    written and the checkpoint advanced past it, a segment at a time."""
    replay: Replay | None = None
    chunk: list[Run] = []
    for run in runs:
        chunk.append(run)
        if (replay.runs if replay else 0) + len(chunk) <= count - open_runs and len(chunk) == histories.SEGMENT:
            replay, chunk = histories.close_segment(folder, slug, replay, chunk), []
    histories.write(folder, History(slug, tuple(chunk), {}, replay))


def pr_results(document: dict[str, Any], regressed: int, folder: Path) -> Path:
    """The PR's results: ``regressed`` of the tests with a device time, theirs +10%."""
    changed = json.loads(json.dumps(document))
    timed = [t for t in changed["tests"] if DEVICE_TIME in t["metrics"]["values"]]
    for test in timed[:regressed]:
        test["metrics"]["values"][DEVICE_TIME] *= 1.10
    path = folder / f"pr-{regressed}.json"
    path.write_text(json.dumps(changed))
    return path


def timed(command: list[str], cwd: Path) -> float:
    """The seconds of wall time the command took; one that fails stops the bench with what it said."""
    began = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[2:5])} exited {done.returncode}: {done.stderr[-500:]}")
    return time.perf_counter() - began


def first_frame(page: Path) -> float:
    """The median seconds of 3 headless Chromium screenshots of ``page`` (1300 x 1100): its load, script and first
    frame, and the browser's start (an empty page's, subtracted by the caller)."""
    if not page.exists():
        page.write_text("<!doctype html><title>blank</title>")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        return float("nan")
    times = []
    for _ in range(3):
        began = time.perf_counter()
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                f"--screenshot={page.with_suffix('.png')}",
                "--window-size=1300,1100",
                page.as_uri(),
            ],
            capture_output=True,
            timeout=300,
            check=True,
        )
        times.append(time.perf_counter() - began)
    return sorted(times)[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tests", type=int, default=500)
    parser.add_argument("--runs", type=int, nargs="+", default=[1100, 10100])
    args = parser.parse_args()
    cli = [sys.executable, "-m", "pytest_syncguard.gate.cli"]
    document = suite(args.tests)
    slug = document["tests"][0]["device_slug"]
    segment = histories.SEGMENT
    print(f"{args.tests} tests of {slug}, segments of {segment} runs, CPU: {os.cpu_count()} cores")
    print(
        "runs | store MB | read by a report MB | record s (open segment of runs % SEGMENT) | record s (closes it) | "
        "report clean s | one regressed s | all regressed s | comment bytes (all) | page s | page MB | "
        "first frame s (Chromium, less a blank page's)"
    )
    for runs in args.runs:
        work = Path(tempfile.mkdtemp(prefix="syncguard-scale-"))
        folder = work / "history"
        folder.mkdir()
        write_segmented(folder, slug, runs_of(document, runs), runs, runs % segment)
        files = list(folder.iterdir())
        store = sum(f.stat().st_size for f in files) / 2**20
        read = sum(f.stat().st_size for f in files if histories.judging_file(f.name)) / 2**20
        one_more = pr_results(document, 0, work)
        record = [*cli, "history", "record", str(one_more), "--into", str(folder), "--commit"]
        into_open = timed([*record, "e" * 40], work)
        cells = []
        for regressed in (0, 1, args.tests):
            results = pr_results(document, regressed, work)
            seconds = timed(
                [*cli, "report", str(results), "--history", str(folder), "--markdown", f"c{regressed}.md"], work
            )
            cells.append(f"{seconds:.1f}")
        comment = (work / f"c{args.tests}.md").stat().st_size
        held = histories.read(folder, slug)
        assert held is not None
        # One short of closing the open segment: by its runs (SEGMENT), or by its bytes (SEGMENT_BYTES) where a run
        # is large (20,000 tests: more than a megabyte a run).
        size = (folder / f"{slug}{histories.RUNS_SUFFIX}").stat().st_size
        per_run = size / max(1, len(held.runs))
        by_bytes = math.ceil((histories.SEGMENT_BYTES - size) / per_run) - 1
        more = tuple(runs_of(document, max(0, min(segment - len(held.runs) - 1, by_bytes)), seed=1))
        more = tuple(Run(f"{n:039x}a", r.time, r.host, r.tests) for n, r in enumerate(more))
        histories.write(folder, History(slug, held.runs + more, held.details, held.before))
        closing = timed([*record, "d" * 40], work)
        made = timed([*cli, "history", "page", str(folder), "--out", "page.html", "--repository", "octo/decode"], work)
        model = work / f"page.{slug}.html"
        frame = first_frame(model) - first_frame(work / "blank.html")
        print(
            f"{runs} | {store:.0f} | {read:.1f} | {into_open:.1f} | {closing:.1f} | {' | '.join(cells)} | {comment} | "
            f"{made:.1f} | {model.stat().st_size / 1e6:.2f} | {frame:.2f}"
        )
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
