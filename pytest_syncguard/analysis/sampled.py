"""Busy time and idle gaps of the device from PM samples (pure functions, no torch).

A sample covers ``[start, end)`` of device time and says what fraction of it the device's compute work was
active. Busy time is the sum of the active parts. Where inside a partly active sample its idle part lies is not
known: it is placed next to an idle neighbour (at the sample's end when the next sample is idle, at its start when
the previous one is, split between both when both are), else in the middle as a gap of its own. Idle parts that
touch merge into one gap, so a gap is known to within one sample interval at each end. A sample below
:data:`IDLE_BELOW` is idle: its stray cycles are no busy time, so busy time is the span less the gaps. A region's
timeline runs from its first active sample to its last, as a trace's runs from its first device op to its last.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from .gaps import HOST_SYNC, AttributedGap, BusyRun, SyncMark, Timeline, runs_between

#: A sample less active than this is idle (the counters of an idle engine read a few stray cycles).
IDLE_BELOW = 0.02
#: Where a sampled timeline's steps come from: it has none, and judges each region whole.
SAMPLED_STEPS = "none: a sampled timeline judges each region whole"
#: The cause of a sampled gap in which no counted sync returned: the sampler sees when the device was idle, not
#: why, and without launch records a launch-bound gap and another look alike.
IDLE = "idle"
IDLE_DETAIL = (
    "sampled: the sampler sees when the device was idle, not why (no counted sync returned in it: launch-bound or "
    "other; --syncguard-gap-ops reruns a failing test under the trace capture to attribute its gaps)"
)
#: How far the host's wall clock and the samples' may stand apart (µs): tens of µs on the lent H100s (a 1 ms sleep
#: kernel began 46-73 µs after the host's stamp before its launch and ended 5-35 µs before the stamp after its sync).
CLOCK_SLACK_US = 100.0


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

    @property
    def gaps_us(self) -> tuple[float, ...]:
        return tuple(length for _, length in self.gaps)

    @property
    def busy_fraction(self) -> float:
        return self.busy_us / self.span_us if self.span_us > 0 else 1.0

    def timeline(
        self, top: int = 10, syncs: Sequence[tuple[int, str]] = (), window: tuple[int, int] | None = None
    ) -> Timeline:
        """As the plugin's :class:`~.gaps.Timeline`: no steps, the largest gaps with no cause but idleness. ``syncs``
        are the counted syncs of the test as (ns on the samples' clock, call site); those the host made inside the
        region's ``window`` (ns, the same clock; else its span) are kept. The host's stamps and the samples agree
        to tens of microseconds (README), so a sync at a region's edge may lie just outside its span."""
        largest = sorted(self.gaps, key=lambda g: -g[1])[:top]
        begin, end = window if window is not None else (self.origin_ns, self.origin_ns + round(self.span_us * 1e3))
        inside = tuple(SyncMark((ns - self.origin_ns) / 1e3, label) for ns, label in syncs if begin <= ns <= end)
        return Timeline(
            steps=0, warmup_steps=0, judged_steps=0, gpu_ops=0, span_us=self.span_us, busy_us=self.busy_us,
            gaps_us=self.gaps_us, top_gaps=tuple(attribute(start, length, inside) for start, length in largest),
            steps_from=SAMPLED_STEPS, origin_us=self.origin_ns / 1e3, runs=self.runs, syncs=inside,
        )  # fmt: skip


def attribute(start: float, length: float, syncs: Sequence[SyncMark]) -> AttributedGap:
    """The cause of a sampled gap (µs from the region's first active sample), as a trace gives it where it can: a
    ``host sync`` when a counted sync returned after the device went idle and before it resumed (the host waited,
    then had to refill the queue; the last such sync is named, with its call site); else ``idle``: the samples
    cannot tell a launch-bound gap from another. ``syncs`` are stamped when they returned, on the host's clock."""
    end = start + length
    returned = [mark for mark in syncs if start - CLOCK_SLACK_US <= mark.time <= end]
    if not returned:
        return AttributedGap(length, start, None, IDLE, IDLE_DETAIL, "")
    last = max(returned, key=lambda mark: mark.time)
    detail = (
        f"{last.label}; the device resumed {end - last.time:.0f} us after it returned (sampled: host and device "
        f"clocks agree to about {CLOCK_SLACK_US:.0f} us)"
    )
    return AttributedGap(length, start, None, HOST_SYNC, detail, "")


def active_fractions(active: Sequence[float], elapsed: Sequence[float]) -> list[float]:
    """Per sample, active cycles over elapsed cycles, clamped to [0, 1] (0 where none elapsed)."""
    return [min(1.0, max(0.0, a / e)) if e > 0 else 0.0 for a, e in zip(active, elapsed, strict=True)]


def analyze(
    start_ns: Sequence[int],
    end_ns: Sequence[int],
    fractions: Sequence[float],
    window: tuple[int, int] | None = None,
) -> SampledTimeline:
    """The timeline of the samples inside ``window`` (ns, the samples' clock; None: all), each clipped to it, from
    the first active sample to the last. Every idle stretch the samples show is a gap, however short: a gap shorter
    than a sample is counted as one (its length known to a sample), never left out before a percentile is taken,
    as a trace counts every gap between its ops. Idle time the samples cannot show at all (the engine stays active
    across sub-microsecond gaps between a graph's kernels) is no gap (tests/test_sampled_timeline.py)."""
    rows = []
    for start, end, fraction in zip(start_ns, end_ns, fractions, strict=True):
        if window is not None:
            start, end = max(start, window[0]), min(end, window[1])
        if end > start:  # an idle sample's stray cycles are not busy time: the gap it lies in is idle
            rows.append((start, end, fraction if fraction >= IDLE_BELOW else 0.0))
    active = [i for i, (_, _, fraction) in enumerate(rows) if fraction >= IDLE_BELOW]
    if not active:
        return SampledTimeline(0.0, 0.0, ())
    # From the first active sample on, as integers: the clock's ns since 1970 (about 1.8e18) are past what a float
    # holds exactly (2**53), where the placing of idle parts below would round every boundary to 256 ns.
    origin = rows[active[0]][0]
    rows = [(start - origin, end - origin, fraction) for start, end, fraction in rows[active[0] : active[-1] + 1]]
    found = [(start, start + length) for start, length in _gaps(rows)]
    stretches = runs_between(found, 0.0, rows[-1][1])
    busy = _busy_per_run(rows, stretches)
    gaps = tuple((start / 1e3, (end - start) / 1e3) for start, end in found)
    runs = tuple(BusyRun(a / 1e3, b / 1e3, part / 1e3) for (a, b), part in zip(stretches, busy, strict=True))
    return SampledTimeline(sum(busy) / 1e3, rows[-1][1] / 1e3, gaps, origin, runs)


def _busy_per_run(rows: Sequence[tuple[int, int, float]], runs: Sequence[tuple[float, float]]) -> list[float]:
    """Each sample's busy time (ns) shared among the runs it overlaps, in proportion to the overlap (its idle part
    lies in the gaps between them). Every sample counts once."""
    busy = [0.0] * len(runs)
    ends = [end for _, end in runs]
    for start, end, fraction in rows:
        first = min(bisect.bisect_right(ends, start), len(runs) - 1)
        overlaps = []
        index = first
        while index < len(runs) and runs[index][0] < end:
            overlap = min(end, runs[index][1]) - max(start, runs[index][0])
            if overlap > 0:
                overlaps.append((index, overlap))
            index += 1
        part = (end - start) * fraction
        if not overlaps or part == 0:  # an idle sample, inside a gap
            continue
        total = sum(overlap for _, overlap in overlaps)
        for index, overlap in overlaps:
            busy[index] += part * overlap / total
    return busy


def _gaps(rows: Sequence[tuple[int, int, float]]) -> list[tuple[float, float]]:
    """The idle gaps (start, length; ns) of samples that begin and end active."""
    idle = [fraction < IDLE_BELOW for _, _, fraction in rows]
    blocks: list[tuple[float, float]] = []  # idle (start, end), in order
    for i, (start, end, fraction) in enumerate(rows):
        if idle[i]:
            blocks.append((start, end))
            continue
        missing = (end - start) * (1.0 - fraction)
        before, after = i > 0 and idle[i - 1], i + 1 < len(rows) and idle[i + 1]
        if before and after:
            blocks += [(start, start + missing / 2), (end - missing / 2, end)]
        elif before:
            blocks.append((start, start + missing))
        elif after:
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
