"""What a probe of a measured region is (:class:`RegionProbe`), and what of the region it may read
(:class:`Region`): the guard runs its own probes and each signal unit's (:attr:`.signals.base.Signal.probes`)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from ..analysis.counts import RegionCounts


class Region(Protocol):
    """What a unit's region probe reads of its region (the guard's region is one: :mod:`..guard` checks it)."""

    number: int

    @property
    def on_cuda(self) -> bool: ...

    @property
    def counts(self) -> list[RegionCounts]:
        """The region's exact counts, to which a counter's probe appends its own."""


@dataclass(frozen=True)
class RegionProbe:
    """One probe of a measured region: where it stands among the probes (``depth``, outermost first), whether the
    region wants it, what records its part of the region's results around the region's block into its own
    ``state`` (a new one per region), and the fields of the region's measurement it fills from that state once all
    probes have closed. A counter's probe fills none: its counts join the region's :attr:`Region.counts`."""

    name: str
    signal: str | None
    """The signal whose numbers it records (:data:`.signals.BY_NAME`); None: the region's own bookkeeping."""
    depth: int
    """Outermost first: a probe does not see the work of those outside it (the guard's own stand at 10 to 130)."""
    wanted: Callable[[Any], bool]
    recording: Callable[[Any, Any], AbstractContextManager[object]]
    fills: Callable[[Any, Any], dict[str, Any]] | None = None
    """The parts of the measurement it fills (:data:`.measurement.PARTS`), by field (empty where it was not
    wanted)."""
    state: Callable[[], Any] = lambda: None
    on_demand: bool = False
    """It runs only for a test with a budget of its signal (:attr:`.signals.base.Signal.on_demand`)."""
