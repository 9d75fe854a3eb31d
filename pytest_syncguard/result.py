"""A measured test's record built from its measurement and its budget checks, at the end of its call: what the
plugin writes into the results document (:mod:`.document.measured`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .document.budget import BudgetCheck, closest_run
from .document.measured import TOP_SITES, MeasuredTest, SiteRecord, race_record
from .metrics import Metrics
from .signals import ITEMIZED, SIGNALS

if TYPE_CHECKING:
    from .measurement import Measurement


def measured_test(
    nodeid: str,
    measurement: Measurement,
    checks: Sequence[BudgetCheck],
    error: str | None = None,
    device_slug: str = "",
    host: str = "",
) -> MeasuredTest:
    """The result of a measurement and its budget checks; the metrics include the gap statistic each
    idle-gap budget reads."""
    sites = measurement.sites()
    shown, rest = sites[:TOP_SITES], sites[TOP_SITES:]
    timelines = measurement.gpu_timelines
    metrics = Metrics.of(measurement, extra=[c.budget.metric.name for c in checks])
    timeline = None
    if timelines:
        index = closest_run([t.gap_stat("max") for t in timelines], metrics.values["max_gap_us"])
        timeline = timelines[index].summary(region=index + 1)
    return MeasuredTest(
        nodeid=nodeid,
        device=measurement.device,
        tokens=measurement.tokens,
        regions=measurement.regions,
        metrics=metrics,
        allowed_syncs=measurement.allowed_syncs,
        by_kind=measurement.by_kind(),
        invisible_kinds=measurement.invisible_kinds,
        checks=tuple(checks),
        sites=tuple(map(SiteRecord.of, shown)),
        more_sites=len(rest),
        more_syncs=sum(s.count for s in rest),
        compile_syncs=measurement.compile_syncs,
        compile_sites=tuple(map(SiteRecord.of, measurement.sites(compiling=True)[:TOP_SITES])),
        counted_top={name: top for name in ITEMIZED if (top := measurement.count_top(name))},
        timeline=timeline,
        memory=measurement.memory,
        races=tuple(map(race_record, measurement.races)),
        error=error,
        device_slug=device_slug,
        host=host,
        cuda_calls_uncounted=measurement.cuda_calls_uncounted,
        records={s.name: kept for s in SIGNALS if s.kept is not None and (kept := s.kept.of(measurement)) is not None},
    )
