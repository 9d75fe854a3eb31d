"""One region's exact counters with the largest contributors to each, and how a test's regions and runs add them
up (pure data, no torch). What each counter counts is its signal's (:data:`..signals.COUNTERS`), which hands the rules
here what they need (which counters take the fewest of a ``measure()``'s runs, which count from its counted runs).

Counts are the same run to run and machine to machine for the same code and software, so they are compared
exactly, like syncs. Each signal's probe counts its own (:mod:`..signals`); of a ``measure()``'s runs the largest
count, or the fewest.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: How many of the largest contributors a region keeps per counter (operators, kernels, reasons): enough for
#: baselines to name what moved; failure texts show fewer (:data:`SHOWN`).
TOP = 64
SHOWN = 8


Items = tuple[tuple[str, int], ...]


def top_items(counts: Mapping[str, int], limit: int = TOP) -> Items:
    """The ``limit`` largest nonzero entries, largest first (ties by name, so the order is stable)."""
    ranked = sorted(((name, n) for name, n in counts.items() if n > 0), key=lambda item: (-item[1], item[0]))
    return tuple(ranked[:limit])


@dataclass(frozen=True)
class RegionCounts:
    """One measured region's counters (only those its probes measured) and the largest contributors to the
    itemized ones."""

    values: Mapping[str, int] = field(default_factory=dict)
    top: Mapping[str, Items] = field(default_factory=dict)
    unmeasured: Mapping[str, str] = field(default_factory=dict)
    """Counters that could not be counted in this region, and why (e.g. compile records dynamo dropped)."""

    def merged(self, other: RegionCounts) -> RegionCounts:
        """These counts with another probe's (disjoint counters) of the same region."""
        return RegionCounts(
            {**self.values, **other.values}, {**self.top, **other.top}, {**self.unmeasured, **other.unmeasured}
        )


def total(
    parts: Sequence[Sequence[RegionCounts]], name: str, *, fewest: bool = False, counted_runs: bool = False
) -> int | None:
    """A counter over a test's regions: the parts add up, and of the runs of one part (``measure(repeat=...)``)
    the largest counts (the fewest where ``fewest``). None when no region measured it, or one could not (of a
    ``fewest`` or ``counted_runs`` counter: a part none of whose runs could)."""
    values = []
    for runs in parts:
        found = [run.values[name] for run in runs if name in run.values]
        if any(name in run.unmeasured for run in runs) and not ((counted_runs or fewest) and found):
            return None
        values.append(found)
    if not any(values):
        return None
    return sum((min if fewest else max)(found) for found in values if found)


def top_over(parts: Sequence[Sequence[RegionCounts]], name: str, limit: int = TOP, *, fewest: bool = False) -> Items:
    """The largest contributors to a counter over a test's regions: per part, those of the run whose count
    :func:`total` takes, added up."""
    pick = min if fewest else max
    summed: Counter[str] = Counter()
    for runs in parts:
        measured = [run for run in runs if name in run.values]
        if measured:
            summed.update(dict(pick(measured, key=lambda run: run.values[name]).top.get(name, ())))
    return top_items(summed, limit)


def difference(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    """Counts that grew between two readings of ever-growing counters, by how much."""
    return {name: n - before.get(name, 0) for name, n in after.items() if n > before.get(name, 0)}
