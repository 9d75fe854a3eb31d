"""The collectives signal: the collectives a region called (all-reduce, all-gather, ... of any process group, NCCL
or gloo), each with its call site, counted by the collective probe (:mod:`..probes.collectives`); and on CUDA, from
a traced run, each collective's kernel, which the report matches across the ranks of a launch to split each rank's
time in collectives into its wait for the last rank and the transfer, and to name the straggler
(:mod:`..analysis.collectives`). The waits come from the regions that run as the loop runs without syncguard (a
``generation()`` region, a ``measure()``'s timed runs), each collective's device time as torch's flight recorder
gives it (:mod:`..probes.collectives`); the counting run's traced kernels stand in only where no rank has those (a
torch or process group without the recorder's timing)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..analysis.collectives import MAX_KERNELS, Collectives, CollectiveWaits, TimedRegion, kernels_in, match
from .base import CounterSpec, Kept, Measured, Metric, Part, Runs, Signal, Traced, united

#: Joined from a launch's ranks (:func:`..document.launch.join`): the longest any rank waited for the last rank to
#: arrive at its collectives, per token (median over steps).
WAIT_METRIC = "collective_wait_us_per_token"
#: The longest wait or transfer per token a joined record may say (an hour): past it, a damaged or hostile file.
MAX_US = 3.6e9


#: Its parts: per region number, its tokens and each call (``op at site``) in order; per traced region, its collective
#: kernels' (start, end) and how many were left out.
CALLS, KERNELS = "collective_calls", "collective_kernels"
#: Its part of the timed regions: per region number, its collectives' device times (:class:`TimedRegion`).
TIMED = "collective_times"


def _joined_only(m: Measured) -> list[float]:
    return []  # no process sees the other ranks: the report joins it


def _kept(m: Measured) -> Collectives | None:
    """The first traced region's collectives with its calls, and the timed regions' device times (at most
    :data:`MAX_KERNELS` collectives in all): what the report matches across ranks. None where no region has any."""
    calls: tuple[str, ...] = ()
    tokens = None
    kernels: tuple[tuple[float, float], ...] = ()
    more = 0
    for number, (found, left_out) in sorted(m.part(KERNELS).items()):
        if found:
            tokens, calls = m.part(CALLS).get(number, (None, ()))
            kernels, more = found, left_out
            break
    timed: list[TimedRegion] = []
    kept = 0
    for _, region in sorted(m.part(TIMED).items()):
        if kept + len(region.collectives) > MAX_KERNELS:
            break
        timed.append(region)
        kept += len(region.collectives)
    if not kernels and not timed:
        return None
    if not calls:  # no traced region: the first region's calls that has some name the collectives' sites
        tokens, calls = next((found for _, found in sorted(m.part(CALLS).items())), (None, ()))
    return Collectives(tokens, calls, kernels, more, tuple(timed))


def _problem(record: Collectives) -> str | None:
    if len(record.kernels) > MAX_KERNELS:
        return f"more than {MAX_KERNELS} kernels (a region keeps at most that many)"
    if sum(len(t.collectives) for t in record.timed) > MAX_KERNELS:
        return f"more than {MAX_KERNELS} timed collectives (a test keeps at most that many)"
    if record.tokens is not None and record.tokens < 1:
        return f"tokens {record.tokens}: not a number of tokens (1 or more)"
    if record.more < 0:
        return f"more {record.more}: not a number of kernels"
    wrong = next(((s, e) for s, e in record.kernels if not (math.isfinite(s) and math.isfinite(e) and e >= s)), None)
    if wrong is not None:
        return f"kernel {wrong}: no kernel's (start, end)"
    for region in record.timed:
        if (region.tokens is not None and region.tokens < 1) or region.untimed < 0:
            return f"a timed region with tokens {region.tokens} and {region.untimed} untimed collectives"
        times = ((c.device_us, c.enqueued_us) for c in region.collectives)
        if any(not (math.isfinite(d) and 0 <= d <= MAX_US and math.isfinite(e)) for d, e in times):
            return "a timed collective whose device time is negative, not finite or over an hour"
    return None


def _joined_problem(joined: CollectiveWaits | str) -> str | None:
    """Values no matching of ranks can give: negative or not finite waits and transfers, counts below 0, ranks
    whose number is not their waits'."""
    if isinstance(joined, str):
        return None
    times = (*joined.wait_us, *joined.transfer_us, joined.late_us, joined.worst_wait_us)
    if any(not math.isfinite(t) or t < 0 or t > MAX_US for t in times):
        return f"a wait or transfer that is negative, not finite or over {MAX_US:.0e} us"
    counts = (joined.matched, joined.per_step, joined.worst, joined.worst_last, joined.worst_times)
    if any(c < 0 for c in counts):
        return "a negative count"
    if len(joined.wait_us) != len(joined.transfer_us) or (joined.ranks and len(joined.ranks) != len(joined.wait_us)):
        return "its ranks, waits and transfers are not one per rank"
    return None


def _join(ranks: Mapping[int, Collectives]) -> tuple[CollectiveWaits | str | None, dict[str, float]]:
    """The ranks' collectives matched, and the longest wait of any rank (:data:`WAIT_METRIC`)."""
    waits = match(ranks)
    return waits, {WAIT_METRIC: max(waits.wait_us)} if isinstance(waits, CollectiveWaits) else {}


SIGNAL = Signal(
    "collectives",
    counters=(
        CounterSpec(
            "collectives",
            "collectives called (torch.distributed's and the functional collectives, any process group)",
            quiet_when_zero=True,
            per_token=True,
            items="collectives (operation and call site)",
            budget="max_collectives_per_token",
        ),
    ),
    metrics=(
        Metric(
            WAIT_METRIC,
            "us",
            counted=False,
            higher_is_better=False,
            floor=20.0,
            runs=_joined_only,
            host=True,
            description="the longest wait of any rank of a launch for the last rank to arrive at its "
            "collectives, per token (median over steps; joined by the report from the ranks' traced runs)",
        ),
    ),
    # Per region number: its tokens and calls in order (every run), its collective kernels' (start, end) with how
    # many were left out (traced runs), and its collectives' device times (the timed runs, which run as the loop
    # does unmeasured).
    parts=(
        Part(CALLS, united, Runs.EVERY, empty=dict),
        Part(KERNELS, united, Runs.EVERY, empty=dict),
        Part(TIMED, united, Runs.TIMED, empty=dict),
    ),
    probes="collectives",
    traced=(Traced(KERNELS, kernels_in),),
    kept=Kept(Collectives, _kept, _problem, CollectiveWaits | str, _join, _joined_problem),
)
