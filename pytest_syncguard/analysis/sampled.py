"""Busy time and idle gaps of the device from PM samples (pure functions, no torch).

A sample covers ``[start, end)`` of device time and says what fraction of it the device's compute work was
active. Busy time is the sum of the active parts. Where inside a partly active sample its idle part lies is not
known: it is placed next to an idle neighbour (at the sample's end when the next sample is idle, at its start when
the previous one is, split between both when both are), else across the boundary with a partly active neighbour
(one gap that straddles it), else in the middle as a gap of its own. Idle parts that touch merge into one gap, so
a gap is known to within one sample interval at each end, and ends :data:`KERNEL_LEAD_NS` after the samples
show the engine active again (its front end reads active before the kernel starts). As in every source
(:mod:`.gaps`), an idle stretch shorter than :data:`~.gaps.MIN_GAP_US` is no gap and counts as busy, and busy
time is the span less the gaps. A sample below :data:`IDLE_BELOW` is idle. A region's timeline runs from the
device's first busy moment to its last, as a trace's runs from its first kernel to its last. The samples read
the compute engine, which is what the definition asks: a copy or memset that no kernel overlaps is idle time in
both (docs/explanation/timeline.md).

Decode steps are placed on the samples' clock by CUDA events (:class:`StepEvents`): the probe records an anchor
event, launches a short marker kernel and records a second event when the region begins, then one event per step.
The marker's end is seen in the samples and timed from the anchor by the events, which puts every step's event on
the samples' clock. A step's event completes when the work queued before it on its stream has finished, so it lies
between the last op of the step before and the first op of its own step, as the host's launches divide them in a
trace: a gap belongs to the step in which it ends (the op that ended it was launched in that step).

A gap's cause comes from the host's records on the same clock (:class:`_Host`): the counted syncs, and when each
launch call returned (the launch log), moved onto the samples' clock by the marker kernel's launch
(:func:`launches_on_samples`): host sync, launch-bound, or other (its work was queued before it); a gap whose work
was queued behind the launch of a CUDA graph that holds memset or copy nodes is a copy wait (:class:`GraphNodes`).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from .gaps import (
    COPY_WAIT,
    HOST_SYNC,
    LAUNCH_BOUND,
    MIN_GAP_US,
    NO_STEPS,
    OTHER,
    AttributedGap,
    BusyRun,
    StepSpan,
    SyncMark,
    Timeline,
    runs_between,
)

#: A sample less active than this is idle (the counters of an idle engine read a few stray cycles).
IDLE_BELOW = 0.02
#: Where a sampled timeline's steps come from when the region had none: it is judged whole.
SAMPLED_STEPS = "none: no marked step, forward call or graph replay in the region, which is judged whole"
#: The cause of a sampled gap in which no counted sync returned, where the region's launches were not logged: the
#: sampler sees when the device was idle, not why, and without the launches a launch-bound gap and another look
#: alike.
IDLE = "idle"
IDLE_DETAIL = (
    "sampled: the sampler sees when the device was idle, not why (no counted sync returned in it, and the launches "
    "were not logged: {why}; --syncguard-gap-ops reruns a failing test under the trace capture to attribute its gaps)"
)
#: Why a sampled region's launches are not known where nobody said why (samples read without a region's probes).
NOT_LOGGED = "no launch log was kept with these samples"
#: A sampled gap is launch-bound when the last launch call that returned before the device resumed did so after
#: the device went idle, and the device resumed within :data:`RESUME_US` of it: the host queued the work that ended
#: the gap after the device had run out of it. How far apart the host's stamps and the samples may stand once the
#: marker kernel has put them on one clock (µs): its placement moved by 0.05-0.7 µs between runs on an H200.
LAUNCH_SLACK_US = 2.0
#: How soon after a launch that found the device idle the device resumes, on the samples' clock (µs): the marker's
#: own launch, which finds the device idle too, sets that clock, so within a few µs.
RESUME_US = 10.0
#: A launch call still running when the device resumed held the device up only where the device went idle within
#: this long after the call was entered (µs): a call running longer was held up itself, by work queued before it (a
#: graph launched again before its last replay ended), not submitting. On an H200, the graph launches of
#: static_compiled's steps ran 130-160 µs and the device went idle 18 µs before to 19 µs after they were entered;
#: cuda_graph's waited 1.6-2 ms, its graphs' memset gaps falling 100-2000 µs into them.
RUNNING_CALL_US = 50.0
#: Why a gap whose work was queued before it is ``other`` on the samples.
QUEUED_DETAIL = (
    "sampled: the work that ended it was queued before the device went idle ({found}) and started late: an event "
    "wait, another stream, a copy or memset on its stream (the samples cannot tell which)"
)
#: Why a gap queued behind the replay of a CUDA graph with memset or copy nodes is a copy wait on the samples.
GRAPH_COPY_DETAIL = (
    "sampled: the work that ended it was queued before the device went idle, behind the launch of a CUDA graph "
    "({launched:.0f} us before the gap, no sync since) that holds {nodes}: the samples read the compute engine, and "
    "a graph's memsets and copies run between its kernels on the copy engine, which they cannot see, so this is a "
    "copy wait by elimination (--syncguard-gap-ops times each node's work)"
)
#: What a gap queued behind a graph whose capture was not read adds to :data:`QUEUED_DETAIL`.
GRAPH_UNREAD = (
    "; it was queued behind a CUDA graph whose nodes are not known (captured before syncguard read captures, or "
    "the driver could not list them)"
)
#: How long before a kernel's start timestamp (CUPTI's record) the compute engine reads active (ns): its front end
#: takes the launch first. Against the records of the same runs on an H100 (GPU-89b33f43, seven strategies), a
#: sampled gap's start agreed with the records' (median 0) and its end came early by a median of 0.26 µs on the
#: five eager loops (0.77 between a graph's kernels): each sampled gap ends this much later, so that the samples'
#: gaps are the records' (busy within 1.6%, p99 within 2%, tests/test_sampled_steps.py).
KERNEL_LEAD_NS = 256
#: How far the host's wall clock and the samples' may stand apart (µs): tens of µs on the lent H100s (a 1 ms sleep
#: kernel began 46-73 µs after the host's stamp before its launch and ended 5-35 µs before the stamp after its sync).
CLOCK_SLACK_US = 100.0


@dataclass(frozen=True)
class StepEvents:
    """A sampled region's CUDA events as times from its anchor event (µs, as ``cudaEventElapsedTime`` gives them,
    to about half a microsecond): the end of the marker kernel launched right after the anchor, and the start of
    each decode step, from the source :func:`.gaps.step_starts` would have chosen (marks, forward calls, graph
    replays)."""

    marker_end_us: float
    steps_us: tuple[float, ...] = ()
    steps_from: str = NO_STEPS


@dataclass(frozen=True)
class PlacedSteps:
    """Where a sampled region's judged part begins and its steps start, on the samples' clock (ns)."""

    begin_ns: int
    """The end of the marker's last sample: the loop's own work comes after it."""
    steps_ns: tuple[int, ...]
    steps_from: str
    marker_ns: int = 0
    """When the marker kernel began, in the samples."""

    def judged_from(self, warmup_steps: int) -> int:
        """Where the judged part begins: the start of step ``warmup_steps`` (the marker's end without steps)."""
        if warmup_steps < len(self.steps_ns):
            return max(self.begin_ns, self.steps_ns[warmup_steps])
        return self.begin_ns if not self.steps_ns else 1 << 62


@dataclass(frozen=True)
class GraphNodes:
    """What a captured CUDA graph holds, by node type (read when its capture ended, :mod:`..probes.graph_nodes`)."""

    kernels: int
    memsets: int
    copies: int
    others: int = 0

    @property
    def copy_nodes(self) -> int:
        """The nodes the copy engine may run between the graph's kernels: its memsets and copies."""
        return self.memsets + self.copies

    def __str__(self) -> str:
        return f"{self.kernels} kernel, {self.memsets} memset and {self.copies} copy nodes"


@dataclass(frozen=True)
class LaunchesOnSamples:
    """A region's launch calls on the samples' clock (:func:`launches_on_samples`): when each returned (ns), and how
    far the host's wall clock was moved to put them there (the same move puts its sync stamps there), when each was
    entered; the CUDA graph launches among them (ns, what the graph holds, None where its capture was not read)."""

    returned_ns: tuple[int, ...]
    shift_ns: int
    graphs: tuple[tuple[int, GraphNodes | None], ...] = ()
    entered_ns: tuple[int, ...] = ()
    """When each of the calls of :attr:`returned_ns` was entered (empty: not known; each returned as entered)."""


@dataclass(frozen=True)
class SampledTimeline:
    """The device over a region, from samples: busy and spanned time (µs) and each idle gap as (start, length) in
    µs from the region's first active sample, in order."""

    busy_us: float
    span_us: float
    gaps: tuple[tuple[float, float], ...]
    origin_ns: int = 0
    """When the first active sample began (ns on the samples' clock, which is the host's wall clock)."""
    runs: tuple[BusyRun, ...] = ()
    """The stretches between the gaps (µs from :attr:`origin_us`), each with the busy time of its samples."""
    steps: int = 0
    """Decode steps in the region, warm-up included (0: none, the region is judged whole)."""
    warmup_steps: int = 0
    steps_from: str = SAMPLED_STEPS
    gap_steps: tuple[int | None, ...] = ()
    """The step each gap ended in (None without steps), in the order of :attr:`gaps`."""
    step_spans: tuple[StepSpan, ...] = ()
    """Each judged step on the device: its first busy sample to its last (µs from the origin)."""

    @property
    def gaps_us(self) -> tuple[float, ...]:
        return tuple(length for _, length in self.gaps)

    @property
    def busy_fraction(self) -> float:
        return self.busy_us / self.span_us if self.span_us > 0 else 1.0

    def timeline(
        self,
        top: int = 10,
        syncs: Sequence[tuple[int, str]] = (),
        window: tuple[int, int] | None = None,
        launches: LaunchesOnSamples | str = NOT_LOGGED,
    ) -> Timeline:
        """As the plugin's :class:`~.gaps.Timeline`: its steps, the largest gaps with their causes, and every gap's
        idle time by cause. ``syncs`` are the counted syncs of the test as (ns on the samples' clock, call site);
        those the host made inside ``window`` (ns, the same clock: the judged part; else the span) are kept. The
        host's stamps and the samples agree to tens of microseconds (README), so a sync at an edge may lie just
        outside. ``launches`` are when the region's launch calls returned, on the samples' clock
        (:func:`launches_on_samples`), or why there are none; with them, the syncs are moved onto that clock as
        they were, and a sync's slack is theirs (:data:`LAUNCH_SLACK_US`)."""
        steps = self.gap_steps or (None,) * len(self.gaps)
        largest = sorted(range(len(self.gaps)), key=lambda i: -self.gaps[i][1])[:top]
        begin, end = window if window is not None else (self.origin_ns, self.origin_ns + round(self.span_us * 1e3))
        shift = launches.shift_ns if isinstance(launches, LaunchesOnSamples) else 0
        inside = tuple(
            SyncMark((ns + shift - self.origin_ns) / 1e3, label) for ns, label in syncs if begin <= ns + shift <= end
        )
        host = _Host(inside, launches, self.origin_ns)
        causes = [host.cause(start, start + length) for start, length in self.gaps]
        idle = dict.fromkeys((HOST_SYNC, LAUNCH_BOUND, COPY_WAIT, OTHER), 0.0)
        for (_, length), (found, _) in zip(self.gaps, causes, strict=True):
            idle[OTHER if found == IDLE else found] += length
        return Timeline(
            steps=self.steps,
            warmup_steps=self.warmup_steps,
            judged_steps=max(self.steps - self.warmup_steps, 0),
            gpu_ops=0,
            span_us=self.span_us,
            busy_us=self.busy_us,
            gaps_us=self.gaps_us,
            top_gaps=tuple(AttributedGap(self.gaps[i][1], self.gaps[i][0], steps[i], *causes[i], "") for i in largest),
            steps_from=self.steps_from,
            origin_us=self.origin_ns / 1e3,
            runs=self.runs,
            syncs=inside,
            step_spans=self.step_spans,
            idle_us=idle,
        )


class _Host:
    """What the host did during a sampled region, as µs from its origin: its counted syncs (when each returned) and
    its launch calls (when each returned), or why they were not logged."""

    def __init__(self, syncs: Sequence[SyncMark], launches: LaunchesOnSamples | str, origin_ns: int) -> None:
        self.syncs = sorted(syncs, key=lambda mark: mark.time)
        self.sync_times = [mark.time for mark in self.syncs]
        self.not_logged = launches if isinstance(launches, str) else None
        self.launches = [] if isinstance(launches, str) else [(ns - origin_ns) / 1e3 for ns in launches.returned_ns]
        entered = () if isinstance(launches, str) else launches.entered_ns
        self.entered = [(ns - origin_ns) / 1e3 for ns in entered] if entered else self.launches
        graphs = () if isinstance(launches, str) else launches.graphs
        self.graph_times = [(ns - origin_ns) / 1e3 for ns, _ in graphs]
        self.graph_nodes = [nodes for _, nodes in graphs]
        self.slack = CLOCK_SLACK_US if isinstance(launches, str) else LAUNCH_SLACK_US
        """How far the host's stamps and the samples may stand apart (µs): placed by the marker, a few µs."""

    def sync_in(self, start: float, end: float) -> SyncMark | None:
        """The last counted sync that returned in ``[start - slack, end]``."""
        index = bisect.bisect_right(self.sync_times, end) - 1
        return self.syncs[index] if index >= 0 and self.sync_times[index] >= start - self.slack else None

    def cause(self, start: float, end: float) -> tuple[str, str]:
        """The cause of the gap ``[start, end]`` (µs from the origin) and what the host's records say of it: a
        ``host sync`` where a counted sync returned in it (the host waited, then had to refill the queue); else,
        with the launches logged, ``launch-bound`` where the device resumed while a launch call was running that was
        entered at most :data:`RUNNING_CALL_US` before it went idle, or where the last launch that returned before
        the device resumed did so after it went idle, and it resumed within :data:`RESUME_US` of it; else the work
        that ended the gap was queued before it: a ``copy wait`` where that was behind a CUDA graph with memset or
        copy nodes, else ``other`` (:meth:`queued`). Without the launches: ``idle``."""
        sync = self.sync_in(start, end)
        if sync is not None:
            return HOST_SYNC, (
                f"{sync.label}; the device resumed {end - sync.time:.0f} us after it returned (sampled: host and "
                f"device clocks agree to about {self.slack:.0f} us)"
            )
        if self.not_logged is not None:
            return IDLE, IDLE_DETAIL.format(why=self.not_logged)
        running = bisect.bisect_left(self.launches, end + self.slack)
        entered = self.entered[running] if running < len(self.launches) else end
        if entered <= end - self.slack and start - entered <= RUNNING_CALL_US:
            returned = self.launches[running]
            return LAUNCH_BOUND, (
                f"sampled: the device resumed while a launch call was still running (entered {end - entered:.0f} us "
                f"before and returned {returned - end:.0f} us after: a CUDA graph's launch call runs on while the "
                "device starts the graph); the host had not yet queued the work"
            )
        index = bisect.bisect_right(self.launches, end + self.slack) - 1
        if index < 0 or self.launches[index] < start - self.slack:
            return self.queued(start, "no launch call returned while it was idle")
        returned = self.launches[index]
        if end - returned > RESUME_US:
            found = (
                f"the last launch call before it resumed returned {returned - start:.0f} us in, "
                f"{end - returned:.0f} us before it resumed"
            )
            return self.queued(start, found)
        return LAUNCH_BOUND, (
            f"sampled: a launch call returned {returned - start:.0f} us after the device went idle, and the device "
            f"resumed {max(end - returned, 0.0):.0f} us after it (--syncguard-gap-ops names the operators before it)"
        )

    def queued(self, start: float, found: str) -> tuple[str, str]:
        """The cause of a gap starting at ``start`` whose work was queued before it (``found``: what the launches
        say): a ``copy wait`` where the last CUDA graph launched before it holds memset or copy nodes and no counted
        sync returned since (which would have seen the replay finish), else ``other``."""
        index = bisect.bisect_right(self.graph_times, start + self.slack) - 1
        if index >= 0:
            launched = self.graph_times[index]
            since = bisect.bisect_left(self.sync_times, launched)
            if since == len(self.sync_times) or self.sync_times[since] >= start - self.slack:
                nodes = self.graph_nodes[index]
                if nodes is None:
                    return OTHER, QUEUED_DETAIL.format(found=found) + GRAPH_UNREAD
                if nodes.copy_nodes:
                    return COPY_WAIT, GRAPH_COPY_DETAIL.format(launched=start - launched, nodes=nodes)
        return OTHER, QUEUED_DETAIL.format(found=found)


def launches_on_samples(
    returned_ns: Sequence[int],
    placed: PlacedSteps,
    begin_ns: int,
    graphs: Sequence[tuple[int, GraphNodes | None]] = (),
    entered_ns: Sequence[int] = (),
) -> LaunchesOnSamples | str:
    """The region's launch calls (when each returned, ns on the host's wall clock, in order) on the samples' clock,
    the marker kernel's launch (the first after ``begin_ns``, the region's start) leaving them out: each is moved
    by the marker's start in the samples less its launch's return, which takes in the clocks' offset and the time a
    launch takes to reach an idle device; ``graphs`` are the CUDA graph launches among them (ns, what the graph
    holds), ``entered_ns`` when each call was entered (in the order of ``returned_ns``; empty: not known). A string
    says why they cannot be placed."""
    index = bisect.bisect_left(returned_ns, begin_ns)
    if index == len(returned_ns):
        return "the marker kernel's launch was not logged"
    shift = placed.marker_ns - returned_ns[index]
    if abs(shift) > CLOCK_SLACK_US * 1e3:
        return f"the marker kernel started {shift / 1e3:.0f} us after its launch returned, beyond the clocks' slack"
    after = returned_ns[index]
    placed_graphs = tuple((ns + shift, nodes) for ns, nodes in graphs if ns > after)
    placed_entries = tuple(ns + shift for ns in entered_ns[index + 1 :])
    return LaunchesOnSamples(tuple(ns + shift for ns in returned_ns[index + 1 :]), shift, placed_graphs, placed_entries)


def active_fractions(active: Sequence[float], elapsed: Sequence[float]) -> list[float]:
    """Per sample, active cycles over elapsed cycles, clamped to [0, 1] (0 where none elapsed)."""
    return [min(1.0, max(0.0, a / e)) if e > 0 else 0.0 for a, e in zip(active, elapsed, strict=True)]


def place_steps(
    start_ns: Sequence[int],
    end_ns: Sequence[int],
    fractions: Sequence[float],
    window: tuple[int, int],
    events: StepEvents,
    interval_ns: int = 0,
) -> PlacedSteps | str:
    """The region's steps on the samples' clock: the marker kernel is the first active stretch of samples in
    ``window`` (the device was idle when the region began); its end, less the events' time from the anchor to
    it, is the anchor's time. A string says why the steps could not be placed. ``interval_ns`` is the sampler's
    interval (0: a row's length, where each row is one sample)."""
    count = len(start_ns)
    first = next(
        (i for i in range(count) if end_ns[i] > window[0] and start_ns[i] < window[1] and fractions[i] >= IDLE_BELOW),
        None,
    )
    if first is None:
        return "the samples show no device work, not even the marker kernel that places the steps"
    last = first
    while last + 1 < count and fractions[last + 1] >= IDLE_BELOW:
        last += 1
    if last + 1 == count:
        return "the samples show no idle time after the marker kernel that places the steps"
    began = start_ns[first] + round((end_ns[first] - start_ns[first]) * (1.0 - fractions[first]))
    ended = end_ns[last] - round((end_ns[last] - start_ns[last]) * (1.0 - fractions[last]))
    interval = interval_ns or end_ns[first] - start_ns[first]
    if ended - began > events.marker_end_us * 1e3 + 2 * interval:
        return (
            f"the marker kernel that places the steps ran into other device work (active for "
            f"{(ended - began) / 1e3:.1f} us in the samples; its events say {events.marker_end_us:.1f} us from the "
            "anchor to its end)"
        )
    anchor = ended - round(events.marker_end_us * 1e3)
    steps = tuple(anchor + round(us * 1e3) for us in events.steps_us)
    return PlacedSteps(end_ns[last], steps, events.steps_from, began)


def analyze(
    start_ns: Sequence[int],
    end_ns: Sequence[int],
    fractions: Sequence[float],
    window: tuple[int, int] | None = None,
    steps: PlacedSteps | None = None,
    warmup_steps: int = 0,
) -> SampledTimeline:
    """The timeline of the samples inside ``window`` (ns, the samples' clock; None: all), each clipped to it, from
    the first active sample to the last. Every idle stretch the samples show of :data:`~.gaps.MIN_GAP_US` or more
    is a gap (its length known to a sample at each end), as a trace counts the gaps of that length between its
    kernels; a shorter one is busy time, in both.

    With ``steps`` (:func:`place_steps`), the marker is left out, and where the region has steps the judged part
    begins at the start of step ``warmup_steps``: the work before the first step (a prefill) and the warm-up
    steps are not judged, as a trace leaves out the ops launched in them. Each gap gets the step it ended in."""
    starts: tuple[int, ...] = ()
    source = SAMPLED_STEPS
    if steps is not None:
        starts, source = steps.steps_ns, steps.steps_from or SAMPLED_STEPS
        begin = steps.judged_from(warmup_steps)  # after the last sample when every step is a warm-up step
        window = (max(begin, window[0]), window[1]) if window is not None else (begin, 1 << 62)
    rows = []
    for start, end, fraction in zip(start_ns, end_ns, fractions, strict=True):
        if window is not None:
            start, end = max(start, window[0]), min(end, window[1])
        if end > start:  # an idle sample's stray cycles are not busy time: the gap it lies in is idle
            rows.append((start, end, fraction if fraction >= IDLE_BELOW else 0.0))
    active = [i for i, (_, _, fraction) in enumerate(rows) if fraction >= IDLE_BELOW]
    counted = min(warmup_steps, len(starts))
    if not active:
        return SampledTimeline(0.0, 0.0, (), steps=len(starts), warmup_steps=counted, steps_from=source)
    rows = _trimmed(rows[active[0] : active[-1] + 1])
    # From the first busy moment on, as integers: the clock's ns since 1970 (about 1.8e18) are past what a float
    # holds exactly (2**53), where the placing of idle parts below would round every boundary to 256 ns.
    origin = rows[0][0]
    rows = [(start - origin, end - origin, fraction) for start, end, fraction in rows]
    found = [(start, end) for start, end in _widened(_gaps(rows), rows[-1][1]) if end - start >= MIN_GAP_US * 1e3]
    stretches = runs_between(found, 0.0, rows[-1][1])
    gaps = tuple((start / 1e3, (end - start) / 1e3) for start, end in found)
    runs = tuple(BusyRun(a / 1e3, b / 1e3, (b - a) / 1e3) for a, b in stretches)
    relative = [(start - origin) / 1e3 for start in starts]
    gap_steps = tuple(bisect.bisect_right(relative, end / 1e3) - 1 for _, end in found) if starts else ()
    spans = _step_spans(relative, warmup_steps, runs)
    return SampledTimeline(
        sum(run.busy for run in runs),
        rows[-1][1] / 1e3,
        gaps,
        origin,
        runs,
        steps=len(starts),
        warmup_steps=counted,
        steps_from=source,
        gap_steps=gap_steps,
        step_spans=spans,
    )


def _trimmed(rows: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
    """The samples from the first active one to the last, with the idle part of each end sample left outside (the
    timeline runs from the device's first busy moment to its last, as a trace's from its first op's start to its
    last op's end): all of it, or half where the sample's other neighbour is idle too (a short kernel inside it)."""

    def share(index: int, neighbour: int) -> float:
        idle_beside = 0 <= neighbour < len(rows) and rows[neighbour][2] < IDLE_BELOW
        return 0.5 if idle_beside or len(rows) == 1 else 1.0

    (start, end, fraction), last = rows[0], len(rows) - 1
    lead = round((end - start) * (1.0 - fraction) * share(0, 1))
    start_last, end_last, fraction_last = rows[last]
    trail = round((end_last - start_last) * (1.0 - fraction_last) * share(last, last - 1))
    trimmed = list(rows)
    trimmed[0] = (start + lead, end, fraction * (end - start) / (end - start - lead))
    start_last, end_last, fraction_last = trimmed[last]
    busy = fraction_last * (end_last - start_last)
    trimmed[last] = (start_last, end_last - trail, min(1.0, busy / (end_last - trail - start_last)))
    return trimmed


def _step_spans(starts: Sequence[float], warmup_steps: int, runs: Sequence[BusyRun]) -> tuple[StepSpan, ...]:
    """Each judged step's device work (µs, the runs' clock): from its first busy stretch's start (or the step's
    start, inside one) to its last one's end (or the next step's start)."""
    spans = []
    run_ends = [run.end for run in runs]
    for step in range(warmup_steps, len(starts)):
        begin, end = starts[step], starts[step + 1] if step + 1 < len(starts) else float("inf")
        index = bisect.bisect_right(run_ends, begin)
        inside = []
        while index < len(runs) and runs[index].start < end:
            inside.append(runs[index])
            index += 1
        if inside:
            spans.append(StepSpan(step, max(begin, inside[0].start), min(end, inside[-1].end)))
    return tuple(spans)


def _gaps(rows: Sequence[tuple[int, int, float]]) -> list[tuple[float, float]]:
    """The idle gaps (start, length; ns) of samples that begin and end active."""
    placed = _placements(rows)
    blocks: list[tuple[float, float]] = []  # idle (start, end), in order
    for (start, end, fraction), place in zip(rows, placed, strict=True):
        missing = (end - start) * (1.0 - fraction)
        if place == _IDLE:
            blocks.append((start, end))
        elif place == _SPLIT:
            blocks += [(start, start + missing / 2), (end - missing / 2, end)]
        elif place == _START:
            blocks.append((start, start + missing))
        elif place == _END:
            blocks.append((end - missing, end))
        elif missing > 0:
            middle = (start + end) / 2
            blocks.append((middle - missing / 2, middle + missing / 2))
    gaps: list[tuple[float, float]] = []
    for begin, finish in blocks:
        if finish <= begin:
            continue
        if gaps and begin <= gaps[-1][0] + gaps[-1][1]:
            gaps[-1] = (gaps[-1][0], finish - gaps[-1][0])
        else:
            gaps.append((begin, finish - begin))
    return gaps


def _widened(found: Sequence[tuple[float, float]], last: int) -> list[tuple[float, float]]:
    """The gaps (start, length; ns) as (start, end), each ending :data:`KERNEL_LEAD_NS` later (before ``last``, the
    timeline's end), those that then touch merged."""
    widened: list[tuple[float, float]] = []
    for start, length in found:
        end = min(start + length + KERNEL_LEAD_NS, last)
        if widened and start <= widened[-1][1]:
            widened[-1] = (widened[-1][0], max(end, widened[-1][1]))
        else:
            widened.append((start, end))
    return widened


_IDLE, _SPLIT, _START, _END, _MIDDLE = "idle", "split", "start", "end", "middle"


def _placements(rows: Sequence[tuple[int, int, float]]) -> list[str]:
    """Where each sample's idle part lies: all of an idle sample; next to an idle neighbour (split when both are);
    else, for two partly active samples side by side, at the boundary between them (one gap that straddles it:
    a gap between kernels longer than a sample reads so, and splitting it into two mid-sample gaps doubled the
    eager loops' gap counts against the records of the same runs); else in the middle of the sample."""
    idle = [fraction < IDLE_BELOW for _, _, fraction in rows]
    placed = []
    for i in range(len(rows)):
        before, after = i > 0 and idle[i - 1], i + 1 < len(rows) and idle[i + 1]
        place = _IDLE if idle[i] else _SPLIT if before and after else _START if before else _END if after else _MIDDLE
        placed.append(place)
    for i in range(len(rows) - 1):
        partly = rows[i][2] < 1.0 and rows[i + 1][2] < 1.0
        if placed[i] == placed[i + 1] == _MIDDLE and partly:
            placed[i], placed[i + 1] = _END, _START
    return placed
