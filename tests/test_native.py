"""The native kernels (scalar reads, copies) record exactly what the Python kernels record, and leave nothing behind.

Each scenario runs twice in one process, once per kernel, and the recorded events (kind, op, count, call
site, short stack, allowed) must be equal. ``.ci/run`` sets ``SYNCGUARD_NATIVE=1``, so there a kernel that
cannot be built fails these tests instead of skipping them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest
import torch

from pytest_syncguard.analysis.sites import SyncEvent
from pytest_syncguard.probes import native, syncs
from pytest_syncguard.probes.syncs import PROBE, SyncRecorder

pytestmark = pytest.mark.skipif(
    native.NATIVE.load() is None, reason=f"native kernel unavailable: {native.NATIVE.unavailable}"
)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@contextmanager
def python_kernel() -> Iterator[None]:
    saved = native.NATIVE._module
    native.NATIVE._module = None
    try:
        yield
    finally:
        native.NATIVE._module = saved


def record(scenario: Callable[[], object], on_device: bool) -> list[SyncEvent]:
    recorder = SyncRecorder(on_device=on_device)
    with PROBE.recording(recorder):
        scenario()
    return recorder.events


def both(scenario: Callable[[], object], on_device: bool = False) -> tuple[list[SyncEvent], list[SyncEvent]]:
    """The events of ``scenario`` under the native kernel, then under the Python kernel (from the same line,
    so that the stacks can be equal)."""
    events = []
    for kernel in (nullcontext, python_kernel):
        with kernel():
            events.append(record(scenario, on_device))
        assert syncs.PROBE._native is None and not PROBE.installed
    return events[0], events[1]


def _inner(t: torch.Tensor) -> float:
    return t.sum().item()


def _middle(t: torch.Tensor) -> float:
    return _inner(t) + _inner(t * 2)


def _decode_like(device: str) -> None:
    t = torch.arange(6.0, device=device)
    for step in range(4):
        _middle(t + step)
        if bool((t > step).any()):
            int(t[step])
        with PROBE.allowing():
            _inner(t)
        torch.nonzero(t > 2)  # a Python-kernel sync between queued native reads: order is kept
    float(torch.tensor(1.5))  # a host tensor: counted on CPU runs only


@pytest.mark.parametrize("device", DEVICES)
def test_same_events_as_the_python_kernel(device: str) -> None:
    native_events, python_events = both(lambda: _decode_like(device), on_device=device != "cpu")
    assert native_events == python_events
    assert sum(e.syncs for e in native_events) == 4 * 6 + (device == "cpu")
    assert any(e.allowed for e in native_events) and any(len(e.stack) > 2 for e in native_events)


def _transfers() -> None:
    device = torch.arange(4.0, device="cuda")
    pageable, pinned = torch.zeros(4), torch.zeros(4).pin_memory()
    for _ in range(2):
        device.cpu()  # blocking
        pageable.to("cuda")  # blocking
        pageable.copy_(device, non_blocking=True)  # pageable: stalls
        pinned.copy_(device, non_blocking=True)  # no wait
        device.copy_(pinned, non_blocking=True)  # no wait
        device[:0].cpu()  # nothing to copy
        (device * 2).sum()  # device to device
        device + 1  # a Python number: no transfer


def _numbers_into_device() -> None:
    device = torch.arange(4.0, device="cuda")
    torch.ops.aten.copy_.default(device[:1], 5)  # a wrapped number: the Python kernel gets 5, the native a tensor
    device[0] = 5.0
    device[1] = torch.tensor(6.0)


@pytest.mark.gpu
def test_same_events_for_transfers() -> None:
    native_events, python_events = both(_transfers, on_device=True)
    assert native_events == python_events
    assert [(e.kind, e.op) for e in native_events] == [
        ("host<->device copy", "aten::copy_"),
        ("host<->device copy", "aten::copy_"),
        ("non_blocking copy with pageable memory", "aten::copy_"),
    ] * 2
    native_events, python_events = both(_numbers_into_device, on_device=True)
    assert native_events == python_events


def test_same_events_in_nested_regions() -> None:
    def scenario(events: dict[str, list[SyncEvent]]) -> None:
        outer, inner = SyncRecorder(on_device=False), SyncRecorder(on_device=False)
        with PROBE.recording(outer):
            _middle(torch.ones(3))
            with PROBE.recording(inner):
                _middle(torch.ones(3))
            _inner(torch.ones(3))
        events.update(outer=outer.events, inner=inner.events)

    native_events: dict[str, list[SyncEvent]] = {}
    python_events: dict[str, list[SyncEvent]] = {}
    for kernel, events in ((nullcontext, native_events), (python_kernel, python_events)):
        with kernel():
            scenario(events)
    assert native_events == python_events
    assert [sum(e.syncs for e in native_events[k]) for k in ("outer", "inner")] == [5, 2]


def test_same_events_from_another_thread() -> None:
    def scenario() -> None:
        worker = threading.Thread(target=_middle, args=(torch.ones(2),))
        worker.start()
        worker.join()
        _inner(torch.ones(2))

    native_events, python_events = both(scenario)
    assert native_events == python_events
    assert sum(e.syncs for e in native_events) == 3


def test_same_events_for_hf_generate() -> None:
    transformers = pytest.importorskip("transformers")
    from examples.models import tiny_llama

    assert transformers
    model = tiny_llama("cpu")
    prompt = torch.randint(1, 256, (1, 8), generator=torch.Generator().manual_seed(0))

    def generate() -> None:
        with torch.inference_mode():
            model.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)

    native_events, python_events = both(generate)
    assert native_events == python_events
    assert sum(e.syncs for e in native_events) >= 8


def test_a_failing_read_records_nothing_and_leaves_no_kernel() -> None:
    sparse = torch.ones(1).to_sparse()

    def scenario() -> None:
        with pytest.raises(NotImplementedError, match="from the 'SparseCPU' backend"):
            torch.ops.aten._local_scalar_dense(sparse)
        _inner(torch.ones(1))

    native_events, python_events = both(scenario)
    assert native_events == python_events
    assert sum(e.syncs for e in native_events) == 1
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_local_scalar_dense", "BackendSelect")


def test_reads_outside_a_region_are_not_queued() -> None:
    module = native.NATIVE.load()
    assert module is not None
    with PROBE.recording(SyncRecorder(on_device=False)):
        pass
    _inner(torch.ones(1))
    assert module.pending() == 0 and not PROBE.installed


def test_the_environment_variable_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.ENVIRONMENT, "sometimes")
    with pytest.raises(native.NativeKernelError, match="SYNCGUARD_NATIVE='sometimes'"):
        native.NativeKernel().load()
    monkeypatch.setenv(native.ENVIRONMENT, "0")
    off = native.NativeKernel()
    assert off.load() is None
    assert off.unavailable == "switched off by SYNCGUARD_NATIVE=0"


BUDGETED = """
import pytest, torch

@pytest.mark.max_syncs(1)
def test_reads():
    torch.ones(1).item()
"""


@pytest.mark.parametrize("setting", ["auto", "1"])
def test_a_kernel_that_cannot_be_built(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    """Auto: the Python kernel counts, and the summary says why; required: the test errors, naming the variable."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(pytester.path / "extensions"))
    monkeypatch.setenv("CXX", "/bin/false")  # the compiler fails
    monkeypatch.setenv(native.ENVIRONMENT, setting)
    pytester.makepyfile(BUDGETED)
    result = pytester.runpytest_subprocess("--syncguard")
    if setting == "auto":
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines(
            ["*the native kernels could not be built*scalar reads and copies were counted by the Python kernels "
             "(same counts, slower)*"]
        )  # fmt: skip
    else:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*NativeKernelError: syncguard: the native kernels could not be built*"])


UNBUILT = """
import os
import pytest
import torch

EXTRA = os.environ.get("EXTRA") == "1"


@pytest.mark.max_ops_per_token(100)
def test_loop(syncguard):
    x = torch.ones(4)

    def loop():
        y = x
        for _ in range(5):
            y = y * 1.0
            if EXTRA:
                y = y + 0.0  # one more operator per step

    syncguard.measure(loop, tokens=5, repeat=2)
"""


def test_an_extension_that_cannot_be_built_leaves_every_counter_it_feeds_not_measured(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no compiler (CXX=/nonexistent/c++), an extra operator per step read "unchanged" against the baseline
    and the note spoke of scalar reads only. Now the baseline compare says "not measured", the budget on operators
    is unmeasured, and the note names every counter the extension feeds, the cause and the fix."""
    pytester.makepyfile(test_loop=UNBUILT)
    recorded = pytester.runpytest_subprocess("--syncguard", "--syncguard-baselines", "b",
                                             "--syncguard-update-baselines", "-p", "no:cacheprovider")  # fmt: skip
    recorded.assert_outcomes(passed=1)
    monkeypatch.setenv("SYNCGUARD_NATIVE", "auto")  # .ci/run requires the build: here it must fail quietly
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(pytester.path / "no-extensions"))
    monkeypatch.setenv("EXTRA", "1")
    result = pytester.runpytest_subprocess("--syncguard", "--syncguard-baselines", "b", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)  # its one budget could not be measured
    result.stdout.fnmatch_lines(["*test_loop.py::test_loop*not measured*NOT MEASURED*"])
    result.stdout.fnmatch_lines([
        "*the native kernels could not be built (*/nonexistent/c++: not found)*operators were not counted (ops "
        "and ops_per_token read not measured*Fix: install a C++ compiler*",
    ])  # fmt: skip
    result.stderr.fnmatch_lines(["*syncguard: building the native kernels*"])


def test_another_checkout_of_the_same_sources_loads_this_build_without_building(tmp_path: Path) -> None:
    """The build is named by the torch installation and the sources' content, and built from copies in the
    builder's cache: a second checkout of the same torch (here a copy of the package) finds it built and loads it,
    as the message promises ("once per machine, torch installation and sources"), instead of 59 s of building on the
    2-core machine."""
    copy = tmp_path / "checkout"
    shutil.copytree(Path(native.__file__).parents[2], copy / "pytest_syncguard")
    script = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); from pytest_syncguard.probes import native; "
        "name = native._name(); built = native._built(name); start = time.monotonic(); "
        "assert native.NATIVE.load() is not None, native.NATIVE.unavailable; "
        "print(native.__file__, name, built, round(time.monotonic() - start, 1))"
    )
    done = subprocess.run([sys.executable, "-c", script, str(copy)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    where, name, built, _ = done.stdout.split()
    assert where.startswith(str(copy)) and name == native._name() and built == "True"
    assert "building the native kernels" not in done.stderr
