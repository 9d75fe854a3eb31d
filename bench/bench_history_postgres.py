"""The history in PostgreSQL against the same history in a folder (the branch's files), at a team's sizes: a history
of TESTS x RUNS written by the project's writer (bench_history_scale), loaded into a fresh server (ci/postgres.sh),
then per store the wall seconds of `history record` (one run into the open segment), of `history fetch` and of a
clean PR's `report`, and 16 records started at once against the database (wall seconds until all landed).

    python -m bench.bench_history_postgres --tests 500 --runs 1100
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from bench.bench_history_scale import pr_results, runs_of, suite, timed, write_segmented
from pytest_syncguard.gate import history_postgres
from pytest_syncguard.judge import history as histories

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tests", type=int, default=500)
    parser.add_argument("--runs", type=int, default=1100)
    args = parser.parse_args()
    cli = [sys.executable, "-m", "pytest_syncguard.gate.cli"]
    document = suite(args.tests)
    slug = document["tests"][0]["device_slug"]
    work = Path(tempfile.mkdtemp(prefix="syncguard-pg-bench-"))
    server = Path(tempfile.mkdtemp(prefix="syncguard-pg-"))
    url = subprocess.run(["bash", str(ROOT / "ci" / "postgres.sh"), "start", str(server)], capture_output=True,
                         text=True, check=True).stdout.strip()  # fmt: skip
    try:
        folder = work / "history"
        folder.mkdir()
        write_segmented(folder, slug, runs_of(document, args.runs), args.runs, args.runs % histories.SEGMENT)
        with psycopg.connect(url) as connection:
            connection.execute(history_postgres.CREATE_TABLE)
            for path in folder.iterdir():
                connection.execute(
                    f"INSERT INTO {history_postgres.TABLE} (name, content) VALUES (%s, %s)",
                    (path.name, path.read_bytes()),
                )
        store = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
        print(f"{args.tests} tests x {args.runs} runs of {slug} ({store:.0f} MB), CPU: {os.cpu_count()} cores")
        print("store | record s | fetch s | report (clean PR) s")
        one = pr_results(document, 0, work)
        record_folder = timed([*cli, "history", "record", str(one), "--into", str(folder), "--commit", "e" * 40], work)
        report_folder = timed([*cli, "report", str(one), "--history", str(folder), "--markdown", "f.md"], work)
        print(f"folder (the branch's files) | {record_folder:.1f} | - | {report_folder:.1f}")
        record_db = timed([*cli, "history", "record", str(one), "--store", url, "--commit", "e" * 40], work)
        fetch_db = timed([*cli, "history", "fetch", "--into", str(work / "fetched"), "--store", url], work)
        report_db = timed([*cli, "report", str(one), "--history", str(work / "fetched"), "--markdown", "d.md"], work)
        print(f"PostgreSQL 15 | {record_db:.1f} | {fetch_db:.1f} | {report_db:.1f}")
        started = time.monotonic()
        record = [*cli, "history", "record", str(one), "--store", url, "--commit"]
        processes = [subprocess.Popen([*record, f"{n + 1:040x}"], stdout=subprocess.DEVNULL) for n in range(16)]
        codes = [process.wait() for process in processes]
        print(f"16 records at once: {sum(c == 0 for c in codes)} landed in {time.monotonic() - started:.1f} s wall")
    finally:
        subprocess.run(["bash", str(ROOT / "ci" / "postgres.sh"), "stop", str(server)], capture_output=True)
        shutil.rmtree(server, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
