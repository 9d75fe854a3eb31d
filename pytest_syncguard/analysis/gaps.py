"""Device idle gaps and busy time over a trace, and the cause of each gap (pure functions, no torch).

One definition for every timeline source (trace, PM samples, a saved timeline file): the GPU is idle when no
kernel runs on any stream (:func:`occupies`). Copies between host and device and memsets, which the copy engines
run, do not end an idle stretch; a device-to-device copy does (the runtime runs it as a kernel). An idle stretch
shorter than :data:`MIN_GAP_US` is no gap and counts as busy. Each op belongs to the decode step in which the
host launched it; warm-up steps are left out. Steps come, in this order of preference, from the loop's own
marks (``region.step()``: ``syncguard.step.marked``), from the forward calls of the region's model
(``syncguard.step``) or a profiler schedule (``ProfilerStep#N``), else from the launches of CUDA graphs (a loop
that replays one graph per step marks its steps by replaying it). A gap is attributed from the host side of the
kernel that ended it:

- ``host sync``: a blocking call (``cudaStreamSynchronize``, ...) returned on the launching thread after the
  device went idle and before the launch: the host waited for the device, then had to refill its queue;
- ``launch-bound``: the launch returned after the device went idle (the kernel reached the device after it had
  run out of work: a launch call that began 1-3 µs before the idle moment returned 5-7 µs after it in the H100
  traces of tests/data), with no sync in between: the host was busy in operators or Python;
- ``collective wait``: the launch came after the device went idle, the host in a collective call in between (a
  gloo or blocking collective, where the trace recorded the host's operators); or the op is NCCL's kernel, launched
  before and started late;
- ``copy wait``: the op was launched before the device went idle and started late, held on its stream by a copy
  or memset that ended in the gap;
- ``other``: the op was launched before the device went idle and still started late: an event wait or another
  stream held it.

Every gap's idle time is summed by its cause (:func:`idle_of`). The PM samples know the host's syncs and when its
launch calls returned: there, idle time is a host sync, launch-bound or other (:mod:`.sampled`).
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import NamedTuple

from .reliability import graph_problem, overlap_problem
from .trace_file import BLOCKING_CALLS, GRAPH_LAUNCHES, GpuOp, HostCall, HostRange, Trace, paused_gc

STEP_ANNOTATION = "syncguard.step"
MARKED_STEP_ANNOTATION = "syncguard.step.marked"
REGION_ANNOTATION = "syncguard.region"
SYNC_ANNOTATION = "syncguard.sync"
#: Host and device clocks are aligned by the profiler to about a microsecond.
SLACK_US = 1.0
#: The shortest idle stretch that is a gap (µs), in every source: the PM sampler's resolution. A shorter one (a
#: CUDA graph's kernels follow each other closer) counts as busy.
MIN_GAP_US = 1.0
#: The device-to-device copies of a trace (``Memcpy DtoD (Device -> Device)``): the runtime runs them as kernels.
DEVICE_COPY = "DtoD"
HOST_SYNC, LAUNCH_BOUND, COLLECTIVE_WAIT, COPY_WAIT, OTHER = (
    "host sync",
    "launch-bound",
    "collective wait",
    "copy wait",
    "other",
)
#: The host's ranges of a collective call (torch.distributed's operators and the backends' own ranges).
_COLLECTIVE_RANGE = re.compile(r"^(c10d::|nccl:|gloo:)|record_param_comms")
#: NCCL's kernels (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``, ``ncclKernel_...``).
_COLLECTIVE_KERNEL = re.compile(r"^nccl(Dev)?Kernel")
NO_LAUNCH_RECORD = "no launch record for this op (the trace lost it, or another profiler did not record its launch)"
#: How to see which operators kept the host from launching (see :func:`attribute`).
OPS_HINT = "--syncguard-gap-ops reruns a failing test to list them"
#: Where a region's decode steps came from.
MARKED_STEPS, FORWARD_STEPS, GRAPH_STEPS, NO_STEPS = "marked", "forward calls", "CUDA graph launches", ""


class Gap(NamedTuple):
    """The device idle from ``start`` to ``end`` (µs); ``step`` is the decode step of the op that ended it."""

    start: float
    end: float
    step: int | None
    next_op: GpuOp

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class AttributedGap:
    """One of the largest idle gaps of a region, with its cause and what the host did before it."""

    duration_us: float
    start_us: float
    step: int | None
    cause: str
    detail: str
    next_op: str


class BusyRun(NamedTuple):
    """A stretch of the device timeline from the end of one gap to the start of the next (µs), and how much of it
    the device was busy: all of it, in every source (an idle stretch inside it is shorter than a gap)."""

    start: float
    end: float
    busy: float


class StepSpan(NamedTuple):
    """A decode step on the device: its number and the start of its first op to the end of its last (µs)."""

    step: int
    start: float
    end: float


class SyncMark(NamedTuple):
    """A counted host-device sync: when it returned, the host resuming (µs; the same for every timeline source),
    and its kind and call site."""

    time: float
    label: str


def idle_of(gaps: Iterable[Gap], host: _Host) -> dict[str, float]:
    """The idle time of a trace's gaps by the cause of each (:func:`cause`), as the largest are attributed one by
    one: host sync, launch-bound, collective wait, copy wait, other."""
    totals = dict.fromkeys((HOST_SYNC, LAUNCH_BOUND, COLLECTIVE_WAIT, COPY_WAIT, OTHER), 0.0)
    for gap in gaps:
        totals[cause(gap, host)] += gap.duration
    return totals


def runs_between(gaps: Sequence[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """The stretches of ``[start, end]`` between ``gaps`` ((start, end) pairs in time order, inside it)."""
    edges = [start, *(t for gap in gaps for t in gap), end]
    return list(zip(edges[::2], edges[1::2], strict=True))


@dataclass(frozen=True)
class StreamView:
    """One stream of a region on its own: its ops, busy time and widest gap."""

    stream: int
    ops: int
    busy_us: float
    span_us: float
    max_gap_us: float

    @property
    def busy_fraction(self) -> float:
        return self.busy_us / self.span_us if self.span_us > 0 else 1.0


@dataclass(frozen=True)
class JudgedSteps:
    """The decode steps of a region that a timeline judges, and what the device did in them."""

    steps: int
    """Decode steps seen in the region (0 when the trace has no step annotations)."""
    warmup_steps: int
    judged_steps: int
    gpu_ops: int
    span_us: float
    busy_us: float


@dataclass(frozen=True)
class TimelineSummary(JudgedSteps):
    """What a report keeps of one region's timeline: its steps, size and largest gaps, with their causes. The
    statistics that budgets and baselines read (max and p99 gap, busy fraction) are the test's metrics."""

    region: int
    """Which of the test's regions with GPU work it is (1-based)."""
    gaps: int
    p50_gap_us: float
    top_gaps: tuple[AttributedGap, ...]
    streams: tuple[StreamView, ...]
    steps_from: str = NO_STEPS
    """Where the steps came from (:data:`MARKED_STEPS`, ...); empty when there are none."""
    idle_us_by_cause: Mapping[str, float] = field(default_factory=dict)
    """The device's idle time in the judged part by cause (:attr:`Timeline.idle_us`); empty in results written
    before it was kept."""


@dataclass(frozen=True)
class Timeline(JudgedSteps):
    """What the device did in the judged steps of a region, every gap included."""

    gaps_us: tuple[float, ...]
    """Every idle gap between device ops, in time order."""
    top_gaps: tuple[AttributedGap, ...]
    streams: tuple[StreamView, ...] = field(default=())
    steps_from: str = NO_STEPS
    unreliable: str | None = None
    """Why the timeline's numbers cannot be trusted (lost graph kernels, overlapping ops), if so."""
    origin_us: float = 0.0
    """Where time 0 of :attr:`runs`, :attr:`step_spans`, :attr:`syncs` and the gaps' starts lies on the source's
    clock (µs): 0 for a trace, whose times are the trace's own; a sampled region's first sample on the wall clock,
    whose times (about 1.7e15 µs) a float holds only to a quarter of a microsecond."""
    runs: tuple[BusyRun, ...] = ()
    """The device's busy stretches between the gaps, in time order (µs from :attr:`origin_us`): the gaps are what
    lies between consecutive runs, and the runs' busy time adds up to :attr:`busy_us`."""
    step_spans: tuple[StepSpan, ...] = ()
    """Each judged step on the device: from its first op's start to its last op's end."""
    syncs: tuple[SyncMark, ...] = ()
    """The counted syncs the host made in the judged part, with their call sites (µs from :attr:`origin_us`)."""
    idle_us: Mapping[str, float] = field(default_factory=dict)
    """The gaps' idle time by cause (:func:`idle_of` of a trace; of samples, their own reading)."""

    @property
    def busy_fraction(self) -> float:
        return self.busy_us / self.span_us if self.span_us > 0 else 1.0

    def gap_stat(self, stat: str) -> float:
        """``max``, ``mean`` or a percentile ``pNN`` (linear interpolation) of the gaps; 0 when there is none."""
        return gap_stat(self.gaps_us, stat)

    def summary(self, region: int = 1) -> TimelineSummary:
        judged = {f.name: getattr(self, f.name) for f in fields(JudgedSteps)}
        return TimelineSummary(
            **judged,
            region=region,
            gaps=len(self.gaps_us),
            p50_gap_us=self.gap_stat("p50"),
            top_gaps=self.top_gaps,
            streams=self.streams,
            steps_from=self.steps_from,
            idle_us_by_cause=dict(self.idle_us),
        )


def parse_stat(stat: str) -> float | None:
    """``max`` -> None; ``mean`` -> -1; ``pNN`` -> NN in (0, 100]; ValueError for anything else."""
    if stat == "max":
        return None
    if stat == "mean":
        return -1.0
    if isinstance(stat, str) and stat.startswith("p"):
        try:
            q = float(stat[1:])
        except ValueError:
            q = -1.0
        if 0 < q <= 100:
            return q
    raise ValueError(f"stat must be 'max', 'mean' or a percentile such as 'p99', got {stat!r}")


def gap_stat(gaps: Sequence[float], stat: str) -> float:
    q = parse_stat(stat)
    if not gaps:
        return 0.0
    if q is None:
        return max(gaps)
    if q < 0:
        return sum(gaps) / len(gaps)
    ordered = sorted(gaps)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def occupies(op: GpuOp) -> bool:
    """Whether ``op`` keeps the GPU busy: a kernel, or a device-to-device copy (not a host copy or a memset)."""
    return op.category == "kernel" or (op.category == "gpu_memcpy" and DEVICE_COPY in op.name)


def merge(ops: Sequence[GpuOp]) -> tuple[float, list[Gap]]:
    """Busy time of ``ops`` (sorted by start) with overlaps merged, and the idle gaps between them; an idle
    stretch under :data:`MIN_GAP_US` is busy."""
    busy = 0.0
    gaps: list[Gap] = []
    if not ops:
        return busy, gaps
    run_start, run_end = ops[0].start, ops[0].end
    for op in ops[1:]:
        if op.start - run_end >= MIN_GAP_US:
            busy += run_end - run_start
            gaps.append(Gap(run_end, op.start, None, op))
            run_start = op.start
        if op.end > run_end:
            run_end = op.end
    busy += run_end - run_start
    return busy, gaps


class _Host:
    """Index of the host side of a trace: launches by correlation, blocking calls and ranges per thread."""

    def __init__(self, trace: Trace) -> None:
        self.launch: dict[int, HostCall] = {}
        self.blocking: dict[int, list[HostCall]] = {}
        for call in trace.host_calls:
            if call.correlation is not None:
                self.launch.setdefault(call.correlation, call)
            if call.name in BLOCKING_CALLS:
                self.blocking.setdefault(call.tid, []).append(call)
        for calls in self.blocking.values():
            calls.sort(key=lambda c: c.end)
        self.blocking_ends = {tid: [c.end for c in calls] for tid, calls in self.blocking.items()}
        self.ranges: dict[int, list[HostRange]] = {}
        self.recorded_ops = False
        """Whether the trace recorded the host's operators (a capture with ``host_ops``, or another profiler's)."""
        for r in trace.ranges:
            self.ranges.setdefault(r.tid, []).append(r)
            self.recorded_ops = self.recorded_ops or r.category == "cpu_op"
        self.range_starts = {tid: [r.start for r in rs] for tid, rs in self.ranges.items()}
        self.copies: dict[int, list[GpuOp]] = {}
        self.copy_ends: dict[int, list[float]] = {}

    def with_copies(self, ops: Iterable[GpuOp]) -> _Host:
        """Keep the copies and memsets among ``ops`` (those that do not occupy the device), by stream."""
        for op in ops:
            if not occupies(op):
                self.copies.setdefault(op.stream, []).append(op)
        for copies in self.copies.values():
            copies.sort(key=lambda c: c.end)
        self.copy_ends = {stream: [c.end for c in copies] for stream, copies in self.copies.items()}
        return self

    def copy_ended_in(self, stream: int, start: float, end: float) -> GpuOp | None:
        """A copy on ``stream`` that ran into the gap ``[start, end]`` and ended in it (None: none)."""
        ends = self.copy_ends.get(stream)
        if not ends:
            return None
        index = bisect.bisect_left(ends, start)
        if index < len(ends) and ends[index] <= end + SLACK_US:
            return self.copies[stream][index]
        return None

    def launched_at(self, op: GpuOp) -> HostCall | None:
        return self.launch.get(op.correlation) if op.correlation is not None else None

    def last_blocking_before(self, tid: int, time: float) -> HostCall | None:
        ends = self.blocking_ends.get(tid)
        if not ends:
            return None
        index = bisect.bisect_right(ends, time) - 1
        return self.blocking[tid][index] if index >= 0 else None

    def enclosing(self, tid: int, time: float, limit: int = 400) -> list[HostRange]:
        """Ranges on ``tid`` that contain ``time``, outermost first (a bounded backward scan)."""
        starts = self.range_starts.get(tid)
        if not starts:
            return []
        ranges = self.ranges[tid]
        index = bisect.bisect_right(starts, time) - 1
        found = []
        while index >= 0 and limit > 0:
            r = ranges[index]
            if r.end >= time:
                found.append(r)
            index -= 1
            limit -= 1
        return found[::-1]

    def ops_between(self, tid: int, start: float, end: float) -> list[HostRange]:
        """Top-level operators on ``tid`` that ran inside ``[start, end]``."""
        starts = self.range_starts.get(tid)
        if not starts:
            return []
        ranges = self.ranges[tid]
        index = bisect.bisect_left(starts, start)
        found: list[HostRange] = []
        while index < len(ranges) and ranges[index].start < end:
            r = ranges[index]
            if r.category == "cpu_op" and not (found and r.end <= found[-1].end):
                found.append(r)
            index += 1
        return found


def _site_of(ranges: Sequence[HostRange]) -> str:
    """The probe's annotation of the sync (its Python call site), else the outermost operator."""
    for r in reversed(ranges):
        if r.name.startswith(SYNC_ANNOTATION):
            return r.name[len(SYNC_ANNOTATION) :].strip()
    ops = [r.name for r in ranges if r.category == "cpu_op"]
    return ops[0] if ops else "no operator around it"


def _in_collective(host: _Host, tid: int, start: float, end: float, limit: int = 400) -> str | None:
    """A collective call of the host thread ``tid`` that ran within ``[start, end]`` (None: none; a bounded
    backward scan)."""
    starts = host.range_starts.get(tid)
    if not starts:
        return None
    ranges = host.ranges[tid]
    index = bisect.bisect_left(starts, end) - 1
    while index >= 0 and limit > 0:
        r = ranges[index]
        if r.end > start and _COLLECTIVE_RANGE.search(r.name):
            return r.name
        index -= 1
        limit -= 1
    return None


def _after_idle(launch: HostCall, gap: Gap) -> bool:
    """Whether ``launch`` returned after the device went idle (its kernel reached a device that had run out of work)."""
    return launch.end >= gap.start - SLACK_US


def _sync_in(gap: Gap, host: _Host, launch: HostCall) -> HostCall | None:
    """The blocking call that returned on the launching thread after the device went idle and before the launch."""
    sync = host.last_blocking_before(launch.tid, launch.start + SLACK_US)
    return sync if sync is not None and sync.end >= gap.start - SLACK_US else None


def cause(gap: Gap, host: _Host) -> str:
    """The cause of one gap (:func:`attribute`'s, without its details): what every gap's idle time is summed by."""
    op = gap.next_op
    launch = host.launched_at(op)
    if launch is None:
        return OTHER
    if _sync_in(gap, host, launch) is not None:
        return HOST_SYNC
    if _after_idle(launch, gap):
        return COLLECTIVE_WAIT if _in_collective(host, launch.tid, gap.start, launch.start) else LAUNCH_BOUND
    if _COLLECTIVE_KERNEL.match(op.name):
        return COLLECTIVE_WAIT
    return COPY_WAIT if host.copy_ended_in(op.stream, gap.start, gap.end) is not None else OTHER


def attribute(gap: Gap, host: _Host) -> AttributedGap:
    """The cause of one gap (:func:`cause`), with what the host side of the op that ended it says of it."""
    op = gap.next_op
    launch = host.launched_at(op)
    found = cause(gap, host)
    if launch is None:
        detail = NO_LAUNCH_RECORD
    elif found == HOST_SYNC:
        sync = _sync_in(gap, host, launch)
        assert sync is not None
        where = _site_of(host.enclosing(launch.tid, sync.start))
        detail = f"{sync.name} at {where}; next launch {launch.start - sync.end:.0f} us after it returned"
    elif found == COLLECTIVE_WAIT and _after_idle(launch, gap):
        detail = (
            f"the host was in {_in_collective(host, launch.tid, gap.start, launch.start)} after the device went "
            f"idle, and its {launch.name} returned {launch.end - gap.start:.0f} us after it did"
        )
    elif found == COLLECTIVE_WAIT:
        detail = f"the collective's kernel was launched {gap.start - launch.end:.0f} us before and started late"
    elif found == COPY_WAIT:
        copy = host.copy_ended_in(op.stream, gap.start, gap.end)
        assert copy is not None
        detail = (
            f"launched {gap.start - launch.end:.0f} us before the device went idle, held on its stream by "
            f"{copy.name} ({copy.end - copy.start:.0f} us)"
        )
    elif found == LAUNCH_BOUND and not host.recorded_ops:
        detail = (
            f"host's {launch.name} returned {launch.end - gap.start:.0f} us after the device went idle (the "
            f"host's operators are not recorded: {OPS_HINT})"
        )
    elif found == LAUNCH_BOUND:
        ops = host.ops_between(launch.tid, gap.start, launch.start)
        in_ops = sum(min(r.end, launch.start) - max(r.start, gap.start) for r in ops)
        names = Counter(r.name for r in ops).most_common(4)
        listed = ", ".join(f"{name} x{n}" if n > 1 else name for name, n in names) or "none"
        detail = (
            f"host's {launch.name} returned {launch.end - gap.start:.0f} us after the device went idle; "
            f"ops between: {listed} ({in_ops:.0f} us in ops, the rest in Python or the runtime)"
        )
    else:
        detail = (
            f"launched {gap.start - launch.end:.0f} us before the device went idle, started late: "
            "an event wait or another stream held it"
        )
    return AttributedGap(gap.duration, gap.start, gap.step, found, detail, op.name)


def steps_note(steps_from: str) -> str:
    """``"; steps: <source>"`` for a failure text, where the steps are not the model's forward calls (the usual
    source, left unsaid); empty where there are none."""
    return f"; steps: {steps_from}" if steps_from not in (FORWARD_STEPS, NO_STEPS) else ""


def step_starts(trace: Trace, window: tuple[float, float] | None) -> tuple[list[float], str]:
    """When each decode step in ``window`` began (host time, sorted), and where the steps came from."""

    def inside(time: float) -> bool:
        return window is None or window[0] <= time <= window[1]

    marked, forward = [], []
    for r in trace.ranges:
        if r.category != "user_annotation" or not inside(r.start):
            continue
        if r.name == MARKED_STEP_ANNOTATION:
            marked.append(r.start)
        elif r.name == STEP_ANNOTATION or r.name.startswith("ProfilerStep#"):
            forward.append(r.start)
    if marked:
        return marked, MARKED_STEPS
    if forward:
        return forward, FORWARD_STEPS
    graphs = [c.start for c in trace.host_calls if c.name in GRAPH_LAUNCHES and inside(c.start)]
    return (graphs, GRAPH_STEPS) if graphs else ([], NO_STEPS)


def regions(trace: Trace) -> dict[int, tuple[float, float]]:
    """The plugin's measured regions in the trace (annotations ``syncguard.region#N``), by number."""
    found = {}
    prefix = REGION_ANNOTATION + "#"
    for r in trace.ranges:
        if r.name.startswith(prefix) and r.name[len(prefix) :].isdigit():
            found[int(r.name[len(prefix) :])] = (r.start, r.end)
    return found


def analyze(
    trace: Trace,
    *,
    window: tuple[float, float] | None = None,
    warmup_steps: int = 0,
    top: int = 10,
) -> Timeline | None:
    """The device timeline of the ops launched inside ``window`` (host time; all when None) after
    ``warmup_steps`` steps; None when no device op qualifies."""
    with paused_gc():
        return _analyze(trace, window, warmup_steps, top)


def _analyze(trace: Trace, window: tuple[float, float] | None, warmup_steps: int, top: int) -> Timeline | None:
    host = _Host(trace)
    starts, steps_from = step_starts(trace, window)
    judged: list[GpuOp] = []
    step_of: dict[int, int | None] = {}
    for op in trace.gpu_ops:
        launch = host.launched_at(op)
        when = launch.start if launch is not None else op.start
        if window is not None and not (window[0] <= when <= window[1]):
            continue
        step = bisect.bisect_right(starts, when) - 1 if starts else None
        if step is not None and step < warmup_steps:
            continue
        step_of[id(op)] = step
        judged.append(op)
    host.with_copies(judged)
    busy_ops = [op for op in judged if occupies(op)]
    if not busy_ops:
        return None
    first = judged[0].start if not starts or warmup_steps >= len(starts) else starts[warmup_steps]
    launches = [c for c in trace.host_calls if c.start >= first and (window is None or c.start <= window[1])]
    unreliable = graph_problem(launches, trace.gpu_ops)
    busy, gaps = merge(busy_ops)
    gaps = [g._replace(step=step_of[id(g.next_op)]) for g in gaps]
    last_end = max(o.end for o in busy_ops)
    runs = tuple(
        BusyRun(a, b, b - a) for a, b in runs_between([(g.start, g.end) for g in gaps], busy_ops[0].start, last_end)
    )
    spans: dict[int, list[float]] = {}
    for op in busy_ops:
        step = step_of[id(op)]
        if step is not None:
            extent = spans.setdefault(step, [op.start, op.end])
            extent[0], extent[1] = min(extent[0], op.start), max(extent[1], op.end)
    end = window[1] if window is not None else float("inf")
    syncs = tuple(
        SyncMark(r.end, r.name[len(SYNC_ANNOTATION) :].strip())  # when it returned; it counts where it was asked
        for r in trace.ranges
        if r.name.startswith(SYNC_ANNOTATION) and first <= r.start <= end
    )
    largest = sorted(gaps, key=lambda g: -g.duration)[:top]
    by_stream: dict[int, list[GpuOp]] = {}
    for op in judged:
        by_stream.setdefault(op.stream, []).append(op)
    streams = []
    for stream, ops in sorted(by_stream.items()):
        unreliable = unreliable or overlap_problem(stream, ops)
        kernels = [op for op in ops if occupies(op)]
        if not kernels:
            continue
        stream_busy, stream_gaps = merge(kernels)
        span = max(o.end for o in kernels) - kernels[0].start
        widest = max((g.duration for g in stream_gaps), default=0.0)
        streams.append(StreamView(stream, len(kernels), stream_busy, span, widest))
    return Timeline(
        steps=len(starts),
        warmup_steps=min(warmup_steps, len(starts)) if starts else 0,
        judged_steps=max(len(starts) - warmup_steps, 0) if starts else 0,
        gpu_ops=len(judged),
        span_us=last_end - busy_ops[0].start,
        busy_us=busy,
        gaps_us=tuple(g.duration for g in gaps),
        top_gaps=tuple(attribute(g, host) for g in largest),
        streams=tuple(streams),
        steps_from=steps_from,
        unreliable=unreliable,
        runs=runs,
        step_spans=tuple(StepSpan(step, a, b) for step, (a, b) in sorted(spans.items())),
        syncs=syncs,
        idle_us=idle_of(gaps, host),
    )
