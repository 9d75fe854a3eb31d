"""On a machine with two GPUs: the tensor-parallel example (examples/test_tensor_parallel.py) under torchrun with
NCCL, one rank per GPU, its ranks' documents joined by the report: each rank counts its all-reduces at their call
site and no sync for them, the kernels pair across ranks, and a straggler planted on rank 1 is named with rank 0's
wait near the planted time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_syncguard.analysis.collectives import CollectiveWaits
from pytest_syncguard.document import file as results_file
from pytest_syncguard.document.measured import MeasuredTest

pytestmark = pytest.mark.gpu
EXAMPLE = Path(__file__).parents[1] / "examples" / "test_tensor_parallel.py"


def _launch(folder: Path, **env: str) -> MeasuredTest:
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (one rank on each)")
    folder.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "pytest",
               "-q", "-p", "pytest_syncguard.plugin", "-p", "no:cacheprovider", "--rootdir", str(EXAMPLE.parents[1]),
               str(EXAMPLE), "--syncguard", "--syncguard-json", "r.json"]  # fmt: skip
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (test,) = results_file.read_all(sorted(folder.glob("r.rank*.json")))
    return test


def test_the_ranks_collectives_pair_and_a_planted_straggler_is_named(tmp_path: Path) -> None:
    unchanged = _launch(tmp_path / "unchanged")
    assert [r.verdict for r in unchanged.ranks] == ["pass", "pass"]
    assert unchanged.metrics.values["collectives_per_token"] == 4 and unchanged.metrics.values["syncs_per_token"] == 1
    waits = unchanged.joined["collectives"]
    assert isinstance(waits, CollectiveWaits) and waits.matched == 128 and waits.per_step == 4
    planted = _launch(tmp_path / "straggler", SYNCGUARD_PLANT_STRAGGLER_US="200")
    waits = planted.joined["collectives"]
    assert isinstance(waits, CollectiveWaits) and waits.straggler == 1, waits
    # At the second layer's all-reduce, the one the spin delays: the planted 200 us, and the GPUs' own skew either way
    assert waits.worst == 1 and waits.worst_last == 1 and 140 <= waits.worst_wait_us <= 300, waits
