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

The straggler is the rank the others waited for, named where they waited at least :data:`MIN_LATE_US` per token,
with the collective they waited longest at and its call site (the probe's k-th call, :mod:`..probes.collectives`,
where the calls and kernels pair one to one).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
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


def is_collective_kernel(name: str) -> bool:
    """Whether a kernel is a collective's: NCCL's (``ncclDevKernel_*``, ``ncclKernel_*``) and RCCL's."""
    return name.lower().startswith(("nccl", "rccl"))


@dataclass(frozen=True)
class Collectives:
    """One rank's collectives in a traced region, in launch order: their calls and their kernels' times."""

    tokens: int | None
    calls: tuple[str, ...]
    """Each collective the region called, ``op at file:line in function``, in call order (the probe's)."""
    kernels: tuple[tuple[float, float], ...]
    """(start, end) of each collective kernel in launch order, us on the trace's clock."""
    more: int = 0
    """Kernels past :data:`MAX_KERNELS`, not kept."""

    def site(self, index: int) -> str | None:
        """The call of the ``index``-th kernel, where calls and kernels pair one to one."""
        return self.calls[index] if len(self.calls) == len(self.kernels) + self.more else None


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


def match(ranks: Mapping[int, Collectives], clock: str | None = None) -> CollectiveWaits | str | None:
    """The waits of the ranks' collectives matched one by one, split by ``clock`` (:data:`STARTS` where None and the
    traces share a clock, else :data:`DURATIONS`); a sentence saying why they cannot be matched (ranks that launched
    different numbers); None where no rank launched a collective kernel.

    Per token is per decode step: where the collectives divide evenly into the region's tokens, each rank's wait and
    transfer are the medians over steps of a step's sum (a single hiccup of one host, a profiler's flush, moves no
    median), else the totals over the tokens."""
    if not ranks or not any(c.kernels for c in ranks.values()):
        return None
    order = sorted(ranks)
    counts = {r: len(ranks[r].kernels) + ranks[r].more for r in order}
    if len(set(counts.values())) > 1:
        said = ", ".join(f"rank {r}: {n}" for r, n in counts.items())
        return f"the ranks launched different numbers of collective kernels ({said}): not matched"
    kernels = [ranks[r].kernels for r in order]
    matched = len(kernels[0])
    tokens = next((c.tokens for c in ranks.values() if c.tokens), None) or 1
    clock = clock or (STARTS if _shared_clock(kernels) else DURATIONS)
    per_step = matched // tokens if matched % tokens == 0 and matched >= tokens else 0
    width = per_step or matched
    # [step][position in the step] -> (each rank's wait, each rank's transfer, the last rank)
    split = [_split(row, clock) for row in zip(*kernels, strict=True)]
    steps = [split[i : i + width] for i in range(0, matched, width)]
    ranked = range(len(order))
    waits = [statistics.median(sum(c[0][r] for c in step) for step in steps) for r in ranked]
    transfers = [statistics.median(sum(c[1][r] for c in step) for step in steps) for r in ranked]
    if not per_step:  # the region's totals, per token
        waits, transfers = [w / tokens for w in waits], [t / tokens for t in transfers]
    straggler = min(ranked, key=lambda r: waits[r])
    others = [w for r, w in enumerate(waits) if r != straggler]
    late = statistics.fmean(others) if others else 0.0
    at = [max(statistics.median(step[p][0][r] for step in steps) for r in ranked) for p in range(width)]
    worst = max(range(width), key=lambda p: at[p])
    lasts = Counter(step[worst][2] for step in steps)
    last, times = lasts.most_common(1)[0]
    site = ranks[order[last]].site(worst) or ranks[order[0]].site(worst)
    return CollectiveWaits(
        matched=matched,
        clock=clock,
        wait_us=tuple(waits),
        transfer_us=tuple(transfers),
        ranks=tuple(order),
        straggler=order[straggler] if late >= MIN_LATE_US else None,
        late_us=late,
        per_step=per_step,
        worst=worst,
        worst_wait_us=at[worst],
        worst_last=order[last],
        worst_times=times,
        worst_site=site,
    )
