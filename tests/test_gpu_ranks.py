"""On a machine with two GPUs: the tensor-parallel example (examples/test_tensor_parallel.py) under torchrun with
NCCL, one rank per GPU, its ranks' documents joined by the report: each rank counts its all-reduces at their call
site and no sync for them, the kernels pair across ranks, and a straggler planted on rank 1 is named with rank 0's
wait near the planted time."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_syncguard.analysis.collectives import FLIGHT_RECORDER, CollectiveWaits
from pytest_syncguard.document import file as results_file
from pytest_syncguard.document.measured import MeasuredTest

pytestmark = pytest.mark.gpu
EXAMPLE = Path(__file__).parents[1] / "examples" / "test_tensor_parallel.py"


def _launch(folder: Path, **env: str) -> dict[str, MeasuredTest]:
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (one rank on each)")
    folder.mkdir()
    # The plugin by its entry point where the package is installed, else by name (a checkout on PYTHONPATH).
    installed = any(e.value.startswith("pytest_syncguard") for e in importlib.metadata.entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "pytest_syncguard.plugin"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "pytest",
               "-q", *plugin, "-p", "no:cacheprovider", "--rootdir", str(EXAMPLE.parents[1]),
               str(EXAMPLE), "--syncguard", "--syncguard-json", "r.json"]  # fmt: skip
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {t.nodeid.rsplit("::", 1)[1]: t for t in results_file.read_all(sorted(folder.glob("r.rank*.json")))}


def test_the_ranks_collectives_pair_and_a_planted_straggler_is_named(tmp_path: Path) -> None:
    """The waits come from the timed runs and the region (torch's flight recorder), not the counting run's trace:
    nothing planted, no straggler; rank 1 late at the second layer, named there with the planted time."""
    unchanged = _launch(tmp_path / "unchanged")
    for name, test in unchanged.items():
        assert [r.verdict for r in test.ranks] == ["pass", "pass"], name
        assert test.metrics.values["collectives_per_token"] == 4 and test.metrics.values["syncs_per_token"] == 1
        waits = test.joined["collectives"]
        assert isinstance(waits, CollectiveWaits) and waits.clock == FLIGHT_RECORDER, (name, waits)
        assert waits.per_step == 4 and waits.matched == (640 if name == "test_tp_decode" else 128), (name, waits)
        assert waits.straggler is None, (name, waits)
    planted = _launch(tmp_path / "straggler", SYNCGUARD_PLANT_STRAGGLER_US="200")
    for name, test in planted.items():
        waits = test.joined["collectives"]
        assert isinstance(waits, CollectiveWaits) and waits.straggler == 1, (name, waits)
        # At the second layer's all-reduce, the one the spin delays: the planted 200 us (calibrated by each test on
        # its own; the region's one run read 236 us on two H200s, measure()'s median over 5 timed runs 201 us).
        assert waits.worst == 1 and waits.worst_last == 1 and 170 <= waits.worst_wait_us <= 250, (name, waits)
