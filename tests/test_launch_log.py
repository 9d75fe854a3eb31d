"""The native launch log's CUPTI callback (``probes/native/launches.cpp``), driven here as CUPTI drives it: with
callback records laid out as ``CUpti_CallbackData`` is, for callback ids no CUDA function has, so that a CUDA
machine's own marks are left alone. It stamps each outermost launch call's entry and return, keeps a graph launch's
graph from its parameters, and passes a copy on after stamping it and every other callback untouched."""

from __future__ import annotations

import ctypes
from array import array
from collections.abc import Iterator
from typing import Any

import pytest

from pytest_syncguard.probes import native
from pytest_syncguard.probes.cuda_calls import CUDA_CALLS, CallbackData

pytestmark = pytest.mark.skipif(
    native.NATIVE.load() is None, reason=f"native kernel unavailable: {native.NATIVE.unavailable}"
)

RUNTIME = 2
#: Callback ids above every CUDA 12 and 13 function's, below the log's table size.
LAUNCH, GRAPH_LAUNCH, COPY, OTHER = 4000, 4001, 4002, 4003
ENTER, EXIT = 0, 1
CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)


class GraphLaunchParams(ctypes.Structure):
    """``cudaGraphLaunch_v10000_params``: the executable graph, the stream."""

    _fields_ = [("graphExec", ctypes.c_uint64), ("stream", ctypes.c_void_p)]


@pytest.fixture
def log() -> Iterator[Any]:
    module: Any = native.NATIVE.load()
    passed: list[tuple[int, int]] = []

    def on_passed(userdata: Any, domain: int, cbid: int, data: Any) -> None:
        passed.append((cbid, CallbackData.from_address(data).callbackSite))

    receiver = CALLBACK(on_passed)
    module.launch_pass_to(ctypes.cast(receiver, ctypes.c_void_p).value)
    for cbid, kind in ((LAUNCH, 1), (GRAPH_LAUNCH, 2), (COPY, 3)):
        module.launch_mark(RUNTIME, cbid, kind)
    module.passed = passed
    try:
        yield module
    finally:
        for cbid in (LAUNCH, GRAPH_LAUNCH, COPY):
            module.launch_mark(RUNTIME, cbid, 0)
        # What the CUDA-call probe sets each time it subscribes.
        module.launch_pass_to(ctypes.cast(CUDA_CALLS._callback, ctypes.c_void_p).value)


def _call(module: Any, cbid: int, site: int, params: Any = None) -> None:
    callback = CALLBACK(module.launch_callback())
    data = CallbackData(callbackSite=site, functionParams=None if params is None else ctypes.addressof(params))
    callback(None, RUNTIME, cbid, ctypes.addressof(data))


def _stopped(module: Any) -> tuple[list[int], int, list[int], list[int]]:
    data, made, graphs, entered = module.launch_stop()
    return list(array("q", data)), made, list(array("Q", graphs)), list(array("q", entered))


def test_each_outermost_launch_is_stamped_from_its_entry_to_its_return(log: Any) -> None:
    graph = GraphLaunchParams(graphExec=0xABCDEF, stream=None)
    log.launch_start()
    _call(log, LAUNCH, ENTER)
    _call(log, LAUNCH, ENTER)  # a launch made inside another (a runtime launch's own driver launch): one stamp
    _call(log, LAUNCH, EXIT)
    _call(log, LAUNCH, EXIT)
    _call(log, GRAPH_LAUNCH, ENTER, graph)
    _call(log, GRAPH_LAUNCH, EXIT, graph)
    _call(log, OTHER, ENTER)
    _call(log, OTHER, EXIT)
    returned, made, graphs, entered = _stopped(log)
    assert made == 2 and len(returned) == 2
    assert graphs == [0, 0xABCDEF]
    assert all(e <= r for e, r in zip(entered, returned, strict=True)) and returned[0] <= entered[1]
    assert log.passed == [(OTHER, ENTER), (OTHER, EXIT)]  # only what is not a launch reaches the probe


def test_a_copy_is_stamped_and_passed_on_and_nothing_is_stamped_while_not_logging(log: Any) -> None:
    log.launch_start()
    _call(log, COPY, ENTER)
    _call(log, COPY, EXIT)
    _, made, graphs, _ = _stopped(log)
    assert made == 1 and graphs == [0]
    assert log.passed == [(COPY, ENTER), (COPY, EXIT)]  # the CUDA-call probe counts transfers from it
    _call(log, LAUNCH, ENTER)
    _call(log, LAUNCH, EXIT)
    assert _stopped(log)[1] == 1  # the log, stopped, kept no stamp of it


def test_a_kind_the_log_does_not_know_is_refused() -> None:
    module: Any = native.NATIVE.load()
    with pytest.raises(ValueError, match="is 0 \\(passed on\\), 1 \\(launch\\), 2 \\(graph launch\\) or 3"):
        module.launch_mark(RUNTIME, OTHER, 4)
    with pytest.raises(IndexError, match="no such CUPTI callback domain or id"):
        module.launch_mark(3, OTHER, 1)
