"""Under torchrun every rank runs the same pytest with the same options: both wrote r.json and j.xml, the last
writer won, and one rank's results vanished without a word. Each rank now writes its own files, named by its
rank, and its results say which rank measured them. Run here on the CPU with torchrun's own launcher (two ranks,
no process group: the files are what is tested; the tensor-parallel NCCL loop of the report needs two GPUs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_syncguard.ranks import Rank, current

TEST = """
import pytest
import torch


@pytest.mark.max_syncs_per_token(1)
def test_loop(syncguard):
    with syncguard.generation(tokens=4):
        x = torch.ones(4)
        for _ in range(4):
            x.sum().item()
"""


def test_a_rank_is_read_from_torchruns_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert current() is None
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert current() is None  # a launch of one: names stay as given
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert current() == Rank(1, 2)
    assert Rank(1, 2).path("out/r.json") == "out/r.rank1.json"


def test_each_rank_of_torchrun_keeps_its_own_results_and_says_its_rank(tmp_path: Path) -> None:
    (tmp_path / "test_r.py").write_text(TEST)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "pytest",
               "-q", "-p", "no:cacheprovider", "test_r.py", "--syncguard", "--syncguard-json", "r.json",
               "--junitxml", "j.xml"]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "j.xml").exists()
    for rank in (0, 1):
        assert (tmp_path / f"j.rank{rank}.xml").is_file()
        (test,) = json.loads((tmp_path / f"r.rank{rank}.json").read_text())["tests"]
        assert f"syncguard: measured by rank {rank} of 2 (torchrun: RANK, WORLD_SIZE)" in test["notes"]
        assert f"syncguard results written to r.rank{rank}.json" in done.stdout
