"""``syncguard device``: this machine's baseline slug and environment fingerprint."""

from __future__ import annotations

import argparse
import json

from ...environment import fingerprint, has_cuda_driver, slug_for


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    device = commands.add_parser("device", help="this machine's baseline slug and environment fingerprint")
    device.add_argument("--json", action="store_true", help="print as JSON")
    device.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    device = "cuda" if _cuda() else "cpu"
    data = {"slug": slug_for(device), **fingerprint(device)}
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print("\n".join(f"{key}: {'-' if value is None else value}" for key, value in data.items()))
    return 0


def _cuda() -> bool:
    """Whether torch sees a CUDA device (torch is loaded here only, and only where the CUDA driver is: the other
    commands run without it)."""
    if not has_cuda_driver():
        return False
    import torch

    return bool(torch.cuda.is_available())
