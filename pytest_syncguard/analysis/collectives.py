"""Collective waits across the ranks of a launch (pure functions, no torch).

A rank that reaches a collective first launches its kernel (NCCL's ``ncclDevKernel_AllReduce_...``), which spins
until every rank has arrived: to that rank's GPU timeline the wait is busy time in the collective, and a slow rank
(a straggler) looks like a slow all-reduce on every other rank. Matched across ranks collective by collective (the
k-th collective kernel of a traced region on each rank is the same collective), each rank's time in a collective
splits into its **wait** for the last rank to arrive and the **transfer** after it, as AMD TraceLens does from the
kernels' start skew:

- from the kernels' starts, where the ranks' traces share a clock (one host: the profiler's timestamps are the
  host's): wait = last rank's start - own start, transfer = own end - last rank's start;
- from their durations, where they do not (a rank's kernel that ended before the last rank's began): the last
  rank to arrive waits for no one, so its kernel is the transfer alone: transfer = the shortest duration, wait =
  own duration - transfer.

The straggler is the rank the others waited for, named where they waited at least :data:`MIN_LATE_US` per token and
:data:`NOISE_SHARE` of the transfers' time,
with the collective they waited longest at and its call site (the probe's k-th call, :mod:`..probes.collectives`,
where the calls and kernels pair one to one).

Those kernels come from a counting run, which the trace and the collective probe slow down (each collective by some
100 µs of host time): its waits describe another program. The timed runs, which run as the loop runs without
syncguard, give each collective's time on the device from torch's own NCCL process group (its flight recorder, with
timing on: :mod:`..probes.collectives`), matched across ranks by the collective's sequence number in its group. These
are what :func:`match` splits (by their durations, :data:`FLIGHT_RECORDER`) wherever every rank has them; the
counting run's kernels stand in only where none has.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .trace_file import Trace

#: The most collective kernels a region keeps (a longer loop keeps its first).
MAX_KERNELS = 4096
#: The least wait per token, on average over the other ranks, that names a straggler (below it the ranks arrive
#: together, within the kernels' own jitter).
MIN_LATE_US = 10.0
#: Clock slack (us): a kernel may end this much before another rank's start and the clocks still be shared.
SLACK_US = 2.0
STARTS, DURATIONS = "kernel starts", "kernel durations"
FLIGHT_RECORDER = "collectives' device times in the timed runs (torch's flight recorder)"
#: A straggler is named where the other ranks waited for it at least this share of the collectives' transfer time (per
#: token, mean over ranks): below it is the arrival skew of ranks doing the same work (two H200s, the example's loop
#: with nothing planted: waits of 16% and 33% of the transfers; a planted 200 us at one layer of four: 60%).
NOISE_SHARE = 0.5


def is_collective_kernel(name: str) -> bool:
    """Whether a kernel is a collective's: NCCL's (``ncclDevKernel_*``, ``ncclKernel_*``) and RCCL's."""
    return name.lower().startswith(("nccl", "rccl"))


@dataclass(frozen=True)
class TimedCollective:
    """One collective of a timed region as torch's NCCL process group recorded it (its flight recorder, timing on)."""

    group: str
    """Its process group (the group's name, the same on every rank)."""
    seq: int
    """Its sequence number in the group: the same collective on every rank has the same."""
    enqueued_us: float
    """When the host enqueued it, us on the host's wall clock."""
    device_us: float
    """Its time on the device: from its start event (its inputs ready on its stream) to its end event."""


@dataclass(frozen=True)
class TimedRegion:
    """The collectives of one timed region (a ``generation()`` region, or a timed run of ``measure()``)."""

    tokens: int | None
    collectives: tuple[TimedCollective, ...]
    untimed: int = 0
    """Collectives of the region the recorder gave no device time for (its process group was made without timing)."""
    lost: bool = False
    """The recorder's ring (``TORCH_NCCL_TRACE_BUFFER_SIZE``) no longer held the region's first collectives."""
    host: str = ""
    """The host it ran on: ranks of one host share its wall clock."""


@dataclass(frozen=True)
class Collectives:
    """One rank's collectives: a traced region's calls and kernels' times, in launch order, and the timed regions'
    device times (torch's flight recorder)."""

    tokens: int | None
    calls: tuple[str, ...]
    """Each collective the region called, ``op at file:line in function``, in call order (the probe's)."""
    kernels: tuple[tuple[float, float], ...]
    """(start, end) of each collective kernel in launch order, us on the trace's clock."""
    more: int = 0
    """Kernels past :data:`MAX_KERNELS`, not kept."""
    timed: tuple[TimedRegion, ...] = ()
    """The timed regions' collectives (at most :data:`MAX_KERNELS` in all, the first regions')."""

    def site(self, index: int) -> str | None:
        """The call of the ``index``-th kernel, where calls and kernels pair one to one."""
        return self.calls[index] if len(self.calls) == len(self.kernels) + self.more else None

    def step_site(self, position: int, per_step: int) -> str | None:
        """The call of the ``position``-th collective of a decode step, where the calls are whole steps of
        ``per_step`` (0: the region's ``position``-th)."""
        if per_step and self.calls and len(self.calls) % per_step == 0 and position < per_step:
            return self.calls[position]
        return self.calls[position] if not per_step and position < len(self.calls) else None


def kernels_in(trace: Trace, window: tuple[float, float]) -> tuple[tuple[tuple[float, float], ...], int]:
    """The collective kernels that started on the device inside ``window`` (us), in order, and how many past
    :data:`MAX_KERNELS` were left out."""
    start, end = window
    found = [(op.start, op.end) for op in trace.gpu_ops if start <= op.start <= end and is_collective_kernel(op.name)]
    found.sort()
    return tuple(found[:MAX_KERNELS]), max(0, len(found) - MAX_KERNELS)


@dataclass(frozen=True)
class CollectiveWaits:
    """A test's collectives matched across its ranks: per rank, wait and transfer per token; the straggler."""

    matched: int
    """Collectives matched on every rank."""
    clock: str
    """How waits were split: :data:`STARTS` or :data:`DURATIONS`."""
    wait_us: tuple[float, ...]
    """Per rank (of :attr:`ranks`), per token: time its collectives' kernels waited for the last rank to arrive."""
    transfer_us: tuple[float, ...]
    """Per rank, per token: time its collectives' kernels ran after every rank had arrived."""
    ranks: tuple[int, ...] = ()
    """The ranks matched, in order (those that have a traced run: a rank that died has none)."""
    straggler: int | None = None
    """The rank the others waited for (None: they arrived together, within :data:`MIN_LATE_US` per token)."""
    late_us: float = 0.0
    """Per token, how long the other ranks waited, on average over them."""
    per_step: int = 0
    """Collectives per decode step (0: they do not divide evenly into the tokens, and each is its own)."""
    worst: int = 0
    """The collective of a step (0-based; of the region where ``per_step`` is 0) with the longest median wait."""
    worst_wait_us: float = 0.0
    """That wait: the longest of any rank's, median over the steps."""
    worst_last: int = 0
    """The rank that arrived last at it most often."""
    worst_times: int = 0
    """In how many steps it arrived last there."""
    worst_site: str | None = None
    """Its call site, where known."""
    host_late_us: float | None = None
    """Per token, how much later the straggler's host enqueued its collectives than the other ranks' hosts (median
    over steps, mean over them): data, not a cause (a GPU-bound loop's hosts run ahead whenever they enqueue). None
    where the ranks' wall clocks are not one host's or there is no straggler."""
    said: tuple[str, ...] = ()
    """What limits the numbers (collectives the recorder did not time, or no longer held)."""


def _shared_clock(kernels: Sequence[Sequence[tuple[float, float]]]) -> bool:
    """Whether every rank's kernel of each collective ends after the last rank's starts (a shared clock)."""
    for row in zip(*kernels, strict=True):
        last = max(start for start, _ in row)
        if any(end < last - SLACK_US for _, end in row):
            return False
    return True


def _split(row: Sequence[tuple[float, float]], clock: str) -> tuple[list[float], list[float], int]:
    """One collective on every rank: each rank's wait and transfer (us), and which rank arrived last."""
    if clock == STARTS:
        last = max(range(len(row)), key=lambda i: row[i][0])
        arrival = row[last][0]
        return [arrival - start for start, _ in row], [end - arrival for _, end in row], last
    durations = [end - start for start, end in row]
    last = min(range(len(row)), key=lambda i: durations[i])
    return [d - durations[last] for d in durations], [durations[last]] * len(row), last


@dataclass(frozen=True)
class _Chunk:
    """A decode step's collectives matched across the ranks (``tokens`` 1), or a whole region's where they do not
    divide into its steps: each collective's split, and each rank's enqueue time of it where known."""

    tokens: int
    split: list[tuple[list[float], list[float], int]]
    """Per collective: each rank's wait and transfer (us), and which rank arrived last."""
    enqueued: list[list[float]] | None = None


def _chunked(
    split: list[tuple[list[float], list[float], int]],
    tokens: int,
    per_step: int,
    enqueued: list[list[float]] | None = None,
) -> list[_Chunk]:
    """A region's matched collectives (with their enqueue times, where known) as its steps of ``per_step`` each, or
    whole (0)."""
    if not per_step:
        return [_Chunk(tokens, split, enqueued)]
    return [
        _Chunk(1, split[i : i + per_step], enqueued[i : i + per_step] if enqueued is not None else None)
        for i in range(0, len(split), per_step)
    ]


def _per_step(collectives: int, tokens: int) -> int:
    """Collectives per decode step, where they divide evenly into the tokens; else 0."""
    return collectives // tokens if collectives % tokens == 0 and collectives >= tokens else 0


def _judged(
    order: Sequence[int],
    chunks: Sequence[_Chunk],
    per_step: int,
    clock: str,
    site: Callable[[int, int], str | None],
    said: tuple[str, ...] = (),
) -> CollectiveWaits:
    """Each rank's wait and transfer per token (medians over the chunks of a chunk's sums per token), the straggler,
    and the collective of a step the ranks waited longest at, with its call site (``site(rank, position)``)."""
    ranked = range(len(order))
    waits = [statistics.median(sum(c[0][r] for c in ch.split) / ch.tokens for ch in chunks) for r in ranked]
    transfers = [statistics.median(sum(c[1][r] for c in ch.split) / ch.tokens for ch in chunks) for r in ranked]
    straggler = min(ranked, key=lambda r: waits[r])
    others = [w for r, w in enumerate(waits) if r != straggler]
    late = statistics.fmean(others) if others else 0.0
    width = min(len(ch.split) for ch in chunks)
    at = [max(statistics.median(ch.split[p][0][r] for ch in chunks) for r in ranked) for p in range(width)]
    worst = max(range(width), key=lambda p: at[p])
    lasts = Counter(ch.split[worst][2] for ch in chunks)
    last, times = lasts.most_common(1)[0]
    host_late = None
    if others and all(ch.enqueued is not None for ch in chunks):
        host_late = statistics.fmean(
            statistics.median(sum(e[straggler] - e[r] for e in ch.enqueued or ()) / ch.tokens for ch in chunks)
            for r in ranked
            if r != straggler
        )
    noise = NOISE_SHARE * statistics.fmean(transfers)
    named_straggler = order[straggler] if late >= max(MIN_LATE_US, noise) else None
    return CollectiveWaits(
        matched=sum(len(ch.split) for ch in chunks),
        clock=clock,
        wait_us=tuple(waits),
        transfer_us=tuple(transfers),
        ranks=tuple(order),
        straggler=named_straggler,
        late_us=late,
        per_step=per_step,
        worst=worst,
        worst_wait_us=at[worst],
        worst_last=order[last],
        worst_times=times,
        worst_site=site(order[last], worst) or site(order[0], worst),
        host_late_us=host_late if named_straggler is not None else None,
        said=said,
    )


#: A timed region's tokens, and each of its collectives that every rank recorded, as the ranks' records of it.
_Rows = list[tuple[int, list[list[TimedCollective]]]]


def _timed_rows(ranks: Mapping[int, Collectives], order: Sequence[int]) -> _Rows:
    """Each timed region of the first rank, with its tokens and its collectives that every rank recorded (the same
    group and sequence number), each as the ranks' records of it."""
    index = [{(c.group, c.seq): c for region in ranks[r].timed for c in region.collectives} for r in order[1:]]
    regions = []
    for region in ranks[order[0]].timed:
        rows = [
            [c, *(found[(c.group, c.seq)] for found in index)]
            for c in region.collectives
            if all((c.group, c.seq) in found for found in index)
        ]
        if rows:
            regions.append((region.tokens or 1, rows))
    return regions


def _timed_said(ranks: Mapping[int, Collectives]) -> tuple[str, ...]:
    said = []
    untimed = {r: sum(t.untimed for t in c.timed) for r, c in ranks.items()}
    if any(untimed.values()):
        said.append(
            "collectives the flight recorder did not time (their process group was made without "
            "TORCH_NCCL_ENABLE_TIMING=1) are left out: "
            + ", ".join(f"rank {r}: {n}" for r, n in sorted(untimed.items()) if n)
        )
    if any(t.lost for c in ranks.values() for t in c.timed):
        said.append(
            "the flight recorder's ring no longer held the first collectives of a region: raise "
            "TORCH_NCCL_TRACE_BUFFER_SIZE to keep them"
        )
    return tuple(said)


def _match_timed(ranks: Mapping[int, Collectives], order: Sequence[int]) -> CollectiveWaits | str:
    """The timed regions' collectives matched by group and sequence number, split by their device times."""
    regions = _timed_rows(ranks, order)
    if not regions:
        return "no collective of the timed runs was recorded on every rank: not matched"
    hosts = {t.host for r in order for t in ranks[r].timed}
    shared_host = len(hosts) == 1 and "" not in hosts
    steps = {_per_step(len(rows), tokens) for tokens, rows in regions}
    per_step = steps.pop() if len(steps) == 1 else 0
    chunks: list[_Chunk] = []
    for tokens, rows in regions:
        split = [_split([(0.0, c.device_us) for c in row], DURATIONS) for row in rows]
        enqueued = [[c.enqueued_us for c in row] for row in rows] if shared_host else None
        chunks += _chunked(split, tokens, per_step, enqueued)

    def site(rank: int, position: int) -> str | None:
        return ranks[rank].step_site(position, per_step)

    return _judged(order, chunks, per_step, FLIGHT_RECORDER, site, _timed_said(ranks))


def match(ranks: Mapping[int, Collectives], clock: str | None = None) -> CollectiveWaits | str | None:
    """The waits of the ranks' collectives matched one by one: those of the timed runs by their device times
    (:data:`FLIGHT_RECORDER`) wherever every rank has them and no ``clock`` is asked, else the traced run's kernels
    split by ``clock`` (:data:`STARTS` where None and the traces share a clock, else :data:`DURATIONS`); a sentence
    saying why they cannot be matched (ranks that launched different numbers); None where no rank has a collective.

    Per token is per decode step: where the collectives divide evenly into the region's tokens, each rank's wait and
    transfer are the medians over steps of a step's sum (a single hiccup of one host, a profiler's flush, moves no
    median), else the totals over the tokens."""
    if not ranks or not any(c.kernels or c.timed for c in ranks.values()):
        return None
    order = sorted(ranks)
    if clock is None and all(any(t.collectives for t in c.timed) for c in ranks.values()):
        return _match_timed(ranks, order)
    if not any(c.kernels for c in ranks.values()):
        return "only some ranks' timed runs recorded collectives, and no traced run launched one: not matched"
    counts = {r: len(ranks[r].kernels) + ranks[r].more for r in order}
    if len(set(counts.values())) > 1:
        said = ", ".join(f"rank {r}: {n}" for r, n in counts.items())
        return f"the ranks launched different numbers of collective kernels ({said}): not matched"
    kernels = [ranks[r].kernels for r in order]
    tokens = next((c.tokens for c in ranks.values() if c.tokens), None) or 1
    clock = clock or (STARTS if _shared_clock(kernels) else DURATIONS)
    per_step = _per_step(len(kernels[0]), tokens)
    chunks = _chunked([_split(row, clock) for row in zip(*kernels, strict=True)], tokens, per_step)

    def site(rank: int, position: int) -> str | None:
        return ranks[rank].site(position)

    return _judged(order, chunks, per_step, clock, site)
