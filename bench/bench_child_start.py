"""What syncguard's start-up hook for a measured test's children (:mod:`pytest_syncguard.probes.children`) adds to
a child process's start: ``python -c CODE`` started with and without the hook (``PYTHONPATH`` led by the hook's
folder and a folder for the child's file, as a measured test sets them), the two interleaved in rounds; per CODE, the
median wall time of each and their ratio. CODE is ``pass`` (the hook alone: the child imports no torch, so no probe
is installed) and ``import torch`` then one host read (the probe installed after torch loads, and one sync written),
and on a GPU machine one host read of a CUDA tensor (the CUDA-call watch held too).

Run from the repository root: ``python -m bench.bench_child_start [--rounds N]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from pytest_syncguard.probes.child import FOLDER_VARIABLE
from pytest_syncguard.probes.children import STARTUP

CODES = {"pass": "pass", "import torch, one host read": "import torch; torch.ones(2).sum().item()"}
#: On a GPU machine, a child that reads the device once: its probe then also holds the CUDA-call watch (CUPTI).
ON_CUDA = {"import torch, one host read of a CUDA tensor": "import torch; torch.ones(2, device='cuda').sum().item()"}


def _start(code: str, environment: dict[str, str]) -> float:
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=environment, check=True)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    rounds = parser.parse_args().rounds
    plain = {k: v for k, v in os.environ.items() if k not in (FOLDER_VARIABLE, "PYTHONPATH")}
    plain["PYTHONPATH"] = os.getcwd()
    print(f"# {platform.node()}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; {rounds} rounds, the two variants alternating")  # fmt: skip
    import torch

    for name, code in {**CODES, **(ON_CUDA if torch.cuda.is_available() else {})}.items():
        with tempfile.TemporaryDirectory() as folder:
            hooked = {**plain, FOLDER_VARIABLE: folder, "PYTHONPATH": f"{STARTUP}{os.pathsep}{os.getcwd()}"}
            times: dict[str, list[float]] = {"without": [], "with the hook": []}
            for index in range(rounds):
                order = ("without", "with the hook") if index % 2 == 0 else ("with the hook", "without")
                for variant in order:
                    times[variant].append(_start(code, plain if variant == "without" else hooked))
        without, hooked_s = statistics.median(times["without"]), statistics.median(times["with the hook"])
        print(f"{name}: without {without * 1000:.0f} ms, with the hook {hooked_s * 1000:.0f} ms, "
              f"x{hooked_s / without:.3f} (+{(hooked_s - without) * 1000:.0f} ms)")  # fmt: skip


if __name__ == "__main__":
    main()
