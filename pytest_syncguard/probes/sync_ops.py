"""The catalogue of operators that make the host wait for the device, and how many times each one does.

Each entry is a dispatcher operator together with a rule that says, from the operator's arguments, how many
blocking host-device synchronizations a CUDA run of it performs and of which kind. The counts were calibrated
against the CUDA runtime (``cudaStreamSynchronize``/``cudaDeviceSynchronize``/``cudaEventSynchronize`` calls in
a profiler trace) and are checked that way by ``tests/test_gpu.py``.

Only the outermost catalogued operator of a call is counted: ``masked_select`` calls ``nonzero`` inside, and
``repeat_interleave`` calls ``.item()`` twice inside, on CPU and CUDA alike; the rule of the outer operator
already says what the whole call costs on the GPU. This is what lets a CPU run predict a GPU run exactly.
"""

from __future__ import annotations

import enum
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


def _is_mask(index: Any) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


def _index_put(args: Args, kwargs: Kwargs, on_device: bool) -> tuple[int, SyncKind] | None:
    # Each boolean mask becomes indices through nonzero, except one mask filled with a host scalar,
    # which ATen turns into masked_fill_ (no sync on any device).
    self, indices, values = args[0], args[1], args[2]
    accumulate = bool(_arg(args, kwargs, 3, "accumulate", False))
    if on_device and _on_host(self):
        return None
    masks = sum(1 for index in indices if _is_mask(index))
    as_masked_fill = not accumulate and len(indices) == 1 and masks == 1 and values.numel() == 1 and _on_host(values)
    if masks == 0 or as_masked_fill:
        return None
    return masks, SyncKind.DATA_DEPENDENT_SHAPE


def _no_sync(args: Args, kwargs: Kwargs, on_device: bool) -> tuple[int, SyncKind] | None:
    # Catalogued only so that the host reads its CPU kernel makes inside (multinomial checks its
    # probabilities with .item() on CPU, not on CUDA) are not mistaken for syncs.
    return None


@dataclass(frozen=True)
class SyncOp:
    """A catalogued dispatcher operator (``name`` is ``op`` or ``op.overload``) and its rule."""

    name: str
    rule: Rule


CATALOGUE: tuple[SyncOp, ...] = (
    SyncOp("_local_scalar_dense", _scalar_read),
    SyncOp("equal", _fixed(1, SyncKind.SCALAR_READ)),
    SyncOp("nonzero", _fixed(1, SyncKind.DATA_DEPENDENT_SHAPE)),
    SyncOp("masked_select", _fixed(1, SyncKind.DATA_DEPENDENT_SHAPE)),
    SyncOp("_unique", _fixed(1, SyncKind.DATA_DEPENDENT_SHAPE)),
    SyncOp("_unique2", _fixed(1, SyncKind.DATA_DEPENDENT_SHAPE)),
    SyncOp("unique_consecutive", _fixed(1, SyncKind.DATA_DEPENDENT_SHAPE)),
    SyncOp("unique_dim", _fixed(3, SyncKind.DATA_DEPENDENT_SHAPE)),
    SyncOp("repeat_interleave.Tensor", _repeat_interleave),
    SyncOp("bincount", _fixed(2, SyncKind.DATA_DEPENDENT_SHAPE)),
    SyncOp("histc", _histc),
    SyncOp("index_put_", _index_put),
    SyncOp("_index_put_impl_", _index_put),
    SyncOp("multinomial", _no_sync),
)
