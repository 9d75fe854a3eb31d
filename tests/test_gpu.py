"""On CUDA, the plugin's count equals the CUDA runtime's own sync calls in a profiler trace."""

from __future__ import annotations

import sys
import warnings
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from pytest_syncguard.probes.sync_ops import SyncKind
from pytest_syncguard.probes.syncs import PROBE, SyncRecorder

pytestmark = pytest.mark.gpu

RUNTIME_SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def runtime_and_plugin(fn: Callable[[], object]) -> tuple[int, SyncRecorder, Counter[str]]:
    """Runtime sync calls of ``fn`` (less the profiler's own) and the plugin's record of the same run."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as empty:
        pass
    baseline = sum(1 for e in empty.events() if e.name in RUNTIME_SYNCS)
    recorder = SyncRecorder(on_device=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof, PROBE.recording(recorder):
        fn()
    names = Counter(e.name for e in prof.events())
    return sum(names[n] for n in RUNTIME_SYNCS) - baseline, recorder, names


def cases() -> dict[str, Callable[[], object]]:
    dev = "cuda"
    x = torch.randn(1000, device=dev)
    y = x.clone()
    mask = x > 0
    pinned = torch.empty(1000).pin_memory()
    pageable = torch.empty(1000)
    small = torch.tensor([1, 2, 3], device=dev)
    scalar = torch.tensor(3.0, device=dev)
    ints = torch.randint(0, 10, (100,), device=dev)
    event = torch.cuda.Event()
    event.record()
    stream = torch.cuda.Stream()
    probs = torch.softmax(torch.randn(4, 50, device=dev), -1)
    flag = torch.tensor(True, device=dev)
    host_scalar = torch.tensor(2.0)

    def assign(target: torch.Tensor, value: object) -> None:
        target[mask] = value  # the syntax, through Tensor.__setitem__

    def put(target: torch.Tensor, value: object) -> None:
        target[0] = value

    return {
        "item": lambda: x.sum().item(),
        "bool": lambda: bool(x.sum() > 0),
        "int": lambda: int(scalar),
        "float": lambda: float(scalar),
        "fstring": lambda: f"{scalar}",
        "tolist": lambda: x.tolist(),
        "cpu": lambda: x.cpu(),
        "to_cpu": lambda: x.to("cpu"),
        "to_cpu_non_blocking": lambda: x.to("cpu", non_blocking=True),
        "copy_to_pageable": lambda: pageable.copy_(x),
        "copy_to_pinned": lambda: pinned.copy_(x),
        "copy_to_pinned_non_blocking": lambda: pinned.copy_(x, non_blocking=True),
        "h2d_pageable": lambda: pageable.to(dev),
        "h2d_pinned": lambda: pinned.to(dev),
        "h2d_pinned_non_blocking": lambda: pinned.to(dev, non_blocking=True),
        "tensor_factory": lambda: torch.tensor([1, 2, 3], device=dev),
        "nonzero": lambda: torch.nonzero(x),
        "masked_select": lambda: torch.masked_select(x, mask),
        "unique": lambda: torch.unique(ints),
        "unique_dim": lambda: torch.unique(ints.view(10, 10), dim=0),
        "unique_consecutive": lambda: torch.unique_consecutive(ints),
        "where_one_arg": lambda: torch.where(mask),
        "bool_mask_index": lambda: x[mask],
        "bool_mask_assign_scalar": lambda: y.__setitem__(mask, 0.0),
        "bool_mask_assign_tensor": lambda: y.__setitem__(mask, x[mask] * 2),
        "bool_mask_assign_device_scalar": lambda: y.__setitem__(mask, scalar),
        "masked_fill_device_value": lambda: x.masked_fill(mask, scalar),
        "repeat_interleave": lambda: torch.repeat_interleave(small),
        "repeat_interleave_output_size": lambda: torch.repeat_interleave(small, output_size=6),
        "bincount": lambda: torch.bincount(ints),
        "histc_data_range": lambda: torch.histc(x, bins=10),
        "histc_given_range": lambda: torch.histc(x, bins=10, min=-1, max=1),
        "equal": lambda: torch.equal(x, y),
        "equal_shapes_differ": lambda: torch.equal(x, x[:50]),
        "equal_same_tensor": lambda: torch.equal(x, x),
        "assert_async": lambda: torch._assert_async(flag),
        "assert_async_msg": lambda: torch._assert_async(flag, "must hold"),
        "unique_consecutive_dim": lambda: torch.unique_consecutive(ints, dim=0),
        "unique_consecutive_dim_2d": lambda: torch.unique_consecutive(ints.view(10, 10), dim=0),
        "assign_python_number": lambda: assign(y, 2.0),
        "assign_device_tensor": lambda: assign(y, scalar),
        "assign_host_tensor": lambda: assign(y, host_scalar),
        "copy_host_scalar_into_device": lambda: y[:1].copy_(host_scalar),
        "copy_empty": lambda: pageable[:0].copy_(x[:0]),
        "copy_python_number_into_device": lambda: torch.ops.aten.copy_.default(y[:1], 5),
        "put_python_number": lambda: put(y, 5.0),
        "put_host_tensor": lambda: put(y, host_scalar),
        "allclose": lambda: torch.allclose(x, x.clone()),
        "zeros_of_int": lambda: torch.zeros(int(scalar)),
        "stream_synchronize": lambda: stream.synchronize(),
        "current_stream_synchronize": lambda: torch.cuda.current_stream().synchronize(),
        "cuda_synchronize": lambda: torch.cuda.synchronize(),
        "accelerator_synchronize": lambda: torch.accelerator.synchronize(),
        "event_synchronize": lambda: event.synchronize(),
        "argmax": lambda: x.argmax(),
        "multinomial": lambda: torch.multinomial(probs, 1),
        "any": lambda: x.any(),
        "all": lambda: x.all(),
        "topk": lambda: x.topk(5),
    }


CASE_NAMES = [
    "item", "bool", "int", "float", "fstring", "tolist", "cpu", "to_cpu", "to_cpu_non_blocking",
    "copy_to_pageable", "copy_to_pinned", "copy_to_pinned_non_blocking", "h2d_pageable", "h2d_pinned",
    "h2d_pinned_non_blocking", "tensor_factory", "nonzero", "masked_select", "unique", "unique_dim",
    "unique_consecutive", "where_one_arg", "bool_mask_index", "bool_mask_assign_scalar",
    "bool_mask_assign_tensor", "bool_mask_assign_device_scalar", "masked_fill_device_value",
    "repeat_interleave", "repeat_interleave_output_size", "bincount", "histc_data_range",
    "histc_given_range", "equal", "equal_shapes_differ", "equal_same_tensor", "assert_async", "assert_async_msg",
    "unique_consecutive_dim", "unique_consecutive_dim_2d", "assign_python_number", "assign_device_tensor",
    "assign_host_tensor", "copy_host_scalar_into_device", "copy_empty", "copy_python_number_into_device",
    "put_python_number", "put_host_tensor", "allclose", "zeros_of_int", "stream_synchronize",
    "current_stream_synchronize", "cuda_synchronize", "accelerator_synchronize", "event_synchronize",
    "argmax", "multinomial", "any", "all", "topk",
]  # fmt: skip


@pytest.mark.parametrize("name", CASE_NAMES)
def test_count_equals_runtime_sync_calls(name: str) -> None:
    runtime, recorder, _ = runtime_and_plugin(cases()[name])
    print(f"{name}: runtime {runtime}, plugin {recorder.syncs} {[(e.kind, e.op) for e in recorder.events]}")
    assert recorder.syncs == runtime


@pytest.mark.parametrize(
    ("name", "fn"),
    [
        ("h2d_pageable_non_blocking", lambda x, host: host.to("cuda", non_blocking=True)),
        ("copy_from_pageable_non_blocking", lambda x, host: x.copy_(host, non_blocking=True)),
        ("copy_to_pageable_non_blocking", lambda x, host: host.copy_(x, non_blocking=True)),
    ],
)
def test_non_blocking_copy_with_pageable_memory_is_a_stall_no_sync_call_shows(
    name: str, fn: Callable[[torch.Tensor, torch.Tensor], object]
) -> None:
    x, host = torch.randn(1000, device="cuda"), torch.empty(1000)
    runtime, recorder, names = runtime_and_plugin(lambda: fn(x, host))
    assert runtime == 0
    assert any("Pageable" in n for n in names), "the trace shows a copy through pageable memory"
    assert [(e.kind, e.syncs) for e in recorder.events] == [(SyncKind.PAGEABLE_NON_BLOCKING.value, 1)]


def test_hf_generate_count_equals_runtime_sync_calls() -> None:
    pytest.importorskip("transformers")
    from examples.models import tiny_llama

    model = tiny_llama("cuda")
    prompt = torch.randint(1, 256, (1, 8), device="cuda")

    def generate() -> object:
        with torch.inference_mode():
            return model.generate(prompt, max_new_tokens=64, min_new_tokens=64, do_sample=False)

    runtime, recorder, _ = runtime_and_plugin(generate)
    kinds = Counter(e.kind for e in recorder.events for _ in range(e.syncs))
    print(f"hf generate: runtime {runtime}, plugin {recorder.syncs} {dict(kinds)}")
    assert runtime >= 64
    assert recorder.syncs == runtime


def global_state() -> tuple[object, ...]:
    return (
        torch.cuda.synchronize, torch.cuda.Stream.synchronize, torch.cuda.Event.synchronize,
        torch.cuda.get_sync_debug_mode(), warnings.showwarning, list(warnings.filters),
        "__setitem__" in torch.Tensor.__dict__,
        torch._C._dispatch_has_kernel_for_dispatch_key("aten::copy_", "BackendSelect"),
    )  # fmt: skip


def test_every_switch_is_restored_on_every_exit_path() -> None:
    before = global_state()
    for error in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(error)), PROBE.recording(SyncRecorder(True)):
            assert torch.cuda.synchronize is not before[0]
            assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::copy_", "BackendSelect")
            with PROBE.recording(SyncRecorder(True)):
                raise error
        assert global_state() == before


def _three_copies(x: torch.Tensor) -> None:
    for _ in range(3):
        x.cpu()


@pytest.mark.parametrize("hide", ["simplefilter_ignore", "catch_warnings_record", "torch_ops_aten"])
def test_code_under_test_cannot_hide_blocking_copies(hide: str) -> None:
    x = torch.randn(10, device="cuda")
    recorder = SyncRecorder(on_device=True)
    with warnings.catch_warnings(), PROBE.recording(recorder):
        if hide == "simplefilter_ignore":
            warnings.simplefilter("ignore")
            _three_copies(x)
        elif hide == "catch_warnings_record":
            with warnings.catch_warnings(record=True):
                _three_copies(x)
        else:
            for _ in range(3):
                torch.ops.aten._to_copy(x, device="cpu")
    assert [(e.kind, e.syncs) for e in recorder.events] == [(SyncKind.BLOCKING_COPY.value, 1)] * 3


@pytest.mark.parametrize("mode", ["warn", "error"])
def test_the_users_sync_debug_mode_is_kept_and_still_reports(mode: str) -> None:
    x = torch.randn(10, device="cuda")
    torch.cuda.set_sync_debug_mode(mode)
    try:
        recorder = SyncRecorder(on_device=True)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with PROBE.recording(recorder):
                if mode == "warn":
                    x.cpu()
                    x.sum().item()
                else:
                    with pytest.raises(RuntimeError, match="synchronizing"):
                        x.cpu()
                assert torch.cuda.get_sync_debug_mode() == (1 if mode == "warn" else 2)
        assert torch.cuda.get_sync_debug_mode() == (1 if mode == "warn" else 2)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    if mode == "warn":
        assert [e.kind for e in recorder.events] == [SyncKind.BLOCKING_COPY.value, SyncKind.SCALAR_READ.value]
        assert sum("synchronizing CUDA operation" in str(w.message) for w in seen) >= 2


def test_blocking_copy_call_site_is_the_callers_line() -> None:
    x = torch.randn(10, device="cuda")
    recorder = SyncRecorder(on_device=True)
    line = sys._getframe().f_lineno + 2
    with PROBE.recording(recorder):
        x.tolist()
    site = recorder.events[0].site
    assert site is not None and (site.filename, site.lineno) == (__file__, line)
