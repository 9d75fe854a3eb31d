"""The signals, each one unit (:class:`.base.Signal`), and the catalogue made from them: every exact counter
(:data:`COUNTERS`), every budget marker (:data:`KINDS`) and the views of them the rest of the plugin reads. A new
signal is a module here, listed in :data:`SIGNALS`, with its region probe on the torch side
(:data:`..guard.REGION_PROBES`). No torch here: the CI side reads it too."""

from __future__ import annotations

from collections.abc import Iterable

from ..analysis.explain import ExplainRules
from . import collectives, compiles, graphs, memory, ops, races, syncs, timeline, transfers, wall_time
from .base import BudgetKind, CounterSpec, Part, Signal, counter_kind

#: Every signal, in the order of the metrics and the summary's columns (the markers' order: :data:`KINDS`).
SIGNALS: tuple[Signal, ...] = (
    syncs.SIGNAL,
    ops.SIGNAL,
    timeline.SIGNAL,
    transfers.SIGNAL,
    memory.SIGNAL,
    compiles.SIGNAL,
    races.SIGNAL,
    graphs.SIGNAL,
    collectives.SIGNAL,
    wall_time.SIGNAL,
)
BY_NAME: dict[str, Signal] = {signal.name: signal for signal in SIGNALS}
#: The fields of a measurement the signals fill, with how each merges across regions and runs.
PARTS: tuple[Part, ...] = tuple(part for signal in SIGNALS for part in signal.parts)
#: Every exact counter, by name.
COUNTERS: dict[str, CounterSpec] = {spec.name: spec for signal in SIGNALS for spec in signal.counters}
#: Every budget marker, by name: the budgets on syncs (the first signal's), then every counter's budget, then the
#: other signals' own budgets, in the order of the signals.
KINDS: dict[str, BudgetKind] = {
    kind.marker: kind
    for kind in (
        *SIGNALS[0].kinds,
        *(counter_kind(signal, spec) for signal in SIGNALS for spec in signal.counters if spec.budget is not None),
        *(kind for signal in SIGNALS[1:] for kind in signal.kinds),
    )
}
#: The counters whose count is their fewest run's. The caching allocator packs each request into the best-fitting
#: cached block, so what a run finds cached decides its packing: a run after the warm-up may still reserve a segment
#: once, by how blocks that earlier tests' live tensors left free split, and the runs after it then reserve none.
#: Seen under pytest-xdist (docs/explanation/gate.md). A loop that calls cudaMalloc in every call (a cache emptied or
#: outgrown each time) does so in its fewest run too.
FEWEST = frozenset(name for name, spec in COUNTERS.items() if spec.of_runs == "fewest")
#: The counters a run that could not count them leaves to the other runs of its ``measure()``.
COUNTED_RUNS = frozenset(name for name, spec in COUNTERS.items() if spec.counted_runs or spec.of_runs == "fewest")
#: The counters whose largest contributors a region keeps, and what those are.
ITEMIZED = {name: spec.items for name, spec in COUNTERS.items() if spec.items is not None}
#: Counters explained by another's contributors: the bytes copied by the copies.
EXPLAINED_BY = {name: spec.explained_by for name, spec in COUNTERS.items() if spec.explained_by is not None}
#: What explaining a count's change needs of the catalogue (:func:`..analysis.explain.explain`).
EXPLAIN = ExplainRules(ITEMIZED, EXPLAINED_BY)


def needs(signal_names: Iterable[str]) -> frozenset[str]:
    """The signals a capture records for on demand (:attr:`.base.Signal.on_demand`), of budgets on these signals
    (names from :data:`BY_NAME`)."""
    return frozenset(name for name in signal_names if BY_NAME[name].on_demand)


__all__ = [
    "BY_NAME",
    "COUNTED_RUNS",
    "COUNTERS",
    "EXPLAINED_BY",
    "FEWEST",
    "ITEMIZED",
    "KINDS",
    "PARTS",
    "SIGNALS",
    "BudgetKind",
    "CounterSpec",
    "Part",
    "Signal",
    "needs",
]
