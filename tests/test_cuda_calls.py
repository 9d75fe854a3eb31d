"""The CUDA-call probe's catalogue and its reading of a call's parameters (pure: real parameter structs laid out
as the CUDA headers lay them out), and what it and the reports say where it cannot count."""

from __future__ import annotations

import ctypes
import gzip
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from pytest_syncguard.document import file as results_file
from pytest_syncguard.guard import SyncGuard
from pytest_syncguard.probes.cuda_calls import (
    BLOCKING,
    DEFAULT,
    DEVICE_TO_DEVICE,
    DEVICE_TO_HOST,
    DRIVER,
    HOST_TO_DEVICE,
    RUNTIME,
    CudaCallProbe,
    Memory,
    When,
    base_name,
    blocks,
    transfer,
)
from pytest_syncguard.probes.cupti import Subscriber
from pytest_syncguard.render.terminal import baseline_lines, site_lines

DEVICE, PINNED, PAGEABLE = 0x7F0000000000, 0x200000000, 0x5555AAAA0000
KINDS = {DEVICE: Memory.DEVICE, PINNED: Memory.PINNED, PAGEABLE: Memory.PAGEABLE}


class _Memcpy(ctypes.Structure):  # cudaMemcpy_v3020_params
    _fields_ = (("dst", ctypes.c_void_p), ("src", ctypes.c_void_p), ("count", ctypes.c_size_t), ("kind", ctypes.c_int))


class _MemcpyAsync(ctypes.Structure):  # cudaMemcpyAsync_v3020_params
    _fields_ = (*_Memcpy._fields_, ("stream", ctypes.c_void_p))


class _Memcpy2D(ctypes.Structure):  # cudaMemcpy2D_v3020_params
    _fields_ = (
        ("dst", ctypes.c_void_p), ("dpitch", ctypes.c_size_t), ("src", ctypes.c_void_p), ("spitch", ctypes.c_size_t),
        ("width", ctypes.c_size_t), ("height", ctypes.c_size_t), ("kind", ctypes.c_int),
    )  # fmt: skip


class _DtoHAsync(ctypes.Structure):  # cuMemcpyDtoHAsync_v2_params
    _fields_ = (
        ("dstHost", ctypes.c_void_p), ("srcDevice", ctypes.c_uint64), ("ByteCount", ctypes.c_size_t),
        ("hStream", ctypes.c_void_p),
    )  # fmt: skip


def _params(struct: type[ctypes.Structure], **values: int) -> ctypes.Structure:
    """The struct over memory that was all ones before its fields were set: an enum read as a whole 8-byte slot
    would read the padding too."""
    params = struct.from_buffer(bytearray(b"\xff" * ctypes.sizeof(struct)))
    for name, value in values.items():
        setattr(params, name, value)
    return params


def _blocks(domain: int, function: str, params: ctypes.Structure) -> bool:
    return blocks(BLOCKING[domain][function], ctypes.addressof(params), KINDS.__getitem__)


def test_cupti_names_are_matched_without_their_version_and_stream_suffixes() -> None:
    assert base_name("cuCtxSynchronize_v2") == "cuCtxSynchronize"
    assert base_name("cuMemcpyDtoHAsync_v2_ptsz") == "cuMemcpyDtoHAsync"
    assert base_name("cudaMemcpy_ptds") == "cudaMemcpy"
    assert base_name("cudaMemcpy_v3020") == "cudaMemcpy"
    assert base_name("cudaStreamSynchronize") == "cudaStreamSynchronize"
    for catalogue in BLOCKING.values():
        for name, call in catalogue.items():
            assert base_name(name) == name
            pointers = (call.dst, call.src)
            assert (call.when is When.ALWAYS) == (pointers == (None, None)), name


@pytest.mark.parametrize(
    ("kind", "dst", "src", "blocking"),
    [
        (DEVICE_TO_HOST, PAGEABLE, DEVICE, True),
        (DEVICE_TO_HOST, PINNED, DEVICE, True),  # synchronous whatever the host memory
        (HOST_TO_DEVICE, DEVICE, PINNED, True),
        (DEVICE_TO_DEVICE, DEVICE, DEVICE, False),  # no host-side synchronization
        (4, DEVICE, DEVICE, False),  # cudaMemcpyDefault: the pointers tell
        (4, PINNED, DEVICE, True),
    ],
)
def test_a_synchronous_copy_blocks_unless_both_sides_are_device_memory(
    kind: int, dst: int, src: int, blocking: bool
) -> None:
    assert _blocks(RUNTIME, "cudaMemcpy", _params(_Memcpy, dst=dst, src=src, count=8, kind=kind)) is blocking
    two_d = _params(_Memcpy2D, dst=dst, src=src, dpitch=8, spitch=8, width=8, height=1, kind=kind)
    assert _blocks(RUNTIME, "cudaMemcpy2D", two_d) is blocking


@pytest.mark.parametrize(
    ("kind", "dst", "src", "blocking"),
    [
        (DEVICE_TO_HOST, PAGEABLE, DEVICE, True),
        (DEVICE_TO_HOST, PINNED, DEVICE, False),
        (HOST_TO_DEVICE, DEVICE, PAGEABLE, True),
        (HOST_TO_DEVICE, DEVICE, PINNED, False),
        (DEVICE_TO_DEVICE, DEVICE, DEVICE, False),
        (4, PAGEABLE, DEVICE, True),
        (4, PINNED, DEVICE, False),
    ],
)
def test_an_asynchronous_copy_blocks_only_with_pageable_host_memory(
    kind: int, dst: int, src: int, blocking: bool
) -> None:
    params = _params(_MemcpyAsync, dst=dst, src=src, count=8, kind=kind, stream=0)
    assert _blocks(RUNTIME, "cudaMemcpyAsync", params) is blocking


def test_a_driver_copy_into_host_memory_blocks_when_that_memory_is_pageable() -> None:
    into = {memory: _params(_DtoHAsync, dstHost=memory, srcDevice=DEVICE, ByteCount=8, hStream=0) for memory in KINDS}
    assert _blocks(DRIVER, "cuMemcpyDtoHAsync", into[PAGEABLE])
    assert not _blocks(DRIVER, "cuMemcpyDtoHAsync", into[PINNED])
    assert _blocks(DRIVER, "cuCtxSynchronize", into[PINNED])  # whatever its parameters


class _Free(ctypes.Structure):  # cudaFree_v3020_params, cuMemFree_v2_params
    _fields_ = (("devPtr", ctypes.c_void_p),)


@pytest.mark.parametrize(
    ("domain", "function"), [(RUNTIME, "cudaFree"), (DRIVER, "cuMemFree"), (RUNTIME, "cudaFreeHost")]
)
def test_a_free_blocks_unless_its_pointer_is_null(domain: int, function: str) -> None:
    """``cudaFree(0)`` frees nothing: cuBLAS calls it when torch creates its handle (a thread's first matrix
    product), which counted a sync in whichever test made the first product of a process."""
    assert _blocks(domain, function, _params(_Free, devPtr=DEVICE))
    assert not _blocks(domain, function, _params(_Free, devPtr=None))


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_without_cuda_the_probe_says_why_it_counted_nothing_and_starts_nothing() -> None:
    with CudaCallProbe().counting() as watch:
        pass
    assert watch.not_counted == "CUDA is not available"
    assert not torch.cuda.is_initialized()


def test_a_cpu_region_has_no_cuda_call_probe_and_names_the_kind_it_cannot_see() -> None:
    guard = SyncGuard("test", device="cpu")
    with guard.generation(tokens=1) as region:
        torch.ones(2).sum().item()
    assert region.measurement is not None and region.measurement.cuda_calls_uncounted is None
    assert region.syncs == 1 and "CUDA call outside torch" in region.measurement.invisible_kinds


def test_calls_not_counted_are_said_in_the_tests_section_the_summary_and_the_results_document(tmp_path: Path) -> None:
    """Two tests of a real H100 results document (tests/data/h100_results) whose calls outside torch were not
    counted: each test's section says why, the summary once per reason with the tests it names, and the results
    document keeps the reason."""
    packed = Path(__file__).parent / "data" / "h100_results" / "results-nvidia-h100-80gb-hbm3.json.gz"
    source = tmp_path / "results.json"
    source.write_bytes(gzip.decompress(packed.read_bytes()))
    why = "the profiler trace of the test's GPU timeline holds CUPTI's one subscriber of the process"
    tests = results_file.read(source)
    tests[:2] = [replace(t, cuda_calls_uncounted=why) for t in tests[:2]]
    written = tmp_path / "again.json"
    results_file.write(written, tests, "2.13.0")
    again = results_file.read(written)
    assert [t.cuda_calls_uncounted for t in again] == [why, why] + [None] * (len(tests) - 2)
    outside = "syncs made outside torch (host-blocking CUDA calls of extensions, ctypes, the driver API)"
    assert f"{outside} were not counted: {why}" in site_lines(again[0])
    assert not any("outside torch" in line for line in site_lines(again[2]))
    said = [line for line in baseline_lines(again, updating=False) if outside in line]
    assert said == [f"syncguard: {outside} were not counted in 2 test(s) ({tests[0].nodeid}, {tests[1].nodeid}): {why}"]


def test_a_region_that_starts_while_a_capture_holds_cupti_counts_nothing_and_says_why() -> None:
    subscriber = Subscriber()
    probe = CudaCallProbe(subscriber)
    with subscriber.yielding("a capture runs"), probe.counting() as inside:
        pass
    with probe.counting() as after:
        pass
    assert inside.not_counted == "a capture runs"
    assert after.not_counted == ("CUDA is not available" if not torch.cuda.is_available() else None)


def _moved(domain: int, function: str, params: ctypes.Structure) -> tuple[str, int] | None:
    return transfer(BLOCKING[domain][function], ctypes.addressof(params), KINDS.__getitem__)


def test_a_copys_direction_and_size_are_read_from_its_parameters() -> None:
    """Each catalogued copy between host and device is a transfer of its size, in its direction (from the kind, or
    where the kind is cudaMemcpyDefault from what each pointer points at); a copy within the device or the host, and
    a call that copies nothing, is none."""
    copy = {kind: _params(_MemcpyAsync, dst=1, src=2, count=4096, kind=kind) for kind in (HOST_TO_DEVICE,
            DEVICE_TO_HOST, DEVICE_TO_DEVICE)}  # fmt: skip
    assert _moved(RUNTIME, "cudaMemcpyAsync", copy[HOST_TO_DEVICE]) == ("h2d", 4096)
    assert _moved(RUNTIME, "cudaMemcpyAsync", copy[DEVICE_TO_HOST]) == ("d2h", 4096)
    assert _moved(RUNTIME, "cudaMemcpyAsync", copy[DEVICE_TO_DEVICE]) is None
    by_pointers = {(dst, src): _params(_Memcpy, dst=dst, src=src, count=8, kind=DEFAULT)
                   for dst in (DEVICE, PAGEABLE) for src in (DEVICE, PINNED)}  # fmt: skip
    assert _moved(RUNTIME, "cudaMemcpy", by_pointers[DEVICE, PINNED]) == ("h2d", 8)
    assert _moved(RUNTIME, "cudaMemcpy", by_pointers[PAGEABLE, DEVICE]) == ("d2h", 8)
    assert _moved(RUNTIME, "cudaMemcpy", by_pointers[DEVICE, DEVICE]) is None
    assert _moved(RUNTIME, "cudaMemcpy", by_pointers[PAGEABLE, PINNED]) is None
    rows = _params(_Memcpy2D, dst=1, dpitch=512, src=2, spitch=512, width=100, height=7, kind=DEVICE_TO_HOST)
    assert _moved(RUNTIME, "cudaMemcpy2D", rows) == ("d2h", 700)  # the rows' bytes, not the pitches'
    assert _moved(DRIVER, "cuMemcpyDtoHAsync", _params(_DtoHAsync, dstHost=PINNED, srcDevice=DEVICE, ByteCount=9)) \
        == ("d2h", 9)  # fmt: skip
    assert _moved(DRIVER, "cuCtxSynchronize", copy[HOST_TO_DEVICE]) is None


class _Memcpy2DAsync(ctypes.Structure):  # cudaMemcpy2DAsync_v3020_params
    _fields_ = (*_Memcpy2D._fields_, ("stream", ctypes.c_void_p))


class _CuMemcpyAsync(ctypes.Structure):  # cuMemcpyAsync_params
    _fields_ = (("dst", ctypes.c_uint64), ("src", ctypes.c_uint64), ("ByteCount", ctypes.c_size_t),
                ("hStream", ctypes.c_void_p))  # fmt: skip


class _CuMemcpy2DAsync(ctypes.Structure):  # cuMemcpy2DAsync_v2_params (cuMemcpy2D_v2_params: pCopy alone)
    _fields_ = (("pCopy", ctypes.c_void_p), ("hStream", ctypes.c_void_p))


def _moved(domain: int, function: str, params: ctypes.Structure) -> tuple[str, int] | None:
    return transfer(BLOCKING[domain][function], ctypes.addressof(params), KINDS.__getitem__)


@pytest.mark.parametrize(("kind", "dst", "src", "blocking", "moved"), [
    (DEVICE_TO_HOST, PAGEABLE, DEVICE, True, ("d2h", 6 * 4)),
    (DEVICE_TO_HOST, PINNED, DEVICE, False, ("d2h", 6 * 4)),
    (HOST_TO_DEVICE, DEVICE, PINNED, False, ("h2d", 6 * 4)),
    (DEFAULT, DEVICE, PAGEABLE, True, ("h2d", 6 * 4)),
    (DEVICE_TO_DEVICE, DEVICE, DEVICE, False, None),
])  # fmt: skip
def test_the_runtimes_2d_asynchronous_copy_is_read_as_its_synchronous_one(
    kind: int, dst: int, src: int, blocking: bool, moved: tuple[str, int] | None
) -> None:
    params = _params(_Memcpy2DAsync, dst=dst, src=src, dpitch=64, spitch=64, width=6, height=4, kind=kind, stream=0)
    assert _blocks(RUNTIME, "cudaMemcpy2DAsync", params) is blocking
    assert _moved(RUNTIME, "cudaMemcpy2DAsync", params) == moved


def test_the_drivers_unified_copy_is_read_by_its_pointers() -> None:
    for dst, src, blocking, moved in [(PAGEABLE, DEVICE, True, ("d2h", 512)), (DEVICE, PINNED, False, ("h2d", 512)),
                                      (DEVICE, DEVICE, False, None)]:  # fmt: skip
        params = _params(_CuMemcpyAsync, dst=dst, src=src, ByteCount=512, hStream=0)
        assert _blocks(DRIVER, "cuMemcpyAsync", params) is blocking
        assert _moved(DRIVER, "cuMemcpyAsync", params) == moved


@pytest.mark.parametrize(("function", "src_type", "src", "dst_type", "dst", "blocking", "moved"), [
    ("cuMemcpy2D", 2, DEVICE, 1, PINNED, True, ("d2h", 48 * 3)),  # synchronous: any host side blocks
    ("cuMemcpy2DAsync", 2, DEVICE, 1, PINNED, False, ("d2h", 48 * 3)),
    ("cuMemcpy2DAsync", 1, PAGEABLE, 2, DEVICE, True, ("h2d", 48 * 3)),
    ("cuMemcpy2DAsync", 4, PAGEABLE, 4, DEVICE, True, ("h2d", 48 * 3)),  # unified: the pointers tell
    ("cuMemcpy2DAsync", 3, 0, 2, DEVICE, False, None),  # an array to the device: no transfer
])  # fmt: skip
def test_the_drivers_2d_copies_are_read_from_their_descriptor(
    function: str, src_type: int, src: int, dst_type: int, dst: int, blocking: bool, moved: tuple[str, int] | None
) -> None:
    from pytest_syncguard.probes.cuda_calls import Memcpy2D

    copy = Memcpy2D.of((src_type, src), (dst_type, dst), 48, 3, 64)
    params = _params(_CuMemcpy2DAsync, pCopy=ctypes.addressof(copy), hStream=0)
    assert _blocks(DRIVER, function, params) is blocking
    assert _moved(DRIVER, function, params) == moved


def test_every_copy_function_is_read_or_named_as_not_read() -> None:
    """The catalogue and the list of copy functions not read cover every copy function of the runtime and driver
    APIs that can cross the host's bus (cuda_runtime_api.h and cuda.h of CUDA 12/13)."""
    from pytest_syncguard.probes.cuda_calls import NOT_READ

    crossing = {
        RUNTIME: {"cudaMemcpy", "cudaMemcpyAsync", "cudaMemcpy2D", "cudaMemcpy2DAsync", "cudaMemcpy3D",
                  "cudaMemcpy3DAsync", "cudaMemcpyToArray", "cudaMemcpyFromArray", "cudaMemcpyToArrayAsync",
                  "cudaMemcpyFromArrayAsync", "cudaMemcpy2DToArray", "cudaMemcpy2DFromArray",
                  "cudaMemcpy2DToArrayAsync", "cudaMemcpy2DFromArrayAsync", "cudaMemcpyToSymbol",
                  "cudaMemcpyFromSymbol", "cudaMemcpyToSymbolAsync", "cudaMemcpyFromSymbolAsync",
                  "cudaMemcpyBatchAsync", "cudaMemcpy3DBatchAsync"},
        DRIVER: {"cuMemcpy", "cuMemcpyAsync", "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyHtoDAsync",
                 "cuMemcpyDtoHAsync", "cuMemcpy2D", "cuMemcpy2DAsync", "cuMemcpy2DUnaligned", "cuMemcpy3D",
                 "cuMemcpy3DAsync", "cuMemcpyHtoA", "cuMemcpyAtoH", "cuMemcpyHtoAAsync", "cuMemcpyAtoHAsync",
                 "cuMemcpyBatchAsync", "cuMemcpy3DBatchAsync"},
    }  # fmt: skip
    for domain, names in crossing.items():
        read = {n for n, call in BLOCKING[domain].items() if call.size is not None or call.descriptor}
        assert names == read | NOT_READ[domain], names ^ (read | NOT_READ[domain])
        assert not read & NOT_READ[domain]
