"""Reading a PyTorch profiler trace (Chrome/Perfetto JSON, optionally gzipped) into the few event kinds the
timeline analysis needs. Pure Python over the file; no torch.

Parsing is most of the cost on a large trace (a GPT-2 decode of 100 steps at batch 32 is about 230k events,
57 MB): ``orjson`` decodes it several times faster than the standard library, which is the fallback.
"""

from __future__ import annotations

import gc
import gzip
import json
import operator
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ..files import TooLarge, read_unpacked

try:
    import orjson

    _loads: Any = orjson.loads
except ImportError:  # pragma: no cover - orjson is a dependency; the fallback serves bare environments
    _loads = json.loads

#: Device activity: what makes the GPU busy.
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
#: Host calls into the CUDA runtime or driver (launches, copies, syncs).
HOST_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
#: Host ranges: operators and annotations (``record_function``, ``ProfilerStep#N``).
RANGE_CATEGORIES = frozenset({"cpu_op", "user_annotation"})
#: Host calls that block until the device has finished earlier work.
BLOCKING_CALLS = frozenset(
    {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpy2D"}
)
#: Host calls that launch one kernel (runtime and driver API; Triton launches through the driver).
KERNEL_LAUNCHES = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cudaLaunchCooperativeKernel",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel",
    }
)
#: Host calls that launch a captured CUDA graph.
GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "cuGraphLaunch"})
#: Operator-scope ranges that compiled code opens only while a profiler records (dynamo, AOTAutograd and
#: inductor check ``_is_profiler_enabled`` first): a trace has them, an unprofiled run does not.
_PROFILER_ONLY = frozenset({"Pregraph bytecode", "AOTDispatcher Runtime Wrapper Prologue"})
_PROFILER_ONLY_PREFIXES = ("## Call CompiledFxGraph ",)


def profiler_only(name: str) -> bool:
    """Whether a ``cpu_op`` range of this name exists only in a profiled run (see :data:`_PROFILER_ONLY`)."""
    return name in _PROFILER_ONLY or name.startswith(_PROFILER_ONLY_PREFIXES)


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector: building a few hundred thousand objects (the decoded events, then
    the analysis's tuples) otherwise triggers full collections over all of them, which doubled the time of a
    large trace. The collector's previous state is restored on every exit path."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class TraceError(Exception):
    """The file is no PyTorch profiler trace this tool can read; the message names the file."""


class GpuOp(NamedTuple):
    """A kernel, memcpy or memset on the device timeline (times in microseconds)."""

    start: float
    end: float
    stream: int
    name: str
    category: str
    correlation: int | None
    bytes: int = 0
    """What a memcpy or memset wrote (0 for a kernel)."""


class HostCall(NamedTuple):
    """A CUDA runtime or driver call on a host thread."""

    start: float
    end: float
    name: str
    tid: int
    correlation: int | None


class HostRange(NamedTuple):
    """An operator or annotation on a host thread."""

    start: float
    end: float
    name: str
    tid: int
    category: str


@dataclass
class Trace:
    """The events of one trace that the analysis uses, each list sorted by start time."""

    gpu_ops: list[GpuOp] = field(default_factory=list)
    host_calls: list[HostCall] = field(default_factory=list)
    ranges: list[HostRange] = field(default_factory=list)
    events_read: int = 0


#: The largest timestamp or duration taken, in us (2**53: where a double stops holding every integer, about
#: 285 years): a larger or non-finite one is malformed, and would make spans infinite and fractions NaN.
_LIMIT_US = float(2**53)

#: Events sort by (start, end) alone: two with the same times keep their order, whatever their other fields.
_BY_TIME = operator.itemgetter(0, 1)


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
        return number if -_LIMIT_US <= number <= _LIMIT_US else None
    return None


def _malformed(index: int, event: dict[str, Any], why: str) -> TraceError:
    name = str(event.get("name", ""))[:80]
    return TraceError(f"event {index} ({event.get('cat')!r} {name!r}): {why}")


def from_events(events: Iterable[Any]) -> Trace:
    """Sort the trace events into the kinds the analysis uses (complete events of those categories); one of them
    that is malformed is a :class:`TraceError` naming it by its index. Other entries are not read."""
    trace = Trace()
    gpu, host, ranges = trace.gpu_ops, trace.host_calls, trace.ranges
    count = 0
    for index, event in enumerate(events):
        count += 1
        if type(event) is not dict or event.get("ph") != "X":
            continue
        category = event.get("cat")
        if category in GPU_CATEGORIES:
            kind = 0
        elif category in HOST_CATEGORIES:
            kind = 1
        elif category in RANGE_CATEGORIES:
            kind = 2
        else:
            continue
        start, duration = _number(event.get("ts")), _number(event.get("dur"))
        if start is None or duration is None or duration < 0:
            why = f"ts {event.get('ts')!r} and dur {event.get('dur')!r} must be finite numbers, dur not negative"
            raise _malformed(index, event, why)
        args = event.get("args") or {}
        if type(args) is not dict:
            raise _malformed(index, event, f"args must be an object, got {type(args).__name__}")
        name = str(event.get("name", ""))
        if kind == 0:
            stream = args.get("stream", event.get("tid", 0))
            correlation = args.get("correlation")
            size = args.get("bytes", 0)
            gpu.append(
                GpuOp(
                    start,
                    start + duration,
                    stream if type(stream) is int else -1,
                    name,
                    category,
                    correlation if type(correlation) is int else None,
                    size if type(size) is int and size >= 0 else 0,
                )
            )
            continue
        tid = event.get("tid", 0)
        if type(tid) is str:  # some tools name their threads
            tid = hash(tid)
        elif type(tid) is not int:
            raise _malformed(index, event, f"tid must be a number or a name, got {tid!r}")
        if kind == 1:
            correlation = args.get("correlation")
            host.append(HostCall(start, start + duration, name, tid, correlation if type(correlation) is int else None))
        else:
            ranges.append(HostRange(start, start + duration, name, tid, category))
    for items in (gpu, host, ranges):
        items.sort(key=_BY_TIME)
    trace.events_read = count
    return trace


def load(path: str | Path, limit: int | None = None, raise_with: str = "") -> Trace:
    """Read a trace file (``.json`` or ``.json.gz``, unpacked to at most ``limit`` bytes, e.g.
    :data:`~pytest_syncguard.files.MAX_UNPACKED_BYTES` for a file from elsewhere; ``raise_with`` says how to raise
    it; None: the plugin's own capture, unbounded); a :class:`TraceError` names the file on bad input, and the event
    where one is malformed."""
    path = Path(path)
    try:
        raw = read_unpacked(path, limit, raise_with)
    except TooLarge as exc:
        raise TraceError(str(exc)) from None
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise TraceError(f"{path}: cannot read the trace: {exc}") from None
    with paused_gc():
        try:
            data = _loads(raw)
        except ValueError as exc:
            raise TraceError(f"{path}: not a JSON trace (truncated or corrupt?): {exc}") from None
        events = data.get("traceEvents") if isinstance(data, dict) else data
        if not isinstance(events, list):
            raise TraceError(f"{path}: no 'traceEvents' list: not a Chrome/PyTorch profiler trace")
        try:
            return from_events(events)
        except TraceError as exc:
            raise TraceError(f"{path}: {exc}") from None
