"""What a job downloads to read the history: a GPU model's history of ``--tests`` tests x ``--runs`` pushes, each push
a commit of the history branch as ``history record --push`` makes it (the project's writer: open segment, latest
state, details, a closed segment every :data:`.history.SEGMENT` runs), pushed to a bare repository; then fetched into
a fresh repository as a pull request's job could: the whole branch (what ``history fetch`` does today), its tip only
(``--depth 1``), and its tip's trees only with the blobs a report reads fetched on demand (``--depth 1
--filter=blob:none``, a partial clone: the remote must allow filters, GitHub's does). Bytes received and seconds,
on this machine, over ``file://``. CPU.

Run from the repository root: ``python -m bench.bench_history_fetch [--tests 50] [--runs 1100]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.bench_history_scale import runs_of, suite
from pytest_syncguard.judge import history as histories
from pytest_syncguard.judge.history import History, Replay, Run


def git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, check=True)
    return done.stdout


def pack_bytes(folder: Path) -> int:
    """The bytes of the objects a repository holds (its packs and loose objects)."""
    objects = folder / ".git" / "objects"
    return sum(p.stat().st_size for p in objects.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tests", type=int, default=50)
    parser.add_argument("--runs", type=int, default=1100)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="syncguard-fetch-"))
    document = suite(args.tests)
    slug = document["tests"][0]["device_slug"]
    branch = work / "branch"
    branch.mkdir()
    git(branch, "init", "-q", "-b", "syncguard-history")
    git(branch, "config", "user.email", "bench@localhost")
    git(branch, "config", "user.name", "bench")
    before: Replay | None = None
    latest = Replay()
    runs: list[Run] = []
    began = time.perf_counter()
    for run in runs_of(document, args.runs):
        runs.append(run)
        latest.advance(run, {})
        held = History(slug, tuple(runs), {}, before, latest.copy())
        checkpoint = len(runs) >= histories.SEGMENT
        if checkpoint:
            before = histories.close_segment(branch, slug, before, runs, latest)
            latest, runs = before.copy(), []
            held = History(slug, (), {}, before, before)
        histories.write(branch, held, checkpoint=checkpoint or before is None)
        git(branch, "add", "-A")
        git(branch, "commit", "-q", "-m", f"syncguard history: {run.commit[:12]}")
    made = time.perf_counter() - began
    remote = work / "remote.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(branch), str(remote)], check=True)
    git(remote, "config", "uploadpack.allowFilter", "true")
    git(remote, "config", "uploadpack.allowAnySHA1InWant", "true")
    git(remote, "gc", "-q", "--aggressive")
    stored = sum(p.stat().st_size for p in (remote / "objects").rglob("*") if p.is_file())
    tip_files = git(remote, "ls-tree", "-l", "syncguard-history").splitlines()
    tip_bytes = sum(int(line.split()[3]) for line in tip_files)
    judging = [line.split()[2] for line in tip_files if histories.judging_file(line.split("\t")[1])]
    print(
        f"{args.tests} tests x {args.runs} pushes of {slug} ({made:.0f} s to make), CPU: {os.cpu_count()} cores; "
        f"the remote's objects after gc {stored / 1e6:.1f} MB, the tip's files {tip_bytes / 1e6:.1f} MB "
        f"({len(tip_files)} files, {len(judging)} read by a report)"
    )
    print("fetch | MB received (objects held after) | seconds")
    url = remote.as_uri()
    variants = {
        "the whole branch (today)": ["fetch", "-q", url, "+refs/heads/syncguard-history:refs/h"],
        "its tip (--depth 1)": ["fetch", "-q", "--depth", "1", url, "+refs/heads/syncguard-history:refs/h"],
        "its tip's trees, then the report's blobs (--depth 1 --filter=blob:none)": [
            "fetch", "-q", "--depth", "1", "--filter=blob:none", url, "+refs/heads/syncguard-history:refs/h"
        ],
    }  # fmt: skip
    for name, command in variants.items():
        fresh = work / "fresh"
        shutil.rmtree(fresh, ignore_errors=True)
        subprocess.run(["git", "init", "-q", str(fresh)], check=True)
        if "--filter=blob:none" in command:
            git(fresh, "config", "remote.origin.url", url)
            git(fresh, "config", "remote.origin.promisor", "true")
            git(fresh, "config", "remote.origin.partialclonefilter", "blob:none")
        began = time.perf_counter()
        git(fresh, *command)
        if "--filter=blob:none" in command:
            for blob in judging:  # fetched on demand from the promisor remote
                git(fresh, "cat-file", "blob", blob)
        seconds = time.perf_counter() - began
        print(f"{name} | {pack_bytes(fresh) / 1e6:.2f} | {seconds:.1f}")
    # A developer's `git clone` of a repository whose main is one small commit, its history on the branch (git clone
    # fetches every branch) or under refs/syncguard/ (history_branch.OUTSIDE_BRANCHES: a clone leaves it).
    print("a developer's git clone | MB received (objects held after) | seconds")
    for where in ("refs/heads/syncguard-history", "refs/syncguard/history"):
        project = work / "project.git"
        shutil.rmtree(project, ignore_errors=True)
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(project)], check=True)
        seed = work / "seed"
        shutil.rmtree(seed, ignore_errors=True)
        subprocess.run(["git", "init", "-q", "-b", "main", str(seed)], check=True)
        (seed / "README.md").write_text("project\n")
        git(seed, "add", ".")
        git(seed, "-c", "user.name=b", "-c", "user.email=b@x", "commit", "-qm", "main")
        git(seed, "push", "-q", project.as_uri(), "main")
        git(branch, "push", "-q", project.as_uri(), f"syncguard-history:{where}")
        clone = work / "clone"
        shutil.rmtree(clone, ignore_errors=True)
        began = time.perf_counter()
        subprocess.run(["git", "clone", "-q", project.as_uri(), str(clone)], check=True)
        seconds = time.perf_counter() - began
        print(f"the history at {where} | {pack_bytes(clone) / 1e6:.2f} | {seconds:.1f}")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
