"""Exact counters of host overhead in a region: what each one counts and where it comes from (:data:`COUNTERS`),
and one region's counts with the largest contributors to each (pure data, no torch).

Counts are the same run to run and machine to machine for the same code and software, so they are compared
exactly, like syncs. Where a counter comes from decides where it is measured:

- ``ops``: the native operator counter (a RecordFunction callback, the events torch.profiler calls ``cpu_op``);
  CPU and CUDA, no timeline capture;
- ``frames_compiled``, ``recompiles``, ``graph_breaks``: torch.compile's own records (dynamo's counters and
  compilation metrics); CPU and CUDA, no capture;
- ``device_mallocs``, ``device_frees``: the CUDA caching allocator's own counts of cudaMalloc/cudaFree; CUDA, no
  capture. Of a ``measure()``'s runs, the fewest: the loop's steady state (see :data:`FEWEST`);
- launches, copies and memsets: the CUDA activity of the timeline capture; only where it runs (a test with a
  timeline or launch budget, on CUDA);
- ``async_races``: the race probe (host accesses before the host waited for their non_blocking copy); CUDA,
  with the native extension, no capture.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: How many of the largest contributors a region keeps per counter (operators, kernels, reasons): enough for
#: baselines to name what moved; failure texts show fewer (:data:`SHOWN`).
TOP = 64
SHOWN = 8


@dataclass(frozen=True)
class CounterSpec:
    """One exact counter, described once: what it counts, the probe that counts it, and how the plugin shows and
    explains it (the metrics, the summary column, the explanation of a regression are made from this)."""

    name: str
    description: str
    source: str
    """``ops``, ``compiles``, ``allocator``, ``timeline`` or ``races``: the probe that counts it."""
    quiet_when_zero: bool = False
    """Left out of a test's metrics when 0 and no budget reads it (torch.compile's counters: a loop that does
    not compile has none); an absent value compares as 0 against a baseline."""
    per_token: bool = False
    """Also given per token (decode step), as ``<name>_per_token``: the unit its budget uses."""
    column: str | None = None
    """The summary's column for it (its per-token value where it has one); None: in the JSON results only."""
    items: str | None = None
    """What its largest contributors are, where a region keeps them (operators, kernels, reasons)."""
    explained_by: str | None = None
    """The counter whose contributors explain a change of this one (the copies behind the bytes copied)."""
    unit: str = ""
    budget: str | None = None
    """The marker that limits it (``@pytest.mark.<budget>(limit)``; per token where it is given so): the budget,
    its documentation and its failure sentence are made from this entry."""
    of_runs: str = "largest"
    """Which of a ``measure()``'s runs gives its count: ``largest`` (a count that varies fails on its worst run) or
    ``fewest`` (:data:`FEWEST`)."""


def _copies(way: str, words: str) -> tuple[CounterSpec, CounterSpec]:
    copies = f"copies_{way}"
    return (
        CounterSpec(copies, f"{words} copies", "timeline", items="copies (kind and size)"),
        CounterSpec(f"copy_bytes_{way}", f"bytes copied {words.replace('-to-', ' to ')}", "timeline",
                    explained_by=copies, unit="B"),
    )  # fmt: skip


COUNTERS: dict[str, CounterSpec] = {
    spec.name: spec
    for spec in (
        CounterSpec("ops", "operators dispatched (aten and other dispatcher ops, nested calls included, as "
                    "torch.profiler's cpu_op events count them)", "ops", per_token=True, column="ops/token",
                    items="operators", budget="max_ops_per_token"),
        CounterSpec("launches", "kernel launches (a CUDA graph launch counts one)", "timeline", per_token=True,
                    column="launches/token", items="kernels", budget="max_launches_per_token"),
        CounterSpec("graph_launches", "CUDA graph launches", "timeline", column="graph launches"),
        CounterSpec("graph_kernels", "kernels and copy nodes run by CUDA graph launches", "timeline",
                    items="kernels and copy nodes in CUDA graphs"),
        *_copies("h2d", "host-to-device"),
        *_copies("d2h", "device-to-host"),
        *_copies("d2d", "device-to-device"),
        CounterSpec("memsets", "memsets", "timeline", items="memsets (size)"),
        CounterSpec("device_mallocs", "cudaMalloc calls of the caching allocator", "allocator", of_runs="fewest"),
        CounterSpec("device_frees", "cudaFree calls of the caching allocator", "allocator", of_runs="fewest"),
        CounterSpec("frames_compiled", "frames torch.compile compiled", "compiles", quiet_when_zero=True),
        CounterSpec("recompiles", "recompilations of an already compiled frame", "compiles", quiet_when_zero=True,
                    column="recompiles", items="recompile reasons", budget="max_recompiles"),
        CounterSpec("graph_breaks", "graph breaks taken while compiling", "compiles", quiet_when_zero=True,
                    column="graph breaks", items="graph breaks", budget="max_graph_breaks"),
        CounterSpec("async_races", "host accesses of memory whose non_blocking copy the host had not waited for",
                    "races", quiet_when_zero=True, column="races"),
    )
}  # fmt: skip
#: The counters whose count is their fewest run's. The caching allocator packs each request into the best-fitting
#: cached block, so what a run finds cached decides its packing: a run after the warm-up may still reserve a segment
#: once, by how blocks that earlier tests' live tensors left free split, and the runs after it then reserve none.
#: Seen under pytest-xdist (docs/explanation/gate.md). A loop that calls cudaMalloc in every call (a cache emptied or
#: outgrown each time) does so in its fewest run too.
FEWEST = frozenset(name for name, spec in COUNTERS.items() if spec.of_runs == "fewest")
#: The counters whose largest contributors a region keeps, and what those are (a view of :data:`COUNTERS`).
ITEMIZED = {name: spec.items for name, spec in COUNTERS.items() if spec.items is not None}
#: Counters explained by another's contributors (a view of :data:`COUNTERS`): the bytes copied by the copies.
EXPLAINED_BY = {name: spec.explained_by for name, spec in COUNTERS.items() if spec.explained_by is not None}

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


def total(parts: Sequence[Sequence[RegionCounts]], name: str) -> int | None:
    """A counter over a test's regions: the parts add up, and of the runs of one part (``measure(repeat=...)``)
    the largest counts (the fewest for :data:`FEWEST`). None when no region measured it, or one could not (of a
    :data:`FEWEST` counter: a part none of whose runs could)."""
    fewest = name in FEWEST
    values = []
    for runs in parts:
        found = [run.values[name] for run in runs if name in run.values]
        if any(name in run.unmeasured for run in runs) and not (fewest and found):
            return None
        values.append(found)
    if not any(values):
        return None
    return sum((min if fewest else max)(found) for found in values if found)


def top_over(parts: Sequence[Sequence[RegionCounts]], name: str, limit: int = TOP) -> Items:
    """The largest contributors to a counter over a test's regions: per part, those of the run whose count
    :func:`total` takes, added up."""
    pick = min if name in FEWEST else max
    summed: Counter[str] = Counter()
    for runs in parts:
        measured = [run for run in runs if name in run.values]
        if measured:
            summed.update(dict(pick(measured, key=lambda run: run.values[name]).top.get(name, ())))
    return top_items(summed, limit)


def difference(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    """Counts that grew between two readings of ever-growing counters, by how much."""
    return {name: n - before.get(name, 0) for name, n in after.items() if n > before.get(name, 0)}
