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
    """Per rank (rank order), per token: time its collectives' kernels waited for the last rank to arrive."""
    transfer_us: tuple[float, ...]
    """Per rank, per token: time its collectives' kernels ran after every rank had arrived."""
    straggler: int | None = None
    """The rank the others waited for (None: they arrived together, within :data:`MIN_LATE_US` per token)."""
    late_us: float = 0.0
    """Per token, how long the other ranks waited, on average over them."""
    worst: int = 0
    """The collective (index in launch order) with the longest wait."""
    worst_wait_us: float = 0.0
    worst_last: int = 0
    """The rank that arrived last at it."""
    worst_site: str | None = None
    """Its call site, where known."""


def _shared_clock(kernels: Sequence[Sequence[tuple[float, float]]]) -> bool:
    """Whether every rank's kernel of each collective ends after the last rank's starts (a shared clock)."""
    for row in zip(*kernels, strict=True):
        last = max(start for start, _ in row)
        if any(end < last - SLACK_US for _, end in row):
            return False
    return True


def match(ranks: Mapping[int, Collectives]) -> CollectiveWaits | str | None:
    """The waits of the ranks' collectives matched one by one; a sentence saying why they cannot be matched (ranks
    that launched different numbers, or none known); None where no rank launched a collective kernel."""
    if not ranks or not any(c.kernels for c in ranks.values()):
        return None
    order = sorted(ranks)
    counts = {r: len(ranks[r].kernels) + ranks[r].more for r in order}
    if len(set(counts.values())) > 1:
        said = ", ".join(f"rank {r}: {n}" for r, n in counts.items())
        return f"the ranks launched different numbers of collective kernels ({said}): not matched"
    kernels = [ranks[r].kernels for r in order]
    tokens = next((c.tokens for c in ranks.values() if c.tokens), None) or 1
    clock = STARTS if _shared_clock(kernels) else DURATIONS
    waits = [0.0] * len(order)
    transfers = [0.0] * len(order)
    late_at = [0.0] * len(order)
    worst = (0.0, 0, 0)  # (wait, collective, last rank)
    for index, row in enumerate(zip(*kernels, strict=True)):
        if clock == STARTS:
            last = max(range(len(row)), key=lambda i: row[i][0])
            arrival = row[last][0]
            wait = [arrival - start for start, _ in row]
            transfer = [end - arrival for _, end in row]
        else:
            durations = [end - start for start, end in row]
            last = min(range(len(row)), key=lambda i: durations[i])
            wait = [d - durations[last] for d in durations]
            transfer = [durations[last]] * len(row)
        for i in range(len(row)):
            waits[i] += wait[i]
            transfers[i] += transfer[i]
        late_at[last] += sum(wait) / max(1, len(row) - 1)
        if max(wait) > worst[0]:
            worst = (max(wait), index, last)
    straggler = max(range(len(order)), key=lambda i: late_at[i])
    late = late_at[straggler] / tokens
    site = ranks[order[worst[2]]].site(worst[1]) or ranks[order[0]].site(worst[1])
    return CollectiveWaits(
        matched=len(kernels[0]), clock=clock, wait_us=tuple(w / tokens for w in waits),
        transfer_us=tuple(t / tokens for t in transfers),
        straggler=order[straggler] if late >= MIN_LATE_US else None, late_us=late, worst=worst[1],
        worst_wait_us=worst[0], worst_last=order[worst[2]], worst_site=site,
    )  # fmt: skip
