"""A tensor-parallel decode loop, one process per GPU, judged as one run: run it under torchrun.

    torchrun --nproc-per-node 2 -m pytest examples/test_tensor_parallel.py --syncguard --syncguard-json tp.json
    syncguard report tp.rank0.json tp.rank1.json

Each layer is an MLP sharded across the ranks (its up projection by columns, its down projection by rows), whose
partial sums one all-reduce adds up; each step ends in the loop's stop check, one sync. NCCL on CUDA (each rank on
its own GPU), gloo on the CPU. Outside a launch of several processes it is skipped.

Planted for the evidence of docs/howto/torchrun.md: ``SYNCGUARD_PLANT_STRAGGLER_US=200`` makes rank 1 spin that many
microseconds on its GPU in each step, before its second layer (where its GPU has queued work, so that all of the spin
delays its arrival at that layer's all-reduce: a straggler), or before every layer with
``SYNCGUARD_PLANT_STRAGGLER_LAYERS=all``; ``SYNCGUARD_PLANT_KILL_RANK=1`` makes rank 1 kill itself (SIGKILL) in the
middle of its first measured run.
"""

from __future__ import annotations

import os
import signal
import statistics
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from pytest_syncguard import SyncGuard

WORLD = int(os.environ.get("WORLD_SIZE", "1"))
LAYERS, STEPS = 4, 32
# On CUDA a batch large enough that the GPU, not the host, sets the pace (a straggler's GPU work then delays its
# arrival at the collectives); on the CPU (gloo) small: the launch is what is shown there, not the speed.
HIDDEN = int(os.environ.get("SYNCGUARD_TP_HIDDEN", 0)) or (8192 if torch.cuda.is_available() else 256)
BATCH = int(os.environ.get("SYNCGUARD_TP_BATCH", 0)) or (1024 if torch.cuda.is_available() else 8)

pytestmark = pytest.mark.skipif(WORLD < 2, reason="a tensor-parallel loop: run it under torchrun --nproc-per-node 2")


@pytest.fixture(scope="module")
def device() -> Iterator[torch.device]:
    """This rank's device in an initialized process group (NCCL on its own GPU, else gloo on the CPU)."""
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        chosen = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=chosen)
    else:
        chosen = torch.device("cpu")
        dist.init_process_group("gloo")
    yield chosen
    dist.destroy_process_group()


class ShardedMLP(torch.nn.Module):
    """This rank's shard of ``LAYERS`` MLPs: each adds its partial sums up with one all-reduce."""

    def __init__(self, device: torch.device, spin: int = 0) -> None:
        super().__init__()
        self.spin = spin
        """GPU clock cycles spun before the second layer, or every layer (a planted straggler); 0: none."""
        self.spun = range(LAYERS) if os.environ.get("SYNCGUARD_PLANT_STRAGGLER_LAYERS") == "all" else (1,)
        width = 4 * HIDDEN // WORLD
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        generator = torch.Generator().manual_seed(dist.get_rank())
        self.up = [torch.randn(HIDDEN, width, generator=generator).div(HIDDEN**0.5).to(device, dtype)
                   for _ in range(LAYERS)]  # fmt: skip
        self.down = [torch.randn(width, HIDDEN, generator=generator).div(width**0.5).to(device, dtype)
                     for _ in range(LAYERS)]  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer, (up, down) in enumerate(zip(self.up, self.down, strict=True)):
            if self.spin and layer in self.spun:
                torch.cuda._sleep(self.spin)
            partial = torch.nn.functional.gelu(x @ up) @ down
            dist.all_reduce(partial)
            x = torch.tanh(x + partial)
        return x


def _spin_cycles(model: ShardedMLP, x: torch.Tensor, microseconds: float) -> int:
    """GPU clock cycles that ``torch.cuda._sleep`` spins for ``microseconds`` on this GPU under the loop's own load:
    timed with events between the layers' matmuls (the SM clock under heavy matmuls is lower than idle, and the spin
    counts cycles), median of 5."""
    probe = 1_000_000

    def load() -> None:
        for up, down in zip(model.up, model.down, strict=True):
            torch.nn.functional.gelu(x @ up) @ down

    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        load()
        start.record()
        torch.cuda._sleep(probe)
        end.record()
        load()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return int(probe * microseconds / statistics.median(times))


def decode(model: ShardedMLP, x: torch.Tensor, kill_at: int | None = None) -> torch.Tensor:
    """``STEPS`` decode steps; each ends in the stop check (one sync)."""
    for step in range(STEPS):
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        x = model(x)
        if bool((x.abs().amax() > 1e4).item()):  # the loop's stop check: never true, one sync per step
            break
    return x


@pytest.mark.max_syncs_per_token(1)
@pytest.mark.max_collectives_per_token(LAYERS)
def test_tp_decode(syncguard: SyncGuard, device: torch.device) -> None:
    rank = dist.get_rank()
    planted = float(os.environ.get("SYNCGUARD_PLANT_STRAGGLER_US", "0") or 0)
    model = ShardedMLP(device)
    x = torch.randn(BATCH, HIDDEN, generator=torch.Generator().manual_seed(0)).to(device, model.up[0].dtype)
    if planted and rank == 1 and device.type == "cuda":
        model.spin = _spin_cycles(model, x, planted)
    kill = os.environ.get("SYNCGUARD_PLANT_KILL_RANK", "")
    runs = {"n": 0}

    def run() -> torch.Tensor:
        runs["n"] += 1
        # The kill lands in the first measured run (after the warm-up run), in its middle.
        kill_at = STEPS // 2 if kill.isdigit() and int(kill) == rank and runs["n"] == 2 else None
        return decode(model, x, kill_at)

    syncguard.measure(run, tokens=STEPS, warmup=1, repeat=5)


@pytest.mark.max_syncs_per_token(1)
@pytest.mark.max_collectives_per_token(LAYERS)
def test_tp_decode_in_a_region(syncguard: SyncGuard, device: torch.device) -> None:
    """The same loop in a plain region, as most tests are written: its collectives' waits come from the region."""
    model = ShardedMLP(device)
    x = torch.randn(BATCH, HIDDEN, generator=torch.Generator().manual_seed(0)).to(device, model.up[0].dtype)
    planted = float(os.environ.get("SYNCGUARD_PLANT_STRAGGLER_US", "0") or 0)
    if planted and dist.get_rank() == 1 and device.type == "cuda":
        model.spin = _spin_cycles(model, x, planted)
    decode(model, x)  # warm-up
    with syncguard.generation(tokens=STEPS):
        decode(model, x)
