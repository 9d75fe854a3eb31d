"""One test's measured result, typed, as every report reads it (failure text, summary, JUnit, baselines, the
gate); as plain data it is the results document's record (:mod:`.file`, by :mod:`..codec`). Built from a
measurement by :func:`..result.measured_test`. No torch, nothing of pytest here."""

from __future__ import annotations

import linecache
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..analysis.counts import TOP, Items
from ..analysis.explain import Details, SiteCount
from ..analysis.gaps import TimelineSummary
from ..analysis.memory import MemoryStats
from ..analysis.races import AsyncRace, RaceEvent, stream_name
from ..analysis.sites import Frame, SyncSite
from ..analysis.snapshot import AllocationSite
from ..metrics import Metrics
from ..status import Status
from ..timeline_source import TimelineSource
from .budget import BudgetCheck
from .comparison import Comparison

TOP_SITES = 10
#: The verdicts of a test whose call raised (:attr:`MeasuredTest.outcome`): its numbers are partial.
PARTIAL = frozenset({"failed", "skipped"})


def _display(frame: Frame) -> str:
    """A frame as ``file:line in function``, the file relative to the working directory when inside it."""
    return frame.shown()


def module_path(filename: str) -> str:
    """``filename`` relative to the ``sys.path`` entry it is imported from (the longest that contains it), so that
    it reads the same on every machine and install; as given when no entry contains it."""
    path = os.path.abspath(filename)
    roots = [os.path.abspath(entry or os.curdir) for entry in sys.path]
    inside = [root for root in roots if path.startswith(root.rstrip(os.sep) + os.sep)]
    if not inside:
        return filename
    return path[len(max(inside, key=len).rstrip(os.sep)) + 1 :].replace(os.sep, "/")


@dataclass(frozen=True)
class SiteRecord:
    """The syncs of one kind from one call site, as reports show them, and as baselines match them
    (``path``, module-relative, with ``line``, ``function`` and the source line ``code``)."""

    kind: str
    op: str
    site: str
    count: int
    stack: tuple[str, ...]
    path: str = ""
    line: int = 0
    function: str = ""
    code: str = ""

    @classmethod
    def of(cls, site: SyncSite) -> SiteRecord:
        frame = site.site
        if frame is None:
            return cls(site.kind, site.op, "?", site.count, tuple(map(_display, site.stack)))
        code = linecache.getline(frame.filename, frame.lineno).strip()
        return cls(
            site.kind,
            site.op,
            _display(frame),
            site.count,
            tuple(map(_display, site.stack)),
            module_path(frame.filename),
            frame.lineno,
            frame.function,
            code,
        )

    def counted(self) -> SiteCount | None:
        """As a baseline keeps it; None for a site that was not found."""
        if not self.path:
            return None
        return SiteCount(self.path, self.line, self.function, self.code, self.kind, self.op, self.count)


def _source(frame: Frame | None) -> tuple[str, str]:
    """A frame as reports show it, and its source line."""
    if frame is None:
        return "?", ""
    return _display(frame), linecache.getline(frame.filename, frame.lineno).strip()


def race_record(event: RaceEvent) -> AsyncRace:
    """A race as reports show it: sites relative to the working directory, with their source lines."""
    copy_site, copy_code = _source(event.copy_site)
    access_site, access_code = _source(event.access_site)
    return AsyncRace(
        event.direction,
        event.access,
        event.op,
        copy_site,
        access_site,
        stream_name(event.copy_stream),
        stream_name(event.access_stream),
        copy_code,
        access_code,
    )


@dataclass(frozen=True)
class RankResult:
    """One process's part of a test that every process of a launch (torchrun's ranks) measured."""

    rank: int
    verdict: str
    """Its own verdict (:attr:`MeasuredTest.verdict`), or ``missing``: it left no result of the test."""
    said: tuple[str, ...] = ()
    """Its failed budgets, its error, or why it left no result."""


@dataclass(frozen=True)
class MeasuredTest:
    """Everything the plugin knows about one measured test."""

    #: Written in its record for the file's readers, not read back.
    DERIVED: ClassVar[tuple[str, ...]] = ("syncs", "syncs_per_token", "verdict")

    nodeid: str
    device: str
    """What the test computed on: "cpu" or "cuda"."""
    tokens: int | None
    regions: int
    metrics: Metrics
    """Counts, and medians over runs of the noisy metrics: what the summary, baselines and JUnit show."""
    allowed_syncs: int
    by_kind: Mapping[str, int]
    invisible_kinds: tuple[str, ...]
    checks: tuple[BudgetCheck, ...] = ()
    sites: tuple[SiteRecord, ...] = ()
    more_sites: int = 0
    more_syncs: int = 0
    compile_syncs: int = 0
    """Syncs torch.compile's compiler made while it compiled: reported, not counted."""
    compile_sites: tuple[SiteRecord, ...] = ()
    outcome: str | None = None
    """"failed" or "skipped" when the test's call raised: its numbers are partial, never compared or recorded."""
    counted_top: Mapping[str, Items] = field(default_factory=dict)
    """The largest contributors to the itemized counters (operators, kernels, recompile reasons, graph breaks)."""
    timeline: TimelineSummary | None = None
    """The region whose max gap is nearest the median: the example the failure text shows."""
    gap_diagnosis: TimelineSummary | None = None
    """A failing timeline's diagnostic rerun with every host operator recorded (``--syncguard-gap-ops``): its
    widest region, whose gaps name the operators between launches. Slower than the judged run: not judged."""
    memory: tuple[MemoryStats, ...] = ()
    """Allocator numbers per region and device."""
    races: tuple[AsyncRace, ...] = ()
    """Host accesses of memory whose non_blocking copy the host had not waited for."""
    allocation_sites: tuple[AllocationSite, ...] = ()
    """The largest allocation sites of a failing test's allocator history."""
    comparison: Comparison | None = None
    """Against the baseline entry; None when not compared."""
    artifacts: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    error: str | None = None
    device_slug: str = ""
    """The GPU model (or "cpu") whose baseline file the test belongs to (:func:`.environment.slug_for`)."""
    host: str = ""
    """The device it ran on (:func:`.environment.host_id`): a baseline's recordings say which GPUs made them."""
    timeline_source: TimelineSource | None = None
    """Where its GPU timelines came from, and why (None: it had none on CUDA)."""
    cuda_calls_uncounted: str | None = None
    """On CUDA: why the host-blocking CUDA calls made outside torch were not counted in a region, if so."""
    expected_failure: str | None = None
    """Its budgets failed as its xfail mark expects (the mark's reason): pytest reports it XFAIL, and so does the
    run's verdict, which it does not fail."""
    records: Mapping[str, Any] = field(default_factory=dict)
    """What a signal keeps of it beyond its metrics (:attr:`..signals.base.Signal.kept`), by signal: a record of the
    signal's own type (the collectives' calls and kernels, which the report matches across ranks)."""
    world_size: int = 1
    """The processes of the launch that measured it together (torchrun's ``WORLD_SIZE``)."""
    ranks: tuple[RankResult, ...] = ()
    """Of a test joined from the documents of every rank (:func:`.launch.join`): each rank's part, in rank order."""
    joined: Mapping[str, Any] = field(default_factory=dict)
    """Of a joined test, by signal: its ranks' records joined (the collectives matched: waits and the straggler)."""

    @property
    def syncs(self) -> int:
        return int(self.metrics.values["syncs"])

    @property
    def syncs_per_token(self) -> float | None:
        return self.metrics.get("syncs_per_token")

    @property
    def verdict(self) -> str:
        """error, failed or skipped (the test's call raised), fail (a budget), regression (against the
        baseline), pass, "not measured" (nothing failed, something could not be measured) or measured (no
        budget)."""
        if self.error is not None:
            return "error"
        if self.outcome is not None:
            return self.outcome
        if any(c.held is False for c in self.checks):
            return "fail"
        if self.comparison is not None and self.comparison.status == Status.REGRESSION:
            return Status.REGRESSION
        if not self.checks:
            return "measured"
        return "pass" if all(c.held for c in self.checks) else "not measured"

    def details(self) -> Details:
        """What explains a change of this test's counts against another run's: its sync sites, and the largest
        contributors to its itemized counters."""
        sites = tuple(found for s in self.sites if (found := s.counted()) is not None)
        return Details(sites, dict(self.counted_top), TOP)

    @property
    def failed(self) -> bool:
        return self.verdict in ("fail", "error", Status.REGRESSION, "failed")

    def broke(self, signal: str) -> bool:
        """Whether a measured number of ``signal`` (its name: the timeline, the memory) broke a budget (not one that
        was missing or unreliable)."""
        return any(c.held is False and c.value is not None and c.budget.signal.name == signal for c in self.checks)
