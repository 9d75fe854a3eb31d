"""The truth harness for collective waits: one tensor-parallel decode loop, run under torchrun, three ways
interleaved in each rank's process, and the three side by side (rank 0 prints them, and writes them as JSON):

- unmeasured: the loop on a process group made without timing, timed by the wall clock only;
- as syncguard's default measures it: the same loop on a process group with torch's flight-recorder timing
  (``TORCH_NCCL_ENABLE_TIMING=1``, what the plugin turns on), its collectives read from the recorder by the plugin's
  own probe functions and matched across ranks by :func:`pytest_syncguard.analysis.collectives.match`;
- under a full trace (torch.profiler, CUDA activities): the collective kernels' starts on the host's clock (the
  ranks on one host share it), split by their start skew as TraceLens does, else by their durations.

    torchrun --standalone --nproc-per-node 2 devtools/collective_truth.py --spin-us 200 --spin-at all --json out.json

Each run is ``--steps`` tokens of ``--layers`` layers (an MLP sharded across the ranks, one all-reduce each) and
one host read per step; ``--spin-us`` plants GPU work on rank 1 before the all-reduce of every layer (``all``) or
of the second (``1``). Time per token is the median over ``--rounds`` of each way.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pytest_syncguard.analysis.collectives import Collectives, CollectiveWaits, TimedCollective, TimedRegion
from pytest_syncguard.analysis.collectives import match as matched
from pytest_syncguard.probes.collectives import recorded_in


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--spin-us", type=float, default=0.0)
    parser.add_argument("--spin-at", choices=("all", "1"), default="all")
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    os.environ["TORCH_NCCL_ENABLE_TIMING"] = "0"
    os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "20000")
    dist.init_process_group("nccl", device_id=device)
    plain = dist.new_group(list(range(dist.get_world_size())))
    os.environ["TORCH_NCCL_ENABLE_TIMING"] = "1"
    timed = dist.new_group(list(range(dist.get_world_size())))
    rank, world = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(rank)
    width = 4 * args.hidden // world
    up = [torch.randn(args.hidden, width, generator=generator).div(args.hidden**0.5).to(device, torch.bfloat16)
          for _ in range(args.layers)]  # fmt: skip
    down = [torch.randn(width, args.hidden, generator=generator).div(width**0.5).to(device, torch.bfloat16)
            for _ in range(args.layers)]  # fmt: skip
    spin = 0
    spun = range(args.layers) if args.spin_at == "all" else (1,)
    if args.spin_us and rank == 1:  # cycles for the asked time under the loop's matmuls (as the example does)
        x = torch.randn(args.batch, args.hidden, device=device, dtype=torch.bfloat16)
        times = []
        for _ in range(5):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))  # type: ignore[no-untyped-call]
            for layer in range(args.layers):
                torch.nn.functional.gelu(x @ up[layer]) @ down[layer]
            start.record()
            torch.cuda._sleep(1_000_000)  # type: ignore[no-untyped-call]
            end.record()
            for layer in range(args.layers):
                torch.nn.functional.gelu(x @ up[layer]) @ down[layer]
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000)
        spin = int(1_000_000 * args.spin_us / statistics.median(times))

    def decode(group: dist.ProcessGroup) -> None:
        x = torch.randn(args.batch, args.hidden, generator=torch.Generator().manual_seed(0)).to(device, torch.bfloat16)
        for _ in range(args.steps):
            for layer in range(args.layers):
                partial = torch.nn.functional.gelu(x @ up[layer]) @ down[layer]
                if spin and layer in spun:
                    torch.cuda._sleep(spin)  # type: ignore[no-untyped-call]
                dist.all_reduce(partial, group=group)
                x = torch.tanh(x + partial)
            if bool((x.abs().amax() > 1e4).item()):
                break

    def timed_run(group: dist.ProcessGroup) -> tuple[float, list[int]]:
        dist.barrier(group=plain)
        torch.cuda.synchronize()
        window = [time.time_ns()]
        decode(group)
        torch.cuda.synchronize()
        window.append(time.time_ns())
        return (window[1] - window[0]) / 1e3 / args.steps, window

    for group in (plain, timed):
        decode(group)  # warm-up
    torch.cuda.synchronize()
    unmeasured, recorded, windows, kernels = [], [], [], []
    for _ in range(args.rounds):
        unmeasured.append(timed_run(plain)[0])
        per_token, window = timed_run(timed)
        recorded.append(per_token)
        windows.append(window)
        dist.barrier(group=plain)
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as profile:
            decode(plain)
            torch.cuda.synchronize()
        events = [e for e in profile.events() if str(e.device_type).endswith("CUDA")]
        starts = sorted((e.time_range.start, e.time_range.end) for e in events if e.name.lower().startswith("nccl"))
        kernels.append(tuple((float(s), float(e)) for s, e in starts))
    time.sleep(0.5)  # the watchdog times the last collectives
    regions = []
    for window in windows:
        deadline = time.monotonic() + 2
        while True:
            inside, lost = recorded_in(window, stacks=False) or ([], False)
            if all(e.get("duration_ms") is not None for e in inside) or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        found = tuple(
            TimedCollective(str(e["process_group"][0]), int(e["collective_seq_id"]), e["time_created_ns"] / 1e3,
                            e["duration_ms"] * 1e3)
            for e in inside
            if e.get("duration_ms") is not None
        )  # fmt: skip
        regions.append(TimedRegion(args.steps, found, 0, lost, socket.gethostname()))
    mine = {"unmeasured": unmeasured, "recorded": recorded, "regions": regions, "kernels": kernels, "spin": spin}
    everyone: list[dict[str, Any] | None] = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        _report(args, everyone)  # type: ignore[arg-type]
    dist.destroy_process_group()


def _waits(found: CollectiveWaits | str | None) -> dict[str, Any]:
    if not isinstance(found, CollectiveWaits):
        return {"unmatched": str(found)}
    return {
        "wait_us_per_token": [round(w, 1) for w in found.wait_us],
        "straggler": found.straggler,
        "late_us_per_token": round(found.late_us, 1),
        "host_late_us_per_token": None if found.host_late_us is None else round(found.host_late_us, 1),
        "worst_wait_us": round(found.worst_wait_us, 1),
        "worst": found.worst,
        "matched": found.matched,
    }


def _report(args: argparse.Namespace, ranks: list[dict[str, Any]]) -> None:
    recorder = matched({r: Collectives(args.steps, (), (), 0, tuple(d["regions"])) for r, d in enumerate(ranks)})
    traced_runs = [
        matched({r: Collectives(args.steps, (), d["kernels"][i], 0) for r, d in enumerate(ranks)})
        for i in range(args.rounds)
    ]
    traced = [_waits(t) for t in traced_runs]
    result = {
        "host": socket.gethostname(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),  # type: ignore[no-untyped-call]
        "loop": {k: getattr(args, k) for k in ("hidden", "batch", "layers", "steps", "rounds", "spin_us", "spin_at")},
        "us_per_token": {
            f"rank {r}": {
                "unmeasured": round(statistics.median(d["unmeasured"]), 1),
                "flight recorder": round(statistics.median(d["recorded"]), 1),
            }
            for r, d in enumerate(ranks)
        },
        "waits, flight recorder (syncguard's default)": _waits(recorder),
        "waits, full trace (kernel durations, the profiler's clocks are not shared), per round": traced,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
