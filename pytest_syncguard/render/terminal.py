"""Text for people: the failure explanation of one test and the end-of-run summary table."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..analysis.counts import SHOWN
from ..analysis.gaps import AttributedGap, TimelineSummary, steps_note
from ..analysis.memory import MemoryStats
from ..analysis.races import race_lines
from ..analysis.snapshot import AllocationSite
from ..document.measured import MeasuredTest, SiteRecord
from ..metrics import METRICS
from ..signals import EXPLAINED_BY, ITEMIZED
from ..signals.base import MIB, Section
from ..status import Status
from .perfetto import SUFFIX

STACK_LINES = 4


def failure_text(result: MeasuredTest) -> str:
    """Budget against measurement with the arithmetic, then the sync sites, most frequent first."""
    lines: list[str] = []
    if result.error is not None:
        lines.append(f"syncguard: {result.error}")
    broken = [c for c in result.checks if c.held is False]
    shown = {section for c in broken for section in c.budget.signal.shows}
    if broken:
        lines.append(f"syncguard: {len(broken)} of {len(result.checks)} budgets exceeded on {result.device}")
        lines.extend(f"  {c.text}" for c in broken)
    if result.comparison is not None and result.comparison.status == Status.REGRESSION:
        device = result.comparison.device
        lines.extend(f"syncguard: baseline {device}: {c.describe()}" for c in result.comparison.of(Status.REGRESSION))
        lines.extend(f"  {line}" for line in result.comparison.explanation.lines())
        lines.extend(consequence_lines(result))
    if Section.SITES in shown or not broken:
        lines.extend(site_lines(result))
    counters = [c.budget.kind.counter for c in broken if c.budget.kind.counter]
    if result.comparison is not None:  # a counter that regressed against the baseline
        counters += [c.metric.removesuffix("_per_token") for c in result.comparison.of(Status.REGRESSION)]
    lines.extend(count_lines(result, counters))
    if result.timeline_source is not None and Section.TIMELINE in shown:
        lines.append(f"syncguard: {result.timeline_source.describe()}")
    if result.timeline is not None and Section.TIMELINE in shown:
        lines.extend(timeline_lines(result))
    if result.gap_diagnosis is not None:
        lines.extend(diagnosis_lines(result.gap_diagnosis))
    if result.races:
        lines.extend(race_lines(result.races))
    if result.memory and Section.ALLOCATOR in shown:
        lines.extend(memory_lines(result.memory))
        lines.extend(allocation_site_lines(result.allocation_sites))
    for path in result.artifacts:
        if path.endswith(SUFFIX):
            lines.append(f"syncguard: judged timeline {path} (open in ui.perfetto.dev; `syncguard trace` reads it)")
        else:
            lines.append(f"syncguard: kept {path}")
    return "\n".join(lines)


def consequence_lines(result: MeasuredTest) -> list[str]:
    """Of a regression, the rest of its chain as the PR comment shows it (:mod:`.chain`): what it did on the GPU,
    what it cost."""
    from ..judge.cases import RunCase
    from ..judge.run import CaseComparison
    from .chain import cost_lines, gpu_lines, plain

    assert result.comparison is not None
    verdict = CaseComparison(RunCase.of(result), result.comparison)
    lines = []
    for title, link in (("on the GPU", gpu_lines(verdict)), ("what it cost", cost_lines(verdict))):
        for index, line in enumerate(link):
            lines.append(f"syncguard: {title}: {plain(line)}" if index == 0 else f"  {plain(line)}")
    return lines


def count_lines(result: MeasuredTest, counters: Iterable[str]) -> list[str]:
    """The largest contributors to each of ``counters`` that the result itemizes."""
    lines: list[str] = []
    # A counter that keeps no contributors of its own is explained by another's (the bytes by their copies).
    for name in dict.fromkeys(n if n in ITEMIZED else EXPLAINED_BY.get(n, n) for n in counters):
        top = result.counted_top.get(name)
        if name not in ITEMIZED or not top:
            continue
        value = result.metrics.get(name)
        of = "" if value is None else f" of {value:g}"
        lines.append(f"largest {ITEMIZED.get(name, 'contributors')} ({name}{of}, most first):")
        lines.extend(f"  {count:>7} x {label}" for label, count in top[:SHOWN])
    return lines


def timeline_lines(result: MeasuredTest) -> list[str]:
    """The test's GPU timeline metrics (medians over its regions), then the largest gaps of its median region."""
    assert result.timeline is not None
    metrics = result.metrics
    busy, largest, p99 = (metrics.get(name) or 0.0 for name in ("busy_fraction", "max_gap_us", "p99_gap_us"))
    runs = metrics.runs.get("max_gap_us", 1)
    return gap_lines(result.timeline, busy, largest, p99, regions=runs)


def diagnosis_lines(summary: TimelineSummary, shown: int = 5) -> list[str]:
    """The largest gaps of a diagnostic rerun, with the host operators between launches."""
    return [
        "largest gaps of a diagnostic rerun with every host operator recorded (--syncguard-gap-ops; the recording "
        "slows the host, so these durations are not the judged ones):",
        *_gap_entries(summary.top_gaps[:shown]),
    ]


def _gap_entries(top_gaps: Sequence[AttributedGap]) -> list[str]:
    return [
        line
        for gap in top_gaps
        for line in (
            f"  {gap.duration_us:>9.1f} us  {gap.cause:<12}  step {'-' if gap.step is None else gap.step:<4}  "
            f"before {gap.next_op[:60]}",
            f"               {gap.detail}",
        )
    ]


def gap_lines(summary: TimelineSummary, busy: float, max_gap: float, p99_gap: float, *, regions: int = 1) -> list[str]:
    """Busy fraction and gap statistics, then the largest idle gaps with their cause, decode step and source."""
    median = f" (median of {regions} regions)" if regions > 1 else ""
    which = f"region {summary.region} of {regions} (its max gap nearest the median): " if regions > 1 else ""
    return [
        f"GPU timeline{median}: busy {busy:.3f}, max gap {max_gap:.1f} us, p99 gap {p99_gap:.1f} us",
        f"{which}{summary.gaps} gaps over {summary.span_us:.0f} us, p50 {summary.p50_gap_us:.1f} us "
        f"({summary.judged_steps} of {summary.steps} steps judged{steps_note(summary.steps_from)})",
        "largest gaps (duration, cause, step, before op):",
        *_gap_entries(summary.top_gaps),
    ]


def memory_lines(memory: Sequence[MemoryStats]) -> list[str]:
    return [
        f"CUDA allocator on device {m.device}: allocated peak {m.allocated_peak / MIB:.1f} MiB, "
        f"reserved peak {m.reserved_peak / MIB:.1f} MiB, fragmentation {m.fragmentation:.3f}, "
        f"inactive split peak {m.inactive_split_peak / MIB:.1f} MiB, cudaMalloc {m.device_mallocs}, "
        f"cudaFree {m.device_frees}, alloc retries {m.alloc_retries}, OOMs {m.ooms}, "
        f"expandable segments {'on' if m.expandable_segments else 'off'}"
        for m in memory
    ]


def allocation_site_lines(sites: Sequence[AllocationSite]) -> list[str]:
    """The call sites that made the largest allocations, from the allocator history of a diagnostic rerun."""
    if not sites:
        return []
    lines = [
        "largest allocation sites, from a diagnostic rerun with the allocator history recorded (largest single "
        "allocation, allocations, total allocated):"
    ]
    for s in sites:
        lines.append(
            f"  {s.largest_bytes / MIB:>9.2f} MiB  {s.allocations:>6} x  {s.total_bytes / MIB:>10.1f} MiB  at {s.site}"
        )
    return lines


#: What the CUDA-call probe counts, as the reports name it.
OUTSIDE_TORCH = "syncs made outside torch (host-blocking CUDA calls of extensions, ctypes, the driver API)"


def _site_line(site: SiteRecord) -> str:
    """``16 x scalar read (aten::_local_scalar_dense) at mygen/decode.py:10 in decode: print(t.item())``: the source
    line as the PR comment shows it, where it was read."""
    return f"  {site.count:>5} x {site.kind} ({site.op}) at {site.site}" + (f": {site.code}" if site.code else "")


def site_lines(result: MeasuredTest) -> list[str]:
    lines: list[str] = []
    if result.sites:
        lines.append(f"sync sites ({result.syncs} syncs, by kind and call site, most frequent first):")
        for site in result.sites:
            lines.append(_site_line(site))
            lines.extend(f"          {frame}" for frame in site.stack[1 : 1 + STACK_LINES])
        if result.more_sites:
            lines.append(f"  ... and {result.more_sites} more sites ({result.more_syncs} syncs)")
    if result.allowed_syncs:
        lines.append(f"allowed (intended) syncs, not counted: {result.allowed_syncs}")
    if result.compile_syncs:
        lines.append(f"made by torch.compile while it compiled (its first call), not counted: {result.compile_syncs}")
        lines.extend(map(_site_line, result.compile_sites))
    if result.invisible_kinds:
        lines.append(
            f"not visible on {result.device}: {', '.join(result.invisible_kinds)} "
            "(counted: scalar reads and data-dependent shapes, as a GPU run would block on them)"
        )
    if result.cuda_calls_uncounted:
        lines.append(f"{OUTSIDE_TORCH} were not counted: {result.cuda_calls_uncounted}")
    return lines


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _metric(result: MeasuredTest, name: str, digits: int) -> str:
    value = result.metrics.get(name)
    return "-" if value is None else f"{value:.{digits}f}"


#: The exact counters the summary shows, where any test measured them (every counter is in the JSON results): a
#: view of the registry (:attr:`.metrics.Metric.column`).
_COUNTER_COLUMNS = tuple((m.name, m.column) for m in METRICS.values() if m.column is not None)


#: The widest the budget column gets: the budgets past it are counted (a failing test's report names each).
BUDGET_WIDTH = 48


def _budgets(result: MeasuredTest) -> str:
    """A row's budgets, as many as fit :data:`BUDGET_WIDTH`, then how many more."""
    described = [c.budget.describe() for c in result.checks]
    shown: list[str] = []
    for text in described:
        if shown and len(", ".join([*shown, text])) > BUDGET_WIDTH:
            break
        shown.append(text)
    cell = ", ".join(shown) + (f" +{len(described) - len(shown)} more" if len(shown) < len(described) else "")
    return cell or "-"


def summary_lines(results: Iterable[MeasuredTest]) -> list[str]:
    """The summary table: test, device, tokens, syncs, syncs per token, the exact counters measured, timings,
    GPU timeline and memory where measured, budget, verdict; under it, where the GPU timelines came from and why
    (each source the tests' timelines had, :meth:`.TimelineSource.describe`)."""
    results = list(results)
    timeline = any("max_gap_us" in r.metrics for r in results)
    memory = any("fragmentation" in r.metrics for r in results)
    timed = any("seconds" in r.metrics for r in results)
    # A counter every test that measured it found at 0 (a compiled loop's recompiles) is a line under the table.
    measured = [(name, title) for name, title in _COUNTER_COLUMNS if any(name in r.metrics for r in results)]
    counters = [(name, title) for name, title in measured if any(r.metrics.get(name) for r in results)]
    nothing = [title for name, title in measured if (name, title) not in counters]
    header: tuple[str, ...] = ("test", "device", "tokens", "syncs", "syncs/token")
    header += tuple(title for _, title in counters)
    header += ("median ms", "tokens/s") if timed else ()
    header += ("max gap us", "p99 gap us", "busy") if timeline else ()
    header += ("fragmentation", "reserved MiB") if memory else ()
    baselines = any(r.comparison for r in results)
    header += ("budget", "baseline", "verdict") if baselines else ("budget", "verdict")
    rows = []
    for r in sorted(results, key=lambda r: r.nodeid):
        row: tuple[str, ...] = (
            r.nodeid,
            r.device,
            "-" if r.tokens is None else str(r.tokens),
            str(r.syncs),
            _fmt(r.syncs_per_token),
        )
        row += tuple(_metric(r, name, 1 if name.endswith("per_token") else 0) for name, _ in counters)
        if timed:
            seconds, rate = r.metrics.get("seconds"), r.metrics.get("tokens_per_second")
            row += ("-" if seconds is None else f"{seconds * 1e3:.1f}", "-" if rate is None else f"{rate:.0f}")
        # Each metric's runs aggregated by its rule, as budgets judge and baselines store them.
        if timeline:
            row += tuple(
                _metric(r, name, digits)
                for name, digits in (("max_gap_us", 1), ("p99_gap_us", 1), ("busy_fraction", 3))
            )
        if memory:
            row += (_metric(r, "fragmentation", 3), _metric(r, "reserved_mb", 1))
        row += (_budgets(r),)
        if baselines:
            row += (r.comparison.status if r.comparison else "-",)
        # Budgets that held beside some this machine cannot measure: the test passed what it could measure, said so.
        unmeasured = sum(c.held is None for c in r.checks)
        partly = r.verdict == Status.NOT_MEASURED and any(c.held for c in r.checks)
        row += (f"PASS ({unmeasured} not measured)" if partly else r.verdict.upper(),)
        rows.append(row)
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    numeric = set(range(2, header.index("budget")))

    def fmt(row: tuple[str, ...]) -> str:
        return "  ".join(
            c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()

    lines = [fmt(header), fmt(tuple("-" * w for w in widths)), *map(fmt, rows)]
    if nothing:
        lines.append(f"{', '.join(nothing)}: 0 in every test that counted them")
    sources = dict.fromkeys(r.timeline_source for r in results if r.timeline_source and "max_gap_us" in r.metrics)
    lines.extend(source.describe() for source in sources if source is not None)
    if any(r.device == "cpu" for r in results):
        lines.append(
            "cpu rows count scalar reads and data-dependent shapes; device<->host copies and explicit "
            "synchronizes are visible only on a GPU run"
        )
    return lines


def baseline_lines(results: Iterable[MeasuredTest], updating: bool, notes: Iterable[str] = ()) -> list[str]:
    """After the table: regressions, improvements (with the command that records them), new tests,
    environment changes since the baselines were recorded, and the run's notes."""
    results = sorted(results, key=lambda r: r.nodeid)
    lines: list[str] = []
    compared = [(r, r.comparison) for r in results if r.comparison]
    if not updating:
        for r, c in compared:
            lines.extend(
                f"REGRESSION {r.nodeid}: baseline {c.device}: {ch.describe()}" for ch in c.of(Status.REGRESSION)
            )
            if c.status == Status.REGRESSION:
                lines.extend(f"  {line}" for line in c.explanation.lines())
        improved = [(r, c) for r, c in compared if c.status == Status.IMPROVEMENT]
        for r, c in improved:
            lines.extend(
                f"improvement {r.nodeid}: baseline {c.device}: {ch.describe()}" for ch in c.of(Status.IMPROVEMENT)
            )
        new = [r.nodeid for r, c in compared if c.status == "new"]
        if new:
            lines.append(f"new (no baseline entry): {', '.join(new)}")
        if improved or new:
            ids = " ".join(sorted({r.nodeid for r, _ in improved} | set(new)))
            lines.append(f"record them with: pytest --syncguard --syncguard-update-baselines {ids}")
        if any(c.of("not judged") for _, c in compared):
            lines.append(
                "host timings (time, tokens/s, gaps, busy fraction) were not judged against the baselines: compare "
                "them A/B on one runner with `syncguard ab --base REF`, or pass --syncguard-judge-host-timings where "
                "this runner recorded the baselines"
            )
    if updating:
        lines.extend(
            f"not recorded in the baselines ({r.outcome}: its numbers are partial): {r.nodeid}"
            for r in results
            if r.outcome is not None
        )
    drift: dict[str, dict[str, tuple[str | None, str | None]]] = {}
    for _, c in compared:
        if c.drift:
            drift.setdefault(c.file, c.drift)
    for file, changes in sorted(drift.items()):
        what = ", ".join(f"{key} {old} -> {new}" for key, (old, new) in sorted(changes.items()))
        lines.append(f"warning: {file} was recorded in another environment ({what})")
    uncounted: dict[str, list[str]] = {}
    for r in results:
        if r.cuda_calls_uncounted:
            uncounted.setdefault(r.cuda_calls_uncounted, []).append(r.nodeid)
    for why, nodeids in uncounted.items():
        shown = ", ".join(nodeids[:3]) + (f" and {len(nodeids) - 3} more" if len(nodeids) > 3 else "")
        lines.append(f"syncguard: {OUTSIDE_TORCH} were not counted in {len(nodeids)} test(s) ({shown}): {why}")
    seen = set()
    for note in [*notes, *(n for r in results for n in r.notes)]:
        if note not in seen:
            seen.add(note)
            lines.append(note)
    return lines
