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
import time
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

from . import cupti
from .cupti import CuptiError

#: ``CUPTI_PROFILER_TYPE_PM_SAMPLING`` and ``CUPTI_PM_SAMPLING_TRIGGER_MODE_GPU_TIME_INTERVAL``.
_PM_SAMPLING, _TIME_INTERVAL = 1, 1
#: ``CUPTI_PM_SAMPLING_DECODE_STOP_REASON_COUNTER_DATA_FULL``.
_COUNTER_DATA_FULL = 1

_size_t, _ptr, _u64 = ctypes.c_size_t, ctypes.c_void_p, ctypes.c_uint64
_names = ctypes.POINTER(ctypes.c_char_p)


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
    interval_ns: int = 0
    """The sampler's interval (0: not known; a row then stands for one sample)."""

    @classmethod
    def of_rows(
        cls,
        metrics: Sequence[str],
        start_ns: Sequence[int],
        end_ns: Sequence[int],
        rows: Sequence[Sequence[float]],
        overflow: bool = False,
        interval_ns: int = 0,
    ) -> Samples:
        """Samples given as one row of values per sample (recorded data, tests)."""
        columns = tuple(array("d", (row[i] for row in rows)) for i in range(len(metrics)))
        return cls(
            tuple(metrics), len(start_ns), array("q", start_ns), array("q", end_ns), columns, overflow, interval_ns
        )

    def column(self, metric: str) -> Sequence[float]:
        return self.columns[self.metrics.index(metric)]

    def picked(self, indices: Sequence[int]) -> Samples:
        """The samples at ``indices`` (in time order)."""
        return Samples(
            self.metrics,
            len(indices),
            array("q", (self.start_ns[i] for i in indices)),
            array("q", (self.end_ns[i] for i in indices)),
            tuple(array("d", (column[i] for i in indices)) for column in self.columns),
            self.overflow,
            self.interval_ns,
        )

    def compacted(self, active: str, elapsed: str, idle_below: float) -> Samples:
        """The samples with each run of touching ones that read wholly active (``active`` cycles at least
        ``elapsed``), or idle (below ``idle_below`` of them), merged into one row (their cycles added); only
        those two metrics are kept. A timeline reads the same from them (:mod:`..analysis.sampled`): a decode
        step's worth of samples is mostly such runs (no_cache on an H100: 40,537 samples, 2,600 rows)."""
        starts, ends = array("q", self.start_ns), array("q", self.end_ns)
        on, cycles = array("d", self.column(active)), array("d", self.column(elapsed))
        count = len(starts)
        module = _native()
        if module is not None:
            kept = module.pm_compact(
                _address(starts), _address(ends), _address(on), _address(cycles), count, idle_below
            )
        else:
            kept = _compact(starts, ends, on, cycles, idle_below)
        for column in (starts, ends, on, cycles):
            del column[kept:]
        return Samples((active, elapsed), self.completed, starts, ends, (on, cycles), self.overflow, self.interval_ns)


def _kind(active: float, elapsed: float, idle_below: float) -> int:
    """0: partly active or no cycles elapsed (never merged), 1: wholly active, 2: idle (as samples.cpp)."""
    if not elapsed > 0:
        return 0
    fraction = active / elapsed
    return 1 if fraction >= 1.0 else 2 if fraction < idle_below else 0


def _compact(starts: array[int], ends: array[int], on: array[float], cycles: array[float], idle: float) -> int:
    """:meth:`Samples.compacted` in Python, in place (the native extension's ``pm_compact``); the rows kept."""
    kept, last = 0, 0
    for index in range(len(starts)):
        kind = _kind(on[index], cycles[index], idle)
        if kept and kind and kind == last and starts[index] == ends[kept - 1]:
            ends[kept - 1] = ends[index]
            on[kept - 1] += on[index]
            cycles[kept - 1] += cycles[index]
            continue
        starts[kept], ends[kept], on[kept], cycles[kept] = starts[index], ends[index], on[index], cycles[index]
        last, kept = kind, kept + 1
    return kept


@dataclass(frozen=True)
class CounterData:
    """A region's counter data as CUPTI decoded it: the image, its completed samples, whether any were lost."""

    image: Any
    """The counter-data image (a ctypes byte array, the sampler's own: the next decode reuses it)."""
    size: int
    """The bytes of ``image`` that CUPTI initialized and decoded into (it may be larger)."""
    completed: int
    overflow: bool


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
        self._evaluators: list[int] = []
        """The further host objects of evaluating threads, made at the first evaluation that needs them and kept
        until :meth:`disable` (making eight took part of each region's decode)."""
        self._config: Any = None
        self._image: Any = None
        """The counter-data image of the last decode, kept for the next one that fits in it (reinitialized, its
        pages already mapped)."""

    def _call(self, name: str, params: _Params) -> None:
        assert self._lib is not None
        status = getattr(self._lib, name)(ctypes.byref(params))
        if status:
            raise CuptiError(name, status)

    @property
    def enabled(self) -> bool:
        return self._object is not None

    def enable(self) -> None:
        """Initialize the profiler, build the configuration of :attr:`metrics` and enable sampling on the device;
        on any failure everything set up so far is undone and :class:`CuptiError` says why."""
        self._lib = cupti.load()
        if not hasattr(self._lib, "cuptiPmSamplingEnable"):
            self._lib = None
            raise CuptiError("cuptiPmSamplingEnable", cupti.NO_SAMPLER)
        try:
            self._call("cuptiProfilerInitialize", _Plain())
        except CuptiError:
            self._lib = None
            raise
        try:
            self._host = self._host_object()
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
        self._image = None
        obj, self._object = self._object, None
        host, self._host = self._host, None
        evaluators, self._evaluators = self._evaluators, []
        for evaluator in evaluators:
            lib.cuptiProfilerHostDeinitialize(ctypes.byref(_HostObject(pHostObject=evaluator)))
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

    def decode(self, max_samples: int, evaluate: bool = True, threads: int = 1) -> Samples:
        """The samples recorded since :meth:`start` (at most ``max_samples``); timestamps and values only if
        ``evaluate``. CUPTI answers out of memory where the device buffer overflowed. The per-sample loop runs in
        the native extension where it is built (:attr:`decoded_natively`), else in Python, about 7 µs a sample."""
        data = self.counter_data(max_samples)
        starts, ends, columns = self.evaluate(data, data.completed if evaluate else 0, threads=threads)
        return Samples(self.metrics, data.completed, starts, ends, columns, data.overflow, self.interval_ns)

    def counter_data(self, max_samples: int, parts: dict[str, float] | None = None) -> CounterData:
        """The counter data recorded since :meth:`start` (at most ``max_samples`` samples), decoded by CUPTI into
        an image that :meth:`evaluate` reads; ``parts`` gets the seconds each step took (for benchmarks)."""
        clock = _PartClock(parts)
        names, _keep = _c_names(self.metrics)
        size = _DataSize(
            pPmSamplingObject=self._object, pMetricNames=names, numMetrics=len(self.metrics), maxSamples=max_samples
        )
        self._call("cuptiPmSamplingGetCounterDataSize", size)
        length = size.counterDataSize
        fresh = self._image is None or len(self._image) < length
        if fresh:
            self._image = None  # the smaller one goes before the larger one is allocated
            self._image = (ctypes.c_uint8 * length)()
        image = self._image
        address = ctypes.addressof(image)
        clock.lap("image allocated" if fresh else "image reused")
        self._call(
            "cuptiPmSamplingCounterDataImageInitialize",
            _DataInit(pPmSamplingObject=self._object, counterDataSize=length, pCounterData=address),
        )
        clock.lap("image initialized")
        decode = _Decode(pPmSamplingObject=self._object, pCounterDataImage=address, counterDataImageSize=length)
        self._call("cuptiPmSamplingDecodeData", decode)
        info = _DataInfo(pCounterDataImage=address, counterDataImageSize=length)
        self._call("cuptiPmSamplingGetCounterDataInfo", info)
        clock.lap("decoded by CUPTI")
        overflow = bool(decode.overflow) or decode.decodeStopReason == _COUNTER_DATA_FULL
        return CounterData(image, length, info.numCompletedSamples, overflow)

    #: Whether the last :meth:`evaluate` ran its loop in the native extension.
    decoded_natively = False

    def evaluate(
        self, data: CounterData, count: int, *, native: bool | None = None, threads: int = 1
    ) -> tuple[array[int], array[int], tuple[array[float], ...]]:
        """Start, end and metric values of the first ``count`` samples of ``data``: in the native extension unless
        ``native`` is False (None: where it is built), its evaluation split over ``threads`` host objects; else
        one Python loop."""
        image, length = ctypes.addressof(data.image), data.size
        starts, ends = array("q", [0]) * count, array("q", [0]) * count
        columns = tuple(array("d", [0.0]) * count for _ in self.metrics)
        names, _keep = _c_names(self.metrics)
        sample = _SampleInfo(pPmSamplingObject=self._object, pCounterDataImage=image, counterDataImageSize=length)
        lib = self._lib
        assert lib is not None
        module = _native() if native is not False else None
        if native and module is None:
            raise RuntimeError("PmSampler.evaluate(native=True): the native extension is not built here")
        wanted = min(threads, max(count // 10_000, 1)) if module is not None else 1
        while len(self._evaluators) < wanted - 1:
            self._evaluators.append(self._host_object())
        hosts = [self._host, *self._evaluators[: wanted - 1]]  # one host object per evaluating thread
        values = [(ctypes.c_double * max(len(self.metrics), 1))() for _ in hosts]
        evaluations = [
            _Evaluate(
                pHostObject=host,
                pCounterDataImage=image,
                counterDataImageSize=length,
                ppMetricNames=names,
                numMetrics=len(self.metrics),
                pMetricValues=buffer,
            )
            for host, buffer in zip(hosts, values, strict=True)
        ]
        if module is not None and count:
            status, call, index = module.pm_decode(
                ctypes.cast(lib.cuptiPmSamplingCounterDataGetSampleInfo, _ptr).value,
                ctypes.cast(lib.cuptiProfilerHostEvaluateToGpuValues, _ptr).value,
                ctypes.addressof(sample),
                _SampleInfo.sampleIndex.offset,
                _SampleInfo.startTimestamp.offset,
                _SampleInfo.endTimestamp.offset,
                [ctypes.addressof(e) for e in evaluations],
                _Evaluate.rangeIndex.offset,
                [ctypes.addressof(v) for v in values],
                len(self.metrics),
                count,
                _address(starts),
                _address(ends),
                [_address(column) for column in columns],
            )
            if status:
                raise CuptiError(f"{call} (sample {index})", status)
        else:
            evaluation, buffer = evaluations[0], values[0]
            for index in range(count):
                sample.sampleIndex = evaluation.rangeIndex = index
                self._call("cuptiPmSamplingCounterDataGetSampleInfo", sample)
                self._call("cuptiProfilerHostEvaluateToGpuValues", evaluation)
                starts[index], ends[index] = sample.startTimestamp, sample.endTimestamp
                for column, value in zip(columns, buffer, strict=False):
                    column[index] = value
        self.decoded_natively = module is not None
        return starts, ends, columns

    def _host_object(self) -> int:
        """A host object of this device's chip with :attr:`metrics` added: the sampler's own (:meth:`enable`), and
        one per further evaluating thread (:meth:`evaluate`). Deinitialized again if adding the metrics fails."""
        chip = _ChipName(deviceIndex=self.device)
        self._call("cuptiDeviceGetChipName", chip)
        host = _HostInit(profilerType=_PM_SAMPLING, pChipName=chip.pChipName)
        self._call("cuptiProfilerHostInitialize", host)
        names, _keep = _c_names(self.metrics)
        try:
            self._call(
                "cuptiProfilerHostConfigAddMetrics",
                _AddMetrics(pHostObject=host.pHostObject, ppMetricNames=names, numMetrics=len(self.metrics)),
            )
        except BaseException:
            assert self._lib is not None
            self._lib.cuptiProfilerHostDeinitialize(ctypes.byref(_HostObject(pHostObject=host.pHostObject)))
            raise
        return int(host.pHostObject)


class _PartClock:
    """Seconds between laps, into ``parts`` (nothing without one)."""

    def __init__(self, parts: dict[str, float] | None) -> None:
        self.parts, self.last = parts, time.perf_counter()

    def lap(self, name: str) -> None:
        if self.parts is not None:
            now = time.perf_counter()
            self.parts[name], self.last = now - self.last, now


def _address(buffer: array[Any]) -> int:
    address: int = buffer.buffer_info()[0]
    return address


def _native() -> Any:
    """The native extension, or None where it is not built (it then says why)."""
    from .native import NATIVE

    return NATIVE.load()


def base_metrics(device: int = 0) -> list[str]:
    """The counter metrics PM sampling offers on a device (for choosing metrics; slow)."""
    lib = cupti.load()
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
