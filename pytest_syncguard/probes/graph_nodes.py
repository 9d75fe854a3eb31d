"""The graph census: what each CUDA graph captured in this process holds, by node type (kernels, memsets, copies),
read from the driver when its capture ends, before torch instantiates it (and, by default, destroys the graph).

The sampled timeline reads the compute engine only: a graph's memset and copy nodes run between its kernels on the
copy engine, which no counter PM sampling offers sees (bench/results/h100_copy_metrics.txt), so the gaps they leave
read as idle. Knowing which graphs hold them, the sampled analysis tells a gap queued behind such a graph's launch
as a copy wait (:class:`.sampled.GraphNodes`); the launch log names the graph each launch replayed (its executable
graph, :attr:`.cuda_calls.LaunchLog.graph_launches`), and :meth:`GraphCensus.of_launched` looks it up.

Every capture goes through ``torch.cuda.CUDAGraph.capture_end`` (``torch.cuda.graph``, ``make_graphed_callables``
and torch.compile's CUDA graph trees call it): the census wraps it from a process's first measured test on CUDA
to the end of the session (:meth:`GraphCensus.watch`). A graph captured before then is not known.
"""

from __future__ import annotations

import ctypes
import sys
import weakref
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from ..analysis.sampled import GraphNodes
from ..environment import DRIVER_LIBRARY
from .patches import Patches

#: ``CUgraphNodeType``: a kernel, a copy and a memset node (cuda.h); every other type counts as other.
_KERNEL, _COPY, _MEMSET = 0, 1, 2
#: ``CU_STREAM_CAPTURE_STATUS_ACTIVE``.
_CAPTURING = 1

_ptr = ctypes.c_void_p


class GraphCensus:
    """The node census of each captured graph, by its torch graph object (held weakly: a freed graph leaves)."""

    def __init__(self) -> None:
        self._nodes: weakref.WeakKeyDictionary[Any, GraphNodes] = weakref.WeakKeyDictionary()
        self._patches = Patches()
        self._watchers = 0
        self._driver: Any = None
        self.problem: str | None = None
        """Why a capture's nodes could not be read (the last such reason), if one could not."""

    def watch(self) -> Callable[[], None]:
        """Read every capture from now on; returns what stops it (once every watcher has stopped)."""
        import torch

        if not self._watchers:
            self._patches.patch(torch.cuda.CUDAGraph, "capture_end", self._wrap)
        self._watchers += 1
        stopped = False

        def stop() -> None:
            nonlocal stopped
            if not stopped:
                stopped, self._watchers = True, self._watchers - 1
                if not self._watchers:
                    self._patches.undo()

        return stop

    def _wrap(self, capture_end: Callable[..., Any]) -> Callable[..., Any]:
        def read_then_end(graph: Any, *args: Any, **kwargs: Any) -> Any:
            nodes = self._read()
            ended = capture_end(graph, *args, **kwargs)
            if nodes is not None:
                self._nodes[graph] = nodes
            return ended

        return read_then_end

    def of_launched(self, launched: Iterable[int]) -> dict[int, GraphNodes]:
        """What each of the ``launched`` executable graphs (handles, as the launch log keeps them) holds, where
        one of the live graphs read is it."""
        wanted = set(launched)
        found: dict[int, GraphNodes] = {}
        for graph, nodes in list(self._nodes.items()):
            try:
                handle = int(graph.raw_cuda_graph_exec())
            except (RuntimeError, AttributeError):  # not instantiated yet (keep_graph=True), or an older torch
                continue
            if handle in wanted:
                found[handle] = nodes
        return found

    def _read(self) -> GraphNodes | None:
        """The nodes of the graph being captured on the current stream, by type (None: not read, and why)."""
        import torch

        try:
            driver = self._load()
            stream = _ptr(torch.cuda.current_stream().cuda_stream)
            status, graph = ctypes.c_int(), _ptr()
            if self._capture_info(stream, ctypes.byref(status), ctypes.byref(graph)):
                self.problem = "the driver could not say which graph the stream was capturing"
                return None
            if status.value != _CAPTURING or not graph.value:
                self.problem = "capture_end was called on a stream that was not capturing"
                return None
            count = ctypes.c_size_t()
            driver.cuGraphGetNodes(graph, None, ctypes.byref(count))
            handles = (_ptr * count.value)()
            if driver.cuGraphGetNodes(graph, handles, ctypes.byref(count)):
                self.problem = "the driver could not list the captured graph's nodes"
                return None
            kinds: Counter[int] = Counter()
            kind = ctypes.c_int()
            for node in handles[: count.value]:
                driver.cuGraphNodeGetType(_ptr(node), ctypes.byref(kind))
                kinds[kind.value] += 1
        except (OSError, AttributeError, ctypes.ArgumentError) as exc:
            self.problem = f"the CUDA driver's graph calls could not be used: {exc}"
            return None
        others = sum(n for k, n in kinds.items() if k not in (_KERNEL, _COPY, _MEMSET))
        return GraphNodes(kernels=kinds[_KERNEL], memsets=kinds[_MEMSET], copies=kinds[_COPY], others=others)

    def _capture_info(self, stream: Any, status: Any, graph: Any) -> int:
        """``cuStreamGetCaptureInfo``: the stream's capture status and graph (the dependencies not asked). The
        driver keeps the CUDA 12.0 form beside CUDA 12.3's (which adds edge data) for the programs built for it."""
        info = self._load().cuStreamGetCaptureInfo_v2
        return int(info(stream, status, None, graph, None, None))

    def _load(self) -> Any:
        if self._driver is None:
            driver = ctypes.CDLL(DRIVER_LIBRARY.get(sys.platform, DRIVER_LIBRARY["linux"]))
            driver.cuStreamGetCaptureInfo_v2.argtypes = (_ptr, _ptr, _ptr, _ptr, _ptr, _ptr)
            driver.cuGraphGetNodes.argtypes = (_ptr, _ptr, _ptr)
            driver.cuGraphNodeGetType.argtypes = (_ptr, _ptr)
            self._driver = driver
        return self._driver


#: The process's census.
CENSUS = GraphCensus()
