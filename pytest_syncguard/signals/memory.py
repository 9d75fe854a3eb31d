"""The memory signal: the CUDA caching allocator's own numbers per region (its peaks, fragmentation, and its
cudaMalloc and cudaFree calls, :mod:`..probes.memory`); CUDA only."""

from __future__ import annotations

from ..analysis.memory import MemoryStats
from .base import (
    MIB,
    BudgetKind,
    CounterSpec,
    Limit,
    Measured,
    Metric,
    Part,
    Runs,
    Section,
    Signal,
    chained,
    named,
    worst,
)


def max_fragmentation(limit: float) -> None:
    """Fail when 1 - allocated_peak / reserved_peak of the CUDA caching allocator in the region exceeds
    ``limit`` (peaks reset at entry). Needs CUDA."""


def max_reserved_mb(limit: float) -> None:
    """Fail when the CUDA caching allocator's reserved peak in the region exceeds ``limit`` MiB. Needs CUDA."""


def _fragmentation(budget: Limit, value: float, m: Measured, example: int) -> str:
    worst = m.memory[example]
    return (
        f"{budget.marker}: limit {budget.limit:.2f}, measured {value:.3f}: 1 - allocated peak "
        f"{worst.allocated_peak / MIB:.1f} MiB / reserved peak {worst.reserved_peak / MIB:.1f} MiB"
    )


def _reserved(budget: Limit, value: float, m: Measured, example: int) -> str:
    return f"{budget.marker}: limit {budget.limit:g} MiB, measured reserved peak {value:.1f} MiB"


def _own_memory(m: Measured) -> list[MemoryStats]:
    """The allocator numbers of the regions in which no cudaMalloc failed: where the GPU's memory ran out and the
    allocator freed its cache to retry, its peaks depend on what else held that GPU's memory, not on the test."""
    return [s for s in m.memory if not s.alloc_retries]


NO_OWN_MEMORY = (
    "no CUDA memory stats for the region, or the GPU's memory ran out during it (the allocator retried a cudaMalloc "
    "after freeing its cache: its peaks then depend on what else held that GPU's memory)"
)

SIGNAL = Signal(
    "memory",
    metrics=(
        # Its floor follows reserved_mb's 2%: a reserved peak within that moves 1 - allocated/reserved by up to
        # 0.02 x (1 - fragmentation) for the same allocated peak, a packing of blocks, not a regression.
        Metric(
            "fragmentation",
            "",
            counted=False,
            higher_is_better=False,
            floor=0.02,
            runs=lambda m: [s.fragmentation for s in _own_memory(m)],
            tolerance=0.02,
            min_tolerance=0.02,
            aggregate=worst,
            description="1 - allocated peak / reserved peak of the caching allocator in a region",
        ),
        Metric(
            "reserved_mb",
            "MiB",
            counted=False,
            higher_is_better=False,
            floor=2.0,
            runs=lambda m: [s.reserved_peak / MIB for s in _own_memory(m)],
            tolerance=0.02,
            min_tolerance=0.02,
            aggregate=worst,
            description="the caching allocator's reserved peak in a region",
        ),
    ),
    counters=(
        CounterSpec("device_mallocs", "cudaMalloc calls of the caching allocator", of_runs="fewest"),
        CounterSpec("device_frees", "cudaFree calls of the caching allocator", of_runs="fewest"),
    ),
    kinds=(
        BudgetKind(
            "max_fragmentation",
            max_fragmentation,
            "memory",
            named("fragmentation"),
            _fragmentation,
            fraction=True,
            unmeasured=NO_OWN_MEMORY,
        ),
        BudgetKind(
            "max_reserved_mb", max_reserved_mb, "memory", named("reserved_mb"), _reserved, unmeasured=NO_OWN_MEMORY
        ),
    ),
    cuda=True,
    needs_text=" Needs CUDA.",
    timed=True,
    on_demand=True,
    shows=frozenset({Section.ALLOCATOR}),
    parts=(Part("memory", chained, Runs.EVERY),),  # per region and device: a budget holds in every run
)
