"""Whether a trace's timeline can be trusted (pure functions, no torch). A trace that lost events, lost the
kernels of graph replays, or has ops overlapping on one stream gives no number: it gives the reason.

- Lost events: the capture launches a sentinel kernel inside the annotation :data:`SENTINEL_ANNOTATION` just
  before it stops. CUPTI stops recording device activity once the profiler's buffers are full, so a trace
  whose sentinel has no kernel is missing events from some point on.
- Graph replays: each CUDA graph launch should show the kernels it ran (CUPTI records graph kernels one by
  one, correlated with the launch); a launch without any means they were not recorded.
- Overlaps: ops of one stream run one after another; two that overlap by more than the clock's slack mean
  the timestamps are wrong (or one op was recorded twice).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from .trace_file import GRAPH_LAUNCHES, GpuOp, HostCall, Trace

SENTINEL_ANNOTATION = "syncguard.sentinel"
#: Overlap on one stream that is still taken for clock jitter, in us.
OVERLAP_SLACK_US = 1.0
#: How far before its launch call a device op may start before the trace's two clocks are taken to disagree (µs):
#: a kernel cannot start before the host asked for it, and the profiler aligns the clocks to about a microsecond.
LAUNCH_SLACK_US = 10.0


def sentinel_problem(trace: Trace) -> str | None:
    """Why the trace lost events, judged by the capture's sentinel (None: it did not)."""
    marks = [r for r in trace.ranges if r.name == SENTINEL_ANNOTATION]
    if not marks:
        return "the capture's end marker is missing from the trace: host events were lost"
    mark = marks[-1]
    launched = {
        c.correlation
        for c in trace.host_calls
        if c.correlation is not None and mark.start <= c.start <= mark.end and c.tid == mark.tid
    }
    if any(op.correlation in launched for op in reversed(trace.gpu_ops)):
        return None
    return (
        "device events were lost: the kernel the capture launched last is not in the trace (the profiler's "
        "device buffers filled; capture fewer steps or a shorter region)"
    )


def graph_problem(launches: Iterable[HostCall], judged: Sequence[GpuOp]) -> str | None:
    """Why graph replays among ``launches`` cannot be trusted: a graph launch without any recorded kernel."""
    graph_launches = [c for c in launches if c.name in GRAPH_LAUNCHES and c.correlation is not None]
    if not graph_launches:
        return None
    ran = {op.correlation for op in judged if op.correlation is not None}
    missing = sum(c.correlation not in ran for c in graph_launches)
    if not missing:
        return None
    return (
        f"{missing} of {len(graph_launches)} CUDA graph launches have no kernels in the trace: the profiler did not "
        "record the kernels of graph replays"
    )


def overlap_problem(stream: int, ops: Sequence[GpuOp]) -> str | None:
    """Why one stream's ops (sorted by start) cannot be trusted: two of them overlap."""
    for before, after in itertools.pairwise(ops):
        overlap = before.end - after.start
        if overlap > OVERLAP_SLACK_US:
            return (
                f"two ops overlap by {overlap:.1f} us on stream {stream} ({before.name[:60]} and "
                f"{after.name[:60]}): ops of one stream cannot run at once, so the trace's timestamps are wrong"
            )
    return None


def clock_problem(trace: Trace, slack_us: float = LAUNCH_SLACK_US) -> str | None:
    """Why a trace's host and device clocks cannot be read against each other, if so: device ops that start more
    than ``slack_us`` before the call that launched them (matched by correlation). A gap's cause reads the host's
    calls against the device's time, so in such a trace it can blame the wrong call."""
    launched = {c.correlation: c.start for c in trace.host_calls if c.correlation is not None}
    early = [
        launched[op.correlation] - op.start
        for op in trace.gpu_ops
        if op.correlation in launched and op.start < launched[op.correlation] - slack_us
    ]
    if not early:
        return None
    return (
        f"{len(early)} of {len(trace.gpu_ops)} device ops start before the host launched them (by up to "
        f"{max(early):.1f} us): the trace's host and device clocks disagree, and a gap's cause, read from the host's "
        "calls, may name the wrong one"
    )
