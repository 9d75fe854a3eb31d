"""The collective probe: each collective a region calls (all-reduce, all-gather, ... of torch.distributed, the
functional collectives of DTensor and torch.compile alike), in order, with its Python call site.

How: as the sync probe does for its operators, a kernel at the ``BackendSelect`` dispatch key of each catalogued
``c10d`` and ``_c10d_functional`` operator (:data:`CATALOGUE`): ``dist.all_reduce`` reaches the dispatcher as
``c10d::allreduce_`` whatever the backend (NCCL, gloo), and a functional collective as its own operator, which
calls the ``c10d`` one inside it: that inner call is not counted again. The kernel records the call and
redispatches. The kernels are registered while a counting run's region records (as the operator counter, only
there: the Python kernel costs each collective tens of microseconds, a host-bound tensor-parallel loop 1.6x its
step time, bench/results/h200x2_collective_probe.txt) and only where a process group is initialized (a process
without one can run no collective: it counts 0), and removed on every exit path.

The calls, in order, are what the report pairs with the collectives' kernels of a traced run
(:mod:`..analysis.collectives`) to name each collective's call site.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch._C import DispatchKey

from ..analysis.counts import RegionCounts, top_items
from ..analysis.sites import Frame
from ..signals.collectives import CALLS
from .call_sites import first_user_frame

_DISPATCH_KEY = "BackendSelect"
#: The collective operators, by namespace, and the name each is shown by.
CATALOGUE: dict[str, dict[str, str]] = {
    "c10d": {
        "allreduce_": "all_reduce",
        "allreduce_coalesced_": "all_reduce_coalesced",
        "allgather_": "all_gather",
        "_allgather_base_": "all_gather_into_tensor",
        "allgather_coalesced_": "all_gather_coalesced",
        "allgather_into_tensor_coalesced_": "all_gather_into_tensor_coalesced",
        "reduce_scatter_": "reduce_scatter",
        "_reduce_scatter_base_": "reduce_scatter_tensor",
        "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor_coalesced",
        "broadcast_": "broadcast",
        "reduce_": "reduce",
        "alltoall_": "all_to_all",
        "alltoall_base_": "all_to_all_single",
        "gather_": "gather",
        "scatter_": "scatter",
        "barrier": "barrier",
        "send": "send",
        "recv_": "recv",
    },
    "_c10d_functional": {
        "all_reduce": "all_reduce",
        "all_reduce_": "all_reduce",
        "all_reduce_coalesced": "all_reduce_coalesced",
        "all_reduce_coalesced_": "all_reduce_coalesced",
        "all_gather_into_tensor": "all_gather_into_tensor",
        "all_gather_into_tensor_out": "all_gather_into_tensor",
        "all_gather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
        "reduce_scatter_tensor": "reduce_scatter_tensor",
        "reduce_scatter_tensor_out": "reduce_scatter_tensor",
        "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
        "all_to_all_single": "all_to_all_single",
        "broadcast": "broadcast",
        "broadcast_": "broadcast",
    },
}


class _Inside(threading.local):
    depth = 0


def grouped() -> bool:
    """Whether this process has an initialized process group (collectives can run)."""
    distributed = sys.modules.get("torch.distributed")
    return bool(distributed is not None and distributed.is_available() and distributed.is_initialized())


class CollectiveProbe:
    """Process-wide owner of the collectives' kernels; a region's list of calls attaches to it."""

    def __init__(self) -> None:
        self._calls: list[list[str]] = []
        self._inside = _Inside()
        self._libraries: list[torch.library.Library] = []
        self._labels: dict[tuple[str, Frame | None], str] = {}
        """Each (operation, call site)'s label, made once (a site's path relative to the working directory)."""
        self._lock = threading.Lock()

    @contextmanager
    def recording(self, calls: list[str]) -> Iterator[list[str]]:
        """Each collective of the block, ``op at file:line in function``, appended to ``calls`` in call order."""
        with self._lock:
            if not self._calls:
                self._install()
            self._calls.append(calls)
        try:
            yield calls
        finally:
            with self._lock:
                if calls in self._calls:
                    self._calls.remove(calls)
                if not self._calls:
                    self._uninstall()

    def _kernel(self, op: Any, shown: str) -> Callable[..., Any]:
        after = torch._C._dispatch_keyset_full_after(DispatchKey.BackendSelect)
        redispatch = op._handle.redispatch_boxed
        inside, attached, labels = self._inside, self._calls, self._labels

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            if inside.depth == 0 and attached:
                _, site, _ = first_user_frame(sys._getframe(1))
                label = labels.get((shown, site))
                if label is None:
                    label = labels[(shown, site)] = f"{shown} at {site.shown()}" if site is not None else shown
                for calls in attached:
                    calls.append(label)
            inside.depth += 1
            try:
                return redispatch(keyset & after, *args, **kwargs)
            finally:
                inside.depth -= 1

        return kernel

    def _install(self) -> None:
        try:
            for namespace, ops in CATALOGUE.items():
                library = torch.library.Library(namespace, "IMPL")  # type: ignore[no-untyped-call]
                self._libraries.append(library)
                for name, shown in ops.items():
                    qualified = f"{namespace}::{name}"
                    if not torch._C._dispatch_has_kernel(qualified):
                        continue  # not in this build of torch
                    if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, _DISPATCH_KEY):
                        raise RuntimeError(
                            f"syncguard: {qualified} already has a {_DISPATCH_KEY} kernel; refusing to replace it"
                        )
                    op = getattr(getattr(torch.ops, namespace), name).default
                    library.impl(name, self._kernel(op, shown), _DISPATCH_KEY, with_keyset=True)  # type: ignore[no-untyped-call]
        except BaseException:
            self._uninstall()
            raise

    def _uninstall(self) -> None:
        libraries, self._libraries = self._libraries, []
        for library in libraries:
            library._destroy()  # type: ignore[no-untyped-call]


PROBE = CollectiveProbe()


def filled(number: int, tokens: int | None, calls: list[str]) -> dict[str, Any]:
    """A region's part of the measurement (:data:`..signals.collectives.CALLS`): its tokens and calls in order."""
    return {CALLS: {number: (tokens, tuple(calls))}} if calls else {}


@contextmanager
def counting(found: list[RegionCounts], calls: list[str]) -> Iterator[None]:
    """Record the block's collectives into ``calls``; on exit append their count (``collectives``) and the largest
    call sites to ``found``. A process without a process group counts 0 and installs nothing."""
    if not grouped():
        found.append(RegionCounts({"collectives": 0}))
        yield
        return
    with PROBE.recording(calls):
        yield
    found.append(RegionCounts({"collectives": len(calls)}, {"collectives": top_items(Counter(calls))}))
