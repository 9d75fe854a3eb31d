"""On CUDA: the transfers signal counts every memcpy call between host and device memory in a region, torch's and
another library's (CuPy, an extension), with its direction, size and call site, at the CUDA API; its numbers agree
with the device's own records of the same loop (the memcpy activity records of the ``measure()``'s traced counting
run: ``copies_*``, ``copy_bytes_*``), and its budgets fail the loop that takes its logits to the host each step and
hold the one that keeps them on the device. Where a trace holds CUPTI, the budget says it was not counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_syncguard.probes.cuda_calls import CUDA_CALLS, transfer_counts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _transfers(fn: Any) -> list[tuple[str, int, str, int]]:
    """(direction, size, function, line in this file) of each transfer one call of ``fn`` made."""
    torch.cuda.synchronize()
    with CUDA_CALLS.counting() as watch:
        fn()
        torch.cuda.synchronize()
    assert watch.not_counted is None, watch.not_counted
    here = [t for t in watch.transfers if t.site is not None and Path(t.site.filename) == Path(__file__)]
    assert len(here) == len(watch.transfers), watch.transfers
    return [(t.direction, t.size, t.function, t.site.lineno) for t in here if t.site is not None]


def test_torchs_copies_count_each_with_its_direction_size_and_line() -> None:
    device = torch.ones(1000, device="cuda")  # 4000 B
    pinned = torch.ones(500).pin_memory()  # 2000 B
    pageable = torch.ones(250)  # 1000 B

    def case() -> None:
        device.cpu()
        pinned.to("cuda", non_blocking=True)
        pageable.cuda()
        device.clone()  # within the device: no transfer
        float(device[0])

    line = case.__code__.co_firstlineno
    assert [(d, s, line_ - line) for d, s, _, line_ in _transfers(case)] == [
        ("d2h", 4000, 1), ("h2d", 2000, 2), ("h2d", 1000, 3), ("d2h", 4, 5),
    ]  # fmt: skip


def test_a_regions_transfers_are_counted_with_their_largest_sites() -> None:
    device = torch.ones(1000, device="cuda")
    with CUDA_CALLS.counting() as watch:
        for _ in range(3):
            device.cpu()
    counts = transfer_counts(watch)
    assert {k: v for k, v in counts.values.items() if v} == {
        "transfers": 3, "transfer_bytes": 12000, "transfers_d2h": 3, "transfer_bytes_d2h": 12000,
    }  # fmt: skip
    ((label, calls),) = counts.top["transfers_d2h"]
    assert calls == 3 and "test_gpu_transfers.py" in label and "device-to-host, 4000 B" in label


LOOPS = r"""
import numpy as np
import pytest
import torch

STEPS = 16
WIDTH = 50_000  # 200 kB of float32 a step


def logits_to_host(w, x):  # the standard-API pattern: each step's logits come to the host as numpy
    for _ in range(STEPS):
        scores = (x @ w).cpu().numpy()  # TO HOST
        x = torch.from_numpy(np.tanh(scores[:, :256])).cuda()  # BACK


def logits_on_device(w, x):  # the same loop with the logits kept on the device (IO binding)
    for _ in range(STEPS):
        scores = x @ w
        x = torch.tanh(scores[:, :256])


@pytest.fixture(scope="module")
def weights():
    torch.manual_seed(0)
    return torch.randn(256, WIDTH, device="cuda") / 16, torch.randn(4, 256, device="cuda")


@pytest.mark.max_transfer_bytes_per_token(4096)
@pytest.mark.parametrize("loop", [logits_to_host, logits_on_device])
def test_torch(syncguard, weights, loop):
    syncguard.measure(lambda: loop(*weights), tokens=STEPS, repeat=2)


cupy = pytest.importorskip("cupy")


def cupy_to_host(a):
    for _ in range(STEPS):
        a += 1
        cupy.asnumpy(a)  # ASNUMPY


def cupy_from_host(h):
    for _ in range(STEPS):
        cupy.asarray(h)  # ASARRAY


def cupy_on_device(a):
    for _ in range(STEPS):
        a = a * 2 + 1


@pytest.mark.max_transfer_bytes_per_token(4096)
@pytest.mark.max_gpu_idle_us(1_000_000)  # a timeline budget: under the trace, every run is captured
def test_captured(syncguard, weights):
    syncguard.measure(lambda: logits_to_host(*weights), tokens=STEPS, repeat=2)


@pytest.mark.max_transfer_bytes_per_token(4096)
@pytest.mark.parametrize("name", ["cupy_to_host", "cupy_from_host", "cupy_on_device"])
def test_cupy(syncguard, name):
    arg = np.ones(WIDTH, np.float32) if name == "cupy_from_host" else cupy.ones(WIDTH, cupy.float32)
    loop = globals()[name]
    syncguard.measure(lambda: loop(arg), tokens=STEPS, repeat=2)
"""


@pytest.mark.parametrize("source", ["sampled", "trace"])
def test_budgets_fail_the_loops_that_move_data_each_step_and_agree_with_the_devices_records(
    pytester: pytest.Pytester, source: str
) -> None:
    """The timed runs count the transfers at the API, and the traced counting run records the same copies on the
    device: the two agree in count and bytes, each direction, for torch's loops and CuPy's, on either source. Under
    the trace a test with a timeline budget is captured whole: its transfer budget says it was not counted, and
    why."""
    written = pytester.makepyfile(test_loops=LOOPS)
    lines = {tag: i for i, text in enumerate(written.read_text().splitlines(), 1)
             for tag in ("TO HOST", "BACK", "ASNUMPY", "ASARRAY") if f"# {tag}" in text}  # fmt: skip
    result = pytester.runpytest_subprocess(
        "--syncguard", f"--syncguard-timeline={source}", "--syncguard-json=out.json", "-v", "-p", "no:cacheprovider"
    )
    out = result.stdout.str()
    print(out)
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads((pytester.path / "out.json").read_text())["tests"]}
    captured = tests.pop("test_captured")
    found = {name: t["metrics"]["values"] for name, t in tests.items()}
    print(json.dumps(found))
    if source == "trace":
        assert "transfer_bytes" not in captured["metrics"]["values"]
        (check,) = [c for c in captured["checks"] if c["budget"]["marker"] == "max_transfer_bytes_per_token"]
        assert check["held"] is None and "not measured: transfers are counted at the CUDA API" in check["text"]
    else:
        assert captured["metrics"]["values"]["transfer_bytes"] == found["test_torch[logits_to_host]"]["transfer_bytes"]
    for name, values in found.items():
        for way in ("h2d", "d2h"):  # the API's calls against the device's records of the same loop
            assert values[f"transfers_{way}"] == values[f"copies_{way}"], (name, way, values)
            assert values[f"transfer_bytes_{way}"] == values[f"copy_bytes_{way}"], (name, way, values)
    steps = 16
    assert found["test_torch[logits_to_host]"]["transfer_bytes_d2h"] == steps * 4 * 50_000 * 4
    assert found["test_torch[logits_to_host]"]["transfer_bytes_h2d"] == steps * 4 * 256 * 4
    assert found["test_torch[logits_on_device]"]["transfer_bytes"] == 0
    assert tests["test_torch[logits_to_host]"]["verdict"] == "fail"
    assert tests["test_torch[logits_on_device]"]["verdict"] == "pass"
    assert f"test_loops.py:{lines['TO HOST']} in logits_to_host: cudaMemcpyAsync, device-to-host, 800000 B" in out
    assert f"(called from test_loops.py:{lines['ASNUMPY']} in cupy_to_host): cudaMemcpyAsync, device-to-host" in out \
        or "test_cupy[cupy_to_host]" not in found  # fmt: skip
    if "test_cupy[cupy_to_host]" in found:
        assert found["test_cupy[cupy_to_host]"]["transfer_bytes_d2h"] == steps * 200_000
        assert found["test_cupy[cupy_from_host]"]["transfer_bytes_h2d"] == steps * 200_000
        assert found["test_cupy[cupy_on_device]"]["transfer_bytes"] == 0
        assert [tests[f"test_cupy[{n}]"]["verdict"] for n in ("cupy_to_host", "cupy_from_host", "cupy_on_device")] \
            == ["fail", "fail", "pass"]  # fmt: skip


COPY_FUNCTIONS = r"""
import ctypes

import pytest
import torch

from pytest_syncguard.probes.cuda_calls import Memcpy2D

STEPS = 8
ROWS, WIDTH, PITCH = 32, 512, 1024  # a 2D copy of 32 rows of 512 B out of rows of 1024 B
FLAT = 4096


def _runtime():
    with open("/proc/self/maps") as maps:
        return ctypes.CDLL(sorted({line.split()[-1] for line in maps if "/libcudart" in line})[0])


@pytest.fixture(scope="module")
def buffers():
    torch.cuda.init()
    device = torch.zeros(ROWS * PITCH, dtype=torch.uint8, device="cuda")
    pinned = torch.zeros(ROWS * PITCH, dtype=torch.uint8).pin_memory()
    pageable = torch.zeros(ROWS * PITCH, dtype=torch.uint8)
    return device, pinned, pageable


def _copies(device, pinned, pageable, which):
    runtime, driver = _runtime(), ctypes.CDLL("libcuda.so.1")
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    d, p, h = device.data_ptr(), pinned.data_ptr(), pageable.data_ptr()
    for _ in range(STEPS):
        if which == "cudaMemcpy2DAsync":  # pageable host -> device: 16 kB a step
            rc = runtime.cudaMemcpy2DAsync(ctypes.c_void_p(d), ctypes.c_size_t(PITCH), ctypes.c_void_p(h),
                                           ctypes.c_size_t(PITCH), ctypes.c_size_t(WIDTH), ctypes.c_size_t(ROWS),
                                           ctypes.c_int(1), stream)
        elif which == "cuMemcpyAsync":  # device -> page-locked host, unified addressing: 4 kB a step
            rc = driver.cuMemcpyAsync(ctypes.c_uint64(p), ctypes.c_uint64(d), ctypes.c_size_t(FLAT), stream)
        elif which == "cuMemcpy2D":  # device -> pageable host, synchronous
            copy = Memcpy2D.of((2, d), (1, h), WIDTH, ROWS, PITCH)
            rc = driver.cuMemcpy2D_v2(ctypes.byref(copy))
        else:  # page-locked host -> device, asynchronous
            copy = Memcpy2D.of((1, p), (2, d), WIDTH, ROWS, PITCH)
            rc = driver.cuMemcpy2DAsync_v2(ctypes.byref(copy), stream)
        assert rc == 0, (which, rc)
    torch.cuda.synchronize()


@pytest.mark.max_transfer_bytes_per_token(0)
@pytest.mark.parametrize("which", ["cudaMemcpy2DAsync", "cuMemcpyAsync", "cuMemcpy2D", "cuMemcpy2DAsync"])
def test_copy(syncguard, buffers, which):
    syncguard.measure(lambda: _copies(*buffers, which), tokens=STEPS, repeat=2)
"""


def test_the_runtimes_and_drivers_other_copy_functions_count_their_bytes_as_the_device_records_them(
    pytester: pytest.Pytester,
) -> None:
    """cudaMemcpy2DAsync, cuMemcpyAsync, cuMemcpy2D and cuMemcpy2DAsync, called through ctypes: each step's bytes
    counted at the API equal the device's memcpy records of the same loop (the traced counting run), each direction,
    and a budget of 0 bytes fails every one of them with its function named."""
    pytester.makepyfile(test_copies=COPY_FUNCTIONS)
    result = pytester.runpytest_subprocess("--syncguard", "--syncguard-json=out.json", "-v", "-p", "no:cacheprovider")
    out = result.stdout.str()
    print(out)
    tests = {
        t["nodeid"].split("[")[1].rstrip("]"): t for t in json.loads((pytester.path / "out.json").read_text())["tests"]
    }
    expected = {"cudaMemcpy2DAsync": ("h2d", 32 * 512), "cuMemcpyAsync": ("d2h", 4096), "cuMemcpy2D": ("d2h", 32 * 512),
                "cuMemcpy2DAsync": ("h2d", 32 * 512)}  # fmt: skip
    for which, (way, size) in expected.items():
        values = tests[which]["metrics"]["values"]
        print(which, {k: v for k, v in values.items() if "cop" in k or "transfer" in k})
        assert values[f"transfer_bytes_{way}"] == 8 * size, (which, values)
        assert values[f"transfers_{way}"] == values[f"copies_{way}"] == 8, (which, values)
        assert values[f"transfer_bytes_{way}"] == values[f"copy_bytes_{way}"], (which, values)
        assert tests[which]["verdict"] == "fail", which
        assert f"in _copies: {which}" in out, which
