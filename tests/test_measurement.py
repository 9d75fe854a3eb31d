"""A measurement's parts merge as their signals say: across a test's regions, and across a ``measure()``'s runs,
checked against syncs made on purpose (``.item()`` calls counted by construction)."""

from __future__ import annotations

from collections import Counter
from dataclasses import fields

import torch

from pytest_syncguard import SyncGuard
from pytest_syncguard.guard import REGION_PROBES
from pytest_syncguard.measurement import PARTS, Measurement
from pytest_syncguard.signals import BY_NAME, SIGNALS


def test_every_field_of_a_measurement_is_one_part_with_its_rules() -> None:
    declared = Counter(part.field for part in PARTS)
    assert [name for name, times in declared.items() if times > 1] == []
    # A field of the measurement's own, or a signal's own part (kept in Measurement.parts, empty where unfilled).
    assert {p.field for p in PARTS if p.empty is None} == {f.name for f in fields(Measurement)} - {"parts"}
    own = [p for p in PARTS if p.empty is not None]
    assert {p.field for p in own} == {"collective_calls", "collective_kernels", "collective_times", "races"}
    assert all(Measurement(device="cpu", tokens=1, events=()).part(p.field) == p.empty() for p in own)
    owners = {part.field: signal.name for signal in SIGNALS for part in signal.parts}
    assert owners["events"] == "syncs" and owners["memory"] == "memory" and owners["timings"] == "wall_time"


def test_every_signal_has_its_region_probes_but_the_wall_time_the_regions_own_clock() -> None:
    served = {probe.signal for probe in REGION_PROBES if probe.signal is not None}
    assert served <= set(BY_NAME)
    assert set(BY_NAME) - served == {"wall_time"}


def test_a_units_own_probes_run_beside_the_guards_in_their_place_and_on_demand() -> None:
    """A signal that keeps its region probes in its unit (:attr:`Signal.probes`: the races, the collectives' times)
    has them run by every region, at their depth among the guard's, and only for a test with its budgets where they
    are on demand."""
    import importlib

    from pytest_syncguard.guard import GenerationRegion

    kept = [s for s in SIGNALS if s.probes]
    assert [s.name for s in kept] == ["races", "collectives"]
    for signal in kept:
        module = importlib.import_module(f"pytest_syncguard.probes.{signal.probes}")
        assert set(module.REGION_PROBES) <= set(REGION_PROBES)
        assert {probe.signal for probe in module.REGION_PROBES} == {signal.name}
    assert [p.depth for p in REGION_PROBES] == sorted(p.depth for p in REGION_PROBES)
    names = [p.name for p in REGION_PROBES]
    assert names.index("transfers") < names.index("races") < names.index("driver calls")
    assert names[0] == "collective times"  # outermost: its window holds every collective of the region
    # A probe on demand serves a signal on demand, and a region gives each probe a state of its own.
    assert all(BY_NAME[p.signal].on_demand for p in REGION_PROBES if p.on_demand and p.signal is not None)
    one, two = GenerationRegion(2, "cpu"), GenerationRegion(2, "cpu")
    assert one._states["races"] == [] and one._states["races"] is not two._states["races"]


def _syncs(count: int) -> None:
    x = torch.ones(2)
    for _ in range(count):
        x.sum().item()


def test_a_measures_runs_merge_as_their_signals_say() -> None:
    guard = SyncGuard("test_runs", device="cpu")
    calls = iter([1, 4, 2, 3])  # the counting run, then three timed runs; the second run is the worst
    worst = guard.measure(lambda: _syncs(next(calls)), tokens=2, warmup=0, repeat=3)
    assert worst.syncs == 4 and len(worst.events) == 4
    # The timings and region numbers are the timed runs' only; the counters keep every run, as one part.
    assert len(worst.timings) == 3 and worst.regions == 3
    (part,) = worst.count_parts
    assert len(part) == 4 and part[1:] == worst.region_numbers and set(worst.region_counts) == set(part)
    assert guard.measurements == [worst]


def test_a_tests_regions_combine_their_syncs_and_tokens() -> None:
    guard = SyncGuard("test_regions", device="cpu")
    with guard.generation(tokens=2):
        _syncs(1)
    with guard.generation(tokens=3):
        _syncs(2)
    both = Measurement.combine(guard.measurements)
    assert (both.syncs, both.tokens, both.regions, len(both.timings)) == (3, 5, 2, 2)
    assert both.count_parts == tuple((n,) for n in both.region_numbers)
    with guard.generation():  # no tokens: the sum is unknown
        _syncs(1)
    assert Measurement.combine(guard.measurements).tokens is None
