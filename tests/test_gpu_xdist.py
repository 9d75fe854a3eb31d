"""On a machine with several GPUs: under ``-n N --syncguard`` each xdist worker takes its own GPU."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.gpu

WORKER_TEST = """
import json, os
from pathlib import Path
import pytest
import torch

@pytest.mark.parametrize("case", range(8))
def test_where(syncguard, case):
    with syncguard.generation(tokens=1):
        x = torch.ones(4, device="cuda")
        x.sum().item()
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    out = Path(os.environ["WHERE_DIR"]) / f"where-{os.environ['PYTEST_XDIST_WORKER']}-{case}.json"
    out.write_text(json.dumps({"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "uuid": uuid}))
"""


def test_each_worker_takes_its_own_gpu(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    gpus = torch.cuda.device_count()
    if gpus < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {gpus}")
    pytest.importorskip("xdist")
    pytester.makepyfile(test_where=WORKER_TEST)
    monkeypatch.setenv("WHERE_DIR", str(pytester.path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    result = pytester.runpytest_subprocess("-n", "2", "--syncguard", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=8)
    seen: dict[str, set[tuple[str, str]]] = {}
    for path in pytester.path.glob("where-gw*-*.json"):
        worker = path.name.split("-")[1]
        data = json.loads(path.read_text())
        seen.setdefault(worker, set()).add((data["visible"], data["uuid"]))
    print(seen)
    assert sorted(seen) == ["gw0", "gw1"]
    assert all(len(places) == 1 for places in seen.values())  # a worker stays on its GPU
    (gw0,), (gw1,) = seen["gw0"], seen["gw1"]
    assert gw0[0] == "0" and gw1[0] == "1" and gw0[1] != gw1[1]  # different physical GPUs
    result.stdout.no_fnmatch_line("*share*GPU*")
