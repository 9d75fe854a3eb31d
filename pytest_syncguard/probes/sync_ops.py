"""The catalogue of operators that make the host wait for the device, and how many times each one does.

Each entry is a dispatcher operator together with a rule that says, from the operator's arguments, how many
blocking host-device synchronizations a CUDA run of it performs and of which kind. The counts were calibrated
against the CUDA runtime (``cudaStreamSynchronize``/``cudaDeviceSynchronize``/``cudaEventSynchronize`` calls in
a profiler trace) and are checked that way by ``tests/test_gpu.py``.

Only the outermost catalogued operator of a call is counted: ``masked_select`` calls ``nonzero`` inside, and
``repeat_interleave`` calls ``.item()`` twice inside, on CPU and CUDA alike; the rule of the outer operator
already says what the whole call costs on the GPU. This is what lets a CPU run predict a GPU run exactly.
``copy_`` is catalogued for device runs only: on CUDA it is how transfers are counted (a blocking one, or a
``non_blocking`` one through pageable memory), on a CPU-only run there is no transfer to count.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch


class SyncKind(enum.StrEnum):
    """Why the host waited for the device."""

    SCALAR_READ = "scalar read"
    DATA_DEPENDENT_SHAPE = "data-dependent shape"
    BLOCKING_COPY = "host<->device copy"
    PAGEABLE_NON_BLOCKING = "non_blocking copy with pageable memory"
    EXPLICIT = "explicit synchronize"
    CUDA_CALL = "CUDA call outside torch"
    """A host-blocking CUDA runtime or driver call that torch's operators did not make (an extension, ctypes, the
    driver API); its op is the CUDA function (:mod:`.cuda_calls`)."""


#: The kinds a CPU run can count; the rest exist only where a device and host are distinct.
CPU_VISIBLE_KINDS = frozenset({SyncKind.SCALAR_READ, SyncKind.DATA_DEPENDENT_SHAPE})

Args = Sequence[Any]
Kwargs = Mapping[str, Any]
#: A rule returns how many syncs of what kind the call makes, given whether the run has a real device.
Rule = Callable[[Args, Kwargs, bool], "tuple[int, SyncKind] | None"]


def _arg(args: Args, kwargs: Kwargs, index: int, name: str, default: Any = None) -> Any:
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


def _on_host(tensor: torch.Tensor) -> bool:
    return tensor.is_cpu


def _scalar_read(args: Args, kwargs: Kwargs, on_device: bool) -> tuple[int, SyncKind] | None:
    # On a device run, reading a host tensor (e.g. a wrapped Python scalar) costs nothing.
    if on_device and _on_host(args[0]):
        return None
    return 1, SyncKind.SCALAR_READ


def _fixed(count: int, kind: SyncKind) -> Rule:
    def rule(args: Args, kwargs: Kwargs, on_device: bool) -> tuple[int, SyncKind] | None:
        if on_device and _on_host(args[0]):
            return None
        return count, kind

    return rule


def _repeat_interleave(args: Args, kwargs: Kwargs, on_device: bool) -> tuple[int, SyncKind] | None:
    # Without output_size the kernel reads the total and checks the repeats: two scalar reads on CUDA.
    if (on_device and _on_host(args[0])) or _arg(args, kwargs, 1, "output_size") is not None:
        return None
    return 2, SyncKind.DATA_DEPENDENT_SHAPE


def _histc(args: Args, kwargs: Kwargs, on_device: bool) -> tuple[int, SyncKind] | None:
    # With min == max the range is computed from the data and copied to the host twice (min, then max).
    low, high = _arg(args, kwargs, 2, "min", 0), _arg(args, kwargs, 3, "max", 0)
    if (on_device and _on_host(args[0])) or low != high:
        return None
    return 2, SyncKind.DATA_DEPENDENT_SHAPE


class _AssignedValue(threading.local):
    """Per thread: whether the ``tensor[index] = value`` running now was given a Python number (set by the
    probe's ``Tensor.__setitem__`` wrapper). A number stays on the host in a GPU run too; a tensor a CPU run
    computed would live on the device."""

    python_number = False


ASSIGNED_VALUE = _AssignedValue()


def _is_mask(index: Any) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


def _index_put(args: Args, kwargs: Kwargs, on_device: bool) -> tuple[int, SyncKind] | None:
    # Each boolean mask becomes indices through nonzero, except one mask filled with a one-element host value,
    # which ATen turns into masked_fill_ with the value read on the host (no sync). On a CPU run every value
    # is on the host: only a Python number would stay there in the GPU run.
    self, indices, values = args[0], args[1], args[2]
    accumulate = bool(_arg(args, kwargs, 3, "accumulate", False))
    if on_device and _on_host(self):
        return None
    masks = sum(1 for index in indices if _is_mask(index))
    host_value = _on_host(values) if on_device else ASSIGNED_VALUE.python_number
    as_masked_fill = not accumulate and len(indices) == 1 and masks == 1 and values.numel() == 1 and host_value
    if masks == 0 or as_masked_fill:
        return None
    return masks, SyncKind.DATA_DEPENDENT_SHAPE


def _equal(args: Args, kwargs: Kwargs, on_device: bool) -> tuple[int, SyncKind] | None:
    # CUDA answers without reading the device when the shapes differ, a tensor is empty, or both are views of
    # the same memory; otherwise it reads the result of a comparison.
    self, other = args[0], args[1]
    if (on_device and _on_host(self)) or self.shape != other.shape or self.numel() == 0:
        return None
    same = _same_view(self, other) and (self.dtype, self.is_neg(), self.is_conj()) == (
        other.dtype,
        other.is_neg(),
        other.is_conj(),
    )
    return None if same else (1, SyncKind.SCALAR_READ)


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a.is_set_to(b)`` for tensors of one shape, without dispatching an operator: the probe adds none to the
    operators it counts."""
    return (
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and a.device == b.device
        and a.storage_offset() == b.storage_offset()
        and a.stride() == b.stride()
    )


def _unique_consecutive(args: Args, kwargs: Kwargs, on_device: bool) -> tuple[int, SyncKind] | None:
    # With a dim, CUDA takes the unique_dim path: two reads of the device (one without).
    if on_device and _on_host(args[0]):
        return None
    return (1 if _arg(args, kwargs, 3, "dim") is None else 2), SyncKind.DATA_DEPENDENT_SHAPE


def _copy(args: Args, kwargs: Kwargs, on_device: bool) -> tuple[int, SyncKind] | None:
    # A transfer between host and device memory: a blocking one always waits (memcpy_and_sync); a non_blocking
    # one waits when its host memory is pageable (the driver stalls; no sync call shows in a trace).
    # The native kernel's copy_wait is the same rule.
    self, src = args[0], args[1]
    non_blocking = bool(_arg(args, kwargs, 2, "non_blocking", False))
    if self.is_cpu == src.is_cpu or self.is_meta or src.is_meta or self.numel() == 0:
        return None
    if not non_blocking:
        return 1, SyncKind.BLOCKING_COPY
    host = self if self.is_cpu else src
    return None if host.is_pinned() else (1, SyncKind.PAGEABLE_NON_BLOCKING)


_NUMBER_DTYPES = ((bool, torch.bool), (int, torch.int64), (float, torch.float64), (complex, torch.complex128))


def as_tensor(value: Any) -> Any:
    """A Python number as the 0-d host tensor it was in the dispatcher. A tensor made from a number (``t + 1``)
    is a "wrapped number", which reaches a Python kernel as the number and cannot be passed back in its place."""
    if isinstance(value, torch.Tensor):
        return value
    dtype = next(dtype for kind, dtype in _NUMBER_DTYPES if isinstance(value, kind))
    return torch.tensor(value, dtype=dtype)


def _no_sync(args: Args, kwargs: Kwargs, on_device: bool) -> tuple[int, SyncKind] | None:
    # Catalogued only so that the host reads its CPU kernel makes inside are not mistaken for syncs: multinomial
    # checks its probabilities with .item() on CPU, not on CUDA; _assert_async reads its value on CPU and
    # asserts on the device on CUDA.
    return None


@dataclass(frozen=True)
class SyncOp:
    """A catalogued dispatcher operator (``name`` is ``op`` or ``op.overload``) and its rule."""

    name: str
    rule: Rule
    device_only: bool = False
    """Registered only where CUDA is available."""
    numbers: tuple[int, ...] = ()
    """Positions of tensor arguments that may arrive at a Python kernel as a Python number (see
    :func:`as_tensor`)."""


CATALOGUE: tuple[SyncOp, ...] = (
    SyncOp("_local_scalar_dense", _scalar_read),
    SyncOp("equal", _equal),
    SyncOp("nonzero", _fixed(1, SyncKind.DATA_DEPENDENT_SHAPE)),
    SyncOp("masked_select", _fixed(1, SyncKind.DATA_DEPENDENT_SHAPE)),
    SyncOp("_unique", _fixed(1, SyncKind.DATA_DEPENDENT_SHAPE)),
    SyncOp("_unique2", _fixed(1, SyncKind.DATA_DEPENDENT_SHAPE)),
    SyncOp("unique_consecutive", _unique_consecutive),
    SyncOp("unique_dim", _fixed(3, SyncKind.DATA_DEPENDENT_SHAPE)),
    SyncOp("repeat_interleave.Tensor", _repeat_interleave),
    SyncOp("bincount", _fixed(2, SyncKind.DATA_DEPENDENT_SHAPE)),
    SyncOp("histc", _histc),
    SyncOp("index_put_", _index_put),
    SyncOp("_index_put_impl_", _index_put),
    SyncOp("multinomial", _no_sync),
    SyncOp("_assert_async", _no_sync),
    SyncOp("_assert_async.msg", _no_sync),
    SyncOp("copy_", _copy, device_only=True, numbers=(1,)),
)
