"""CUPTI's PM sampler through ctypes: the GPU's own performance counters read at a fixed interval of device time
into a device buffer, with nothing added to a kernel launch.

This is the timeline source that does not move what it measures: CUPTI's activity records (kernel timestamps)
cost every launch host time and every kernel device time (bench/bench_cupti_floor.py), while the sampler runs
beside the work. What it gives is coarser: per interval of ``interval_ns``, how many cycles the GPU's compute
engine was active, never which kernel ran. The library is the libcupti the profiler loads (CUPTI 12.6 or newer
has the API); nothing is installed for it.
"""

from __future__ import annotations

import ctypes
import glob
import os
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, ClassVar

#: CUptiResult values named in errors (cupti_result.h).
_NO_LIBRARY, _NO_SAMPLER = -1, -2
_RESULTS = {
    _NO_LIBRARY: "no libcupti in this process or beside torch (CUPTI 12.6 or newer has the PM sampler)",
    _NO_SAMPLER: "this libcupti has no PM sampler (CUPTI 12.6 or newer has one)",
    7: "invalid operation (PM sampling already enabled on the device?)",
    8: "out of memory",
    15: "not initialized (CUPTI could not load libnvperf_host.so/libnvperf_target.so)",
    17: "invalid metric name",
    27: "not supported on this device or configuration",
    33: "not supported on a virtualized device",
    35: "insufficient privileges to read GPU performance counters (ERR_NVGPUCTRPERM)",
    36: "the old profiler API is initialized in this process",
}
#: ``CUPTI_ERROR_NOT_INITIALIZED``: what profiler calls return after CUPTI was finalized (a capture detached it).
NOT_INITIALIZED = 15
#: ``CUPTI_PROFILER_TYPE_PM_SAMPLING`` and ``CUPTI_PM_SAMPLING_TRIGGER_MODE_GPU_TIME_INTERVAL``.
_PM_SAMPLING, _TIME_INTERVAL = 1, 1
#: ``CUPTI_PM_SAMPLING_DECODE_STOP_REASON_COUNTER_DATA_FULL``.
_COUNTER_DATA_FULL = 1

_size_t, _ptr, _u64 = ctypes.c_size_t, ctypes.c_void_p, ctypes.c_uint64
_names = ctypes.POINTER(ctypes.c_char_p)


class PmSamplingError(RuntimeError):
    """A CUPTI call of the sampler failed; ``status`` is its CUptiResult."""

    def __init__(self, call: str, status: int) -> None:
        self.status = status
        meaning = _RESULTS.get(status)
        self.message = meaning or f"{call} returned {status} (see cupti_result.h)"
        """What the status means, in words."""
        super().__init__(f"{call} returned {status}: {meaning or 'see cupti_result.h'}")


class _Params(ctypes.Structure):
    """A CUPTI parameter struct: ``structSize`` is the offset of its last field plus that field's size, as the
    header's ``CUPTI_PROFILER_STRUCT_SIZE`` computes it (no trailing padding)."""

    _fields_: ClassVar[list[tuple[str, Any]]] = []

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        name, kind = self._fields_[-1]
        self.structSize = getattr(type(self), name).offset + ctypes.sizeof(kind)


def _params(*fields: tuple[str, Any]) -> type[_Params]:
    return type("Params", (_Params,), {"_fields_": [("structSize", _size_t), ("pPriv", _ptr), *fields]})


_Plain = _params()
_ChipName = _params(("deviceIndex", _size_t), ("pChipName", ctypes.c_char_p))
_HostInit = _params(
    ("profilerType", ctypes.c_int),
    ("pChipName", ctypes.c_char_p),
    ("pCounterAvailabilityImage", _ptr),
    ("pHostObject", _ptr),
)
_HostObject = _params(("pHostObject", _ptr))
_AddMetrics = _params(("pHostObject", _ptr), ("ppMetricNames", _names), ("numMetrics", _size_t))
_ConfigSize = _params(("pHostObject", _ptr), ("configImageSize", _size_t))
_ConfigImage = _params(("pHostObject", _ptr), ("configImageSize", _size_t), ("pConfigImage", _ptr))
_Evaluate = _params(
    ("pHostObject", _ptr),
    ("pCounterDataImage", _ptr),
    ("counterDataImageSize", _size_t),
    ("rangeIndex", _size_t),
    ("ppMetricNames", _names),
    ("numMetrics", _size_t),
    ("pMetricValues", ctypes.POINTER(ctypes.c_double)),
)
_Enable = _params(("deviceIndex", _size_t), ("pPmSamplingObject", _ptr))
_Object = _params(("pPmSamplingObject", _ptr))
_SetConfig = _params(
    ("pPmSamplingObject", _ptr),
    ("configSize", _size_t),
    ("pConfig", _ptr),
    ("hardwareBufferSize", _size_t),
    ("samplingInterval", _u64),
    ("triggerMode", ctypes.c_int),
    ("hwBufferAppendMode", ctypes.c_int),
)
_DataSize = _params(
    ("pPmSamplingObject", _ptr),
    ("pMetricNames", _names),
    ("numMetrics", _size_t),
    ("maxSamples", ctypes.c_uint32),
    ("counterDataSize", _size_t),
)
_DataInit = _params(("pPmSamplingObject", _ptr), ("counterDataSize", _size_t), ("pCounterData", _ptr))
_Decode = _params(
    ("pPmSamplingObject", _ptr),
    ("pCounterDataImage", _ptr),
    ("counterDataImageSize", _size_t),
    ("decodeStopReason", ctypes.c_int),
    ("overflow", ctypes.c_uint8),
)
_DataInfo = _params(
    ("pCounterDataImage", _ptr),
    ("counterDataImageSize", _size_t),
    ("numTotalSamples", _size_t),
    ("numPopulatedSamples", _size_t),
    ("numCompletedSamples", _size_t),
)
_SampleInfo = _params(
    ("pPmSamplingObject", _ptr),
    ("pCounterDataImage", _ptr),
    ("counterDataImageSize", _size_t),
    ("sampleIndex", _size_t),
    ("startTimestamp", _u64),
    ("endTimestamp", _u64),
)


def load_cupti() -> ctypes.CDLL:
    """The libcupti of this process (the one the profiler loaded), else the one beside torch's CUDA libraries;
    the nvperf libraries beside it are loaded first, where the dynamic linker would not find them."""
    from .timeline import cupti_library

    loaded = cupti_library()
    if loaded is None:
        import torch

        site = os.path.dirname(os.path.dirname(torch.__file__))
        found = sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libcupti.so*")))  # cu13/, cuda_cupti/
        if not found:
            raise PmSamplingError("dlopen(libcupti)", _NO_LIBRARY)
        loaded = ctypes.CDLL(found[-1])
    directory = os.path.dirname(getattr(loaded, "_name", "") or "")
    for library in ("libnvperf_host.so", "libnvperf_target.so"):
        with suppress(OSError):
            ctypes.CDLL(os.path.join(directory, library), mode=ctypes.RTLD_GLOBAL)
    return loaded


def _c_names(names: Sequence[str]) -> Any:
    array = (ctypes.c_char_p * len(names))(*(n.encode() for n in names))
    return ctypes.cast(array, _names), array


@dataclass(frozen=True)
class Samples:
    """Decoded samples: per sample its start and end (ns, the GPU's timer) and one value per metric, held as
    arrays (one column per metric): one object each to the garbage collector. As a tuple per sample, the first
    collection after a region's decode visited each of its million tuples: on H100 hosts such collections took
    112-151 ms, inside the next timed run, and became its widest gap (docs/explanation/timeline.md)."""

    metrics: tuple[str, ...]
    completed: int
    """Samples completed (those below are empty when they were not evaluated)."""
    start_ns: Sequence[int]
    end_ns: Sequence[int]
    columns: tuple[Sequence[float], ...]
    """One column of values per metric, in the order of :attr:`metrics`."""
    overflow: bool
    """The hardware buffer filled up: samples after that point were lost."""

    @classmethod
    def of_rows(
        cls, metrics: Sequence[str], start_ns: Sequence[int], end_ns: Sequence[int],
        rows: Sequence[Sequence[float]], overflow: bool = False,
    ) -> Samples:  # fmt: skip
        """Samples given as one row of values per sample (recorded data, tests)."""
        columns = tuple(array("d", (row[i] for row in rows)) for i in range(len(metrics)))
        return cls(tuple(metrics), len(start_ns), array("q", start_ns), array("q", end_ns), columns, overflow)

    def column(self, metric: str) -> Sequence[float]:
        return self.columns[self.metrics.index(metric)]

    def picked(self, indices: Sequence[int]) -> Samples:
        """The samples at ``indices`` (in time order)."""
        return Samples(
            self.metrics, len(indices), array("q", (self.start_ns[i] for i in indices)),
            array("q", (self.end_ns[i] for i in indices)),
            tuple(array("d", (column[i] for i in indices)) for column in self.columns), self.overflow,
        )  # fmt: skip


class PmSampler:
    """One device's PM sampler: ``enable()`` once, then any number of ``sampling()`` blocks, ``disable()``."""

    def __init__(self, metrics: Sequence[str], *, interval_ns: int, device: int = 0, buffer_bytes: int = 1 << 29):
        self.metrics = tuple(metrics)
        self.interval_ns = interval_ns
        self.device = device
        self.buffer_bytes = buffer_bytes
        self._lib: ctypes.CDLL | None = None
        self._object: int | None = None
        self._host: int | None = None
        self._config: Any = None

    def _call(self, name: str, params: _Params) -> None:
        assert self._lib is not None
        status = getattr(self._lib, name)(ctypes.byref(params))
        if status:
            raise PmSamplingError(name, status)

    @property
    def enabled(self) -> bool:
        return self._object is not None

    def enable(self) -> None:
        """Initialize the profiler, build the configuration of :attr:`metrics` and enable sampling on the device;
        on any failure everything set up so far is undone and :class:`PmSamplingError` says why."""
        self._lib = load_cupti()
        if not hasattr(self._lib, "cuptiPmSamplingEnable"):
            self._lib = None
            raise PmSamplingError("cuptiPmSamplingEnable", _NO_SAMPLER)
        try:
            self._call("cuptiProfilerInitialize", _Plain())
        except PmSamplingError:
            self._lib = None
            raise
        try:
            chip = _ChipName(deviceIndex=self.device)
            self._call("cuptiDeviceGetChipName", chip)
            host = _HostInit(profilerType=_PM_SAMPLING, pChipName=chip.pChipName)
            self._call("cuptiProfilerHostInitialize", host)
            self._host = host.pHostObject
            names, _keep = _c_names(self.metrics)
            self._call(
                "cuptiProfilerHostConfigAddMetrics",
                _AddMetrics(pHostObject=self._host, ppMetricNames=names, numMetrics=len(self.metrics)),
            )
            size = _ConfigSize(pHostObject=self._host)
            self._call("cuptiProfilerHostGetConfigImageSize", size)
            self._config = (ctypes.c_uint8 * size.configImageSize)()
            self._call(
                "cuptiProfilerHostGetConfigImage",
                _ConfigImage(
                    pHostObject=self._host,
                    configImageSize=size.configImageSize,
                    pConfigImage=ctypes.addressof(self._config),
                ),
            )
            enable = _Enable(deviceIndex=self.device)
            self._call("cuptiPmSamplingEnable", enable)
            self._object = enable.pPmSamplingObject
            self._call(
                "cuptiPmSamplingSetConfig",
                _SetConfig(
                    pPmSamplingObject=self._object,
                    configSize=len(self._config),
                    pConfig=ctypes.addressof(self._config),
                    hardwareBufferSize=self.buffer_bytes,
                    samplingInterval=self.interval_ns,
                    triggerMode=_TIME_INTERVAL,
                    hwBufferAppendMode=0,
                ),
            )
        except BaseException:
            self.disable()
            raise

    def disable(self) -> None:
        """Disable sampling and release the profiler (idempotent)."""
        if self._lib is None:
            return
        lib, self._lib = self._lib, None
        obj, self._object = self._object, None
        host, self._host = self._host, None
        if obj is not None:
            lib.cuptiPmSamplingDisable(ctypes.byref(_Object(pPmSamplingObject=obj)))
        if host is not None:
            lib.cuptiProfilerHostDeinitialize(ctypes.byref(_HostObject(pHostObject=host)))
        lib.cuptiProfilerDeInitialize(ctypes.byref(_Plain()))

    def start(self) -> None:
        if self._object is None:
            raise RuntimeError("PmSampler.start() before enable()")
        self._call("cuptiPmSamplingStart", _Object(pPmSamplingObject=self._object))

    def stop(self) -> None:
        self._call("cuptiPmSamplingStop", _Object(pPmSamplingObject=self._object))

    @contextmanager
    def sampling(self, collected: list[Samples], *, max_samples: int, evaluate: bool = True) -> Iterator[None]:
        """Sample the block; on exit append its decoded samples (at most ``max_samples``) to ``collected``, their
        timestamps and values only if ``evaluate`` (a host call per sample)."""
        self.start()
        try:
            yield
        finally:
            self.stop()
        collected.append(self.decode(max_samples, evaluate))

    def decode(self, max_samples: int, evaluate: bool = True) -> Samples:
        """The samples recorded since :meth:`start` (at most ``max_samples``); timestamps and values only if
        ``evaluate``. CUPTI answers out of memory where the device buffer overflowed."""
        names, _keep = _c_names(self.metrics)
        size = _DataSize(
            pPmSamplingObject=self._object, pMetricNames=names, numMetrics=len(self.metrics), maxSamples=max_samples
        )
        self._call("cuptiPmSamplingGetCounterDataSize", size)
        image = (ctypes.c_uint8 * size.counterDataSize)()
        address, length = ctypes.addressof(image), size.counterDataSize
        self._call(
            "cuptiPmSamplingCounterDataImageInitialize",
            _DataInit(pPmSamplingObject=self._object, counterDataSize=length, pCounterData=address),
        )
        decode = _Decode(pPmSamplingObject=self._object, pCounterDataImage=address, counterDataImageSize=length)
        self._call("cuptiPmSamplingDecodeData", decode)
        info = _DataInfo(pCounterDataImage=address, counterDataImageSize=length)
        self._call("cuptiPmSamplingGetCounterDataInfo", info)
        starts, ends = array("q"), array("q")
        columns = tuple(array("d") for _ in self.metrics)
        sample = _SampleInfo(pPmSamplingObject=self._object, pCounterDataImage=address, counterDataImageSize=length)
        values = (ctypes.c_double * len(self.metrics))()
        evaluation = _Evaluate(
            pHostObject=self._host,
            pCounterDataImage=address,
            counterDataImageSize=length,
            ppMetricNames=names,
            numMetrics=len(self.metrics),
            pMetricValues=values,
        )
        for index in range(info.numCompletedSamples if evaluate else 0):
            sample.sampleIndex = evaluation.rangeIndex = index
            self._call("cuptiPmSamplingCounterDataGetSampleInfo", sample)
            self._call("cuptiProfilerHostEvaluateToGpuValues", evaluation)
            starts.append(sample.startTimestamp)
            ends.append(sample.endTimestamp)
            for column, value in zip(columns, values, strict=True):
                column.append(value)
        full = decode.decodeStopReason == _COUNTER_DATA_FULL
        overflow = bool(decode.overflow) or full
        return Samples(self.metrics, info.numCompletedSamples, starts, ends, columns, overflow)


def base_metrics(device: int = 0) -> list[str]:
    """The counter metrics PM sampling offers on a device (for choosing metrics; slow)."""
    lib = load_cupti()
    sampler = PmSampler((), interval_ns=1)
    sampler._lib = lib
    sampler._call("cuptiProfilerInitialize", _Plain())
    try:
        chip = _ChipName(deviceIndex=device)
        sampler._call("cuptiDeviceGetChipName", chip)
        host = _HostInit(profilerType=_PM_SAMPLING, pChipName=chip.pChipName)
        sampler._call("cuptiProfilerHostInitialize", host)
        try:
            listed = _params(
                ("pHostObject", _ptr), ("metricType", ctypes.c_int), ("ppMetricNames", _names), ("numMetrics", _size_t)
            )(pHostObject=host.pHostObject, metricType=0)
            sampler._call("cuptiProfilerHostGetBaseMetrics", listed)
            return [listed.ppMetricNames[i].decode() for i in range(listed.numMetrics)]
        finally:
            lib.cuptiProfilerHostDeinitialize(ctypes.byref(_HostObject(pHostObject=host.pHostObject)))
    finally:
        lib.cuptiProfilerDeInitialize(ctypes.byref(_Plain()))
