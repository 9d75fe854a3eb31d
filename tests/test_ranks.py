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


@pytest.mark.parametrize(
    ("rank", "world", "said"),
    [
        (None, "2", "WORLD_SIZE=2 with no RANK"),
        ("abc", "2", "WORLD_SIZE=2 with RANK='abc'"),
        ("2", "2", "WORLD_SIZE=2 with RANK='2'"),
        ("-1", "2", "WORLD_SIZE=2 with RANK='-1'"),
        ("0", "two", "WORLD_SIZE='two' is not a number of processes"),
    ],
)
def test_a_launch_without_a_usable_rank_names_both_variables(
    monkeypatch: pytest.MonkeyPatch, rank: str | None, world: str, said: str
) -> None:
    monkeypatch.setenv("WORLD_SIZE", world)
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    with pytest.raises(ValueError, match=said):
        current()


def test_such_a_launch_is_a_usage_error_not_one_shared_file(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each rank would write r.json (the last writer wins): the run stops before any test, naming the variables."""
    pytester.makepyfile(test_r=TEST)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "abc")
    done = pytester.runpytest_subprocess("--syncguard", "--syncguard-json", "r.json")
    assert done.ret == pytest.ExitCode.USAGE_ERROR
    assert "syncguard: WORLD_SIZE=2 with RANK='abc'" in done.stderr.str()
    assert not (pytester.path / "r.json").exists()
