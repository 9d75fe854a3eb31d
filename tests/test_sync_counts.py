"""CPU sync counts of each operation of the FACTS table, against what a GPU run blocks on.

The expected numbers are the CUDA runtime's sync calls for the same operation, measured on an H100;
tests/test_gpu.py checks the plugin's CUDA counts against the sync calls of a CUDA trace.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from pytest_syncguard.analysis.sites import group_sites
from pytest_syncguard.probes.syncs import PROBE, SyncRecorder

x = torch.linspace(-1, 1, 100)
mask = x > 0
ints = torch.randint(0, 10, (100,), generator=torch.Generator().manual_seed(0))
small = torch.tensor([1, 2, 3])
scalar = torch.tensor(3.0)
probs = torch.softmax(torch.randn(4, 50), -1)
flag = torch.tensor(True)


def assign(value: object) -> None:
    target = x.clone()
    target[mask] = value  # the syntax, through Tensor.__setitem__


CASES: dict[str, tuple[Callable[[], object], int]] = {
    "item": (lambda: x.sum().item(), 1),
    "bool": (lambda: bool(x.sum() > 0), 1),
    "int": (lambda: int(scalar), 1),
    "float": (lambda: float(scalar), 1),
    "fstring": (lambda: f"{scalar}", 1),
    "nonzero": (lambda: torch.nonzero(x), 1),
    "masked_select": (lambda: torch.masked_select(x, mask), 1),
    "unique": (lambda: torch.unique(ints), 1),
    "unique_consecutive": (lambda: torch.unique_consecutive(ints), 1),
    "unique_consecutive_dim": (lambda: torch.unique_consecutive(ints, dim=0), 2),
    "unique_consecutive_dim_2d": (lambda: torch.unique_consecutive(ints.view(10, 10), dim=0), 2),
    "unique_dim": (lambda: torch.unique(ints.view(10, 10), dim=0), 3),
    "where_one_arg": (lambda: torch.where(mask), 1),
    "argwhere": (lambda: torch.argwhere(mask), 1),
    "bool_mask_index": (lambda: x[mask], 1),
    "bool_mask_assign_scalar": (lambda: x.clone().__setitem__(mask, 0.0), 0),
    "bool_mask_assign_tensor": (lambda: x.clone().__setitem__(mask, x[mask] * 2), 2),
    # A Python number stays on the host in the GPU run (masked_fill_, no sync); a one-element tensor would be
    # computed on the device there (nonzero: one sync).
    "assign_python_number": (lambda: assign(2.0), 0),
    "assign_one_element_tensor": (lambda: assign(torch.tensor(2.0)), 1),
    "index_put_one_element_tensor": (lambda: x.clone().index_put_((mask,), torch.tensor(2.0)), 1),
    "repeat_interleave": (lambda: torch.repeat_interleave(small), 2),
    "repeat_interleave_output_size": (lambda: torch.repeat_interleave(small, output_size=6), 0),
    "repeat_interleave_dim": (lambda: torch.repeat_interleave(x[:3], small, dim=0), 2),
    "bincount": (lambda: torch.bincount(ints), 2),
    "histc_data_range": (lambda: torch.histc(x, bins=10), 2),
    "histc_given_range": (lambda: torch.histc(x, bins=10, min=-1, max=1), 0),
    "equal": (lambda: torch.equal(x, x.clone()), 1),
    "equal_shapes_differ": (lambda: torch.equal(x, x[:50]), 0),
    "equal_same_tensor": (lambda: torch.equal(x, x), 0),
    "assert_async": (lambda: torch._assert_async(flag), 0),
    "assert_async_msg": (lambda: torch._assert_async(flag, "must hold"), 0),
    "allclose": (lambda: torch.allclose(x, x.clone()), 1),
    "zeros_of_int": (lambda: torch.zeros(int(scalar)), 1),
    "arange_of_tensor": (lambda: torch.arange(scalar), 1),
    # The fill value's .item() is a sync when the value lives on the device: a CPU run cannot tell, and counts it.
    "masked_fill_tensor_value": (lambda: x.masked_fill(mask, torch.tensor(2.0)), 1),
    "argmax": (lambda: x.argmax(), 0),
    "multinomial": (lambda: torch.multinomial(probs, 1), 0),
    "any": (lambda: x.any(), 0),
    "all": (lambda: x.all(), 0),
    "topk": (lambda: x.topk(5), 0),
    "sort": (lambda: x.sort(), 0),
    "tolist_is_a_transfer": (lambda: x.tolist(), 0),
    "cpu_is_a_transfer": (lambda: x.cpu(), 0),
}


def count(fn: Callable[[], object]) -> SyncRecorder:
    recorder = SyncRecorder(on_device=False)
    with PROBE.recording(recorder):
        fn()
    return recorder


@pytest.mark.parametrize("name", sorted(CASES))
def test_cpu_count_predicts_the_gpu_run(name: str) -> None:
    fn, expected = CASES[name]
    assert count(fn).syncs == expected


def test_kinds_and_call_site() -> None:
    recorder = count(lambda: (x.sum().item(), x[mask]))
    assert [(e.kind, e.op) for e in recorder.events] == [
        ("scalar read", "aten::_local_scalar_dense"),
        ("data-dependent shape", "aten::nonzero"),
    ]
    site = recorder.events[0].site
    assert site is not None and site.filename == __file__ and site.function.endswith("<lambda>")


def _read_in_a_loop(steps: int) -> None:
    for _ in range(steps):
        x.sum().item()


def _caller_of_the_loop(steps: int) -> None:
    _read_in_a_loop(steps)


def test_each_site_keeps_the_stack_of_its_first_sync_in_every_region() -> None:
    outer, inner = SyncRecorder(False), SyncRecorder(False)
    with PROBE.recording(outer):
        _caller_of_the_loop(3)
        with PROBE.recording(inner):
            _caller_of_the_loop(2)
    loop_line = _read_in_a_loop.__code__.co_firstlineno + 2
    # Full stacks for the first read of each region (the inner region's first read is in both), the call site
    # alone for the others.
    for recorder, full in ((outer, [True, False, False, True, False]), (inner, [True, False])):
        stacks = [e.stack for e in recorder.events]
        assert [len(stack) > 1 for stack in stacks] == full
        assert {stack[0] for stack in stacks} == {stacks[0][0]}
        first = [(f.function, f.lineno) for f in stacks[0][:3]]
        assert first[:2] == [("_read_in_a_loop", loop_line), ("_caller_of_the_loop", loop_line + 4)]
        assert first[2][0] == "test_each_site_keeps_the_stack_of_its_first_sync_in_every_region"
        # what reports show: one site, with the first read's full stack
        (site,) = group_sites(recorder.events)
        assert (site.count, site.stack) == (len(full), stacks[0])


def test_kernels_are_removed_on_every_exit_path() -> None:
    key = ("aten::_local_scalar_dense", "BackendSelect")
    for error in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(error)), PROBE.recording(SyncRecorder(False)):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(*key)
            with PROBE.recording(SyncRecorder(False)):  # nested
                raise error
    assert not PROBE.installed and not PROBE.active
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(*key)
    recorder = count(lambda: x.sum().item())  # and it installs again afterwards
    assert recorder.syncs == 1


def test_nested_recorders_both_see_inner_syncs() -> None:
    outer, inner = SyncRecorder(False), SyncRecorder(False)
    with PROBE.recording(outer):
        x.sum().item()
        with PROBE.recording(inner):
            x.sum().item()
    assert (outer.syncs, inner.syncs) == (2, 1)


def test_measurement_never_changes_results() -> None:
    expected = [torch.unique(ints), x[mask], torch.repeat_interleave(small), torch.histc(x, bins=10)]
    with PROBE.recording(SyncRecorder(False)):
        measured = [torch.unique(ints), x[mask], torch.repeat_interleave(small), torch.histc(x, bins=10)]
    for a, b in zip(expected, measured, strict=True):
        torch.testing.assert_close(a, b)


def test_user_code_under_a_folder_named_torch_is_still_a_call_site(tmp_path: Path) -> None:
    project = tmp_path / "torch" / "project"
    project.mkdir(parents=True)
    (project / "decode.py").write_text("def step(t):\n    return t.sum().item()\n")
    script = (
        "import sys, torch\n"
        f"sys.path.insert(0, {str(project)!r})\n"
        "import decode\n"
        "from pytest_syncguard.probes.syncs import PROBE, SyncRecorder\n"
        "r = SyncRecorder(False)\n"
        "with PROBE.recording(r):\n"
        "    decode.step(torch.ones(2))\n"
        "print(r.events[0].site)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=os.environ)
    assert out.stdout.strip() == f"{project / 'decode.py'}:2 in step"


def test_setitem_wrapper_is_removed_and_leaves_results_alone() -> None:
    assert "__setitem__" not in torch.Tensor.__dict__
    expected = x.clone()
    expected[mask] = 2.0
    with PROBE.recording(SyncRecorder(False)):
        assert "__setitem__" in torch.Tensor.__dict__
        measured = x.clone()
        measured[mask] = 2.0
        measured[:2] = torch.tensor([5.0, 6.0])
    assert "__setitem__" not in torch.Tensor.__dict__
    torch.testing.assert_close(measured[2:], expected[2:])
    assert measured[:2].tolist() == [5.0, 6.0]


def test_copy_kernel_is_only_registered_with_cuda() -> None:
    with PROBE.recording(SyncRecorder(False)):
        registered = torch._C._dispatch_has_kernel_for_dispatch_key("aten::copy_", "BackendSelect")
    assert registered == torch.cuda.is_available()


def _assign_and_scale(t: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t[where] = 2.0
    t[0] = 5.0
    return t * 2


def test_setitem_under_torch_compile_is_the_plain_method() -> None:
    """torch.compile traces an assignment as the tensor operation, not through the probe's ``__setitem__``
    wrapper: no graph break (fullgraph would raise), the same result."""
    compiled = torch.compile(_assign_and_scale, backend="eager", fullgraph=True)
    recorder = SyncRecorder(False)
    with PROBE.recording(recorder):
        measured = compiled(x, mask)
    torch.testing.assert_close(measured, _assign_and_scale(x, mask))
    assert recorder.syncs == 0
