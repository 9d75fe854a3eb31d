"""Text for people: the failure explanation of one test and the end-of-run summary table."""

from __future__ import annotations

from collections.abc import Iterable

from .results import TestResult

STACK_LINES = 4


def failure_text(result: TestResult) -> str:
    """Budget against measurement with the arithmetic, then the sync sites, most frequent first."""
    lines: list[str] = []
    if result.error is not None:
        lines.append(f"syncguard: {result.error}")
    broken = [b for b in result.budgets if b.passed is False]
    if broken:
        lines.append(f"syncguard: {len(broken)} of {len(result.budgets)} sync budgets exceeded on {result.device}")
        lines.extend(f"  {b.text}" for b in broken)
    lines.extend(site_lines(result))
    return "\n".join(lines)


def site_lines(result: TestResult) -> list[str]:
    lines: list[str] = []
    if result.sites:
        lines.append(f"sync sites ({result.syncs} syncs, by kind and call site, most frequent first):")
        for site in result.sites:
            lines.append(f"  {site.count:>5} x {site.kind} ({site.op}) at {site.site}")
            lines.extend(f"          {frame}" for frame in site.stack[1 : 1 + STACK_LINES])
        if result.more_sites:
            lines.append(f"  ... and {result.more_sites} more sites ({result.more_syncs} syncs)")
    if result.allowed_syncs:
        lines.append(f"allowed (intended) syncs, not counted: {result.allowed_syncs}")
    if result.invisible_kinds:
        lines.append(
            f"not visible on {result.device}: {', '.join(result.invisible_kinds)} "
            "(counted: scalar reads and data-dependent shapes, as a GPU run would block on them)"
        )
    return lines


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def summary_lines(results: Iterable[TestResult]) -> list[str]:
    """The summary table: test, device, tokens, syncs, syncs per token, budget, verdict."""
    results = list(results)
    header = ("test", "device", "tokens", "syncs", "syncs/token", "budget", "verdict")
    rows = [
        (
            r.nodeid,
            r.device,
            "-" if r.tokens is None else str(r.tokens),
            str(r.syncs),
            _fmt(r.syncs_per_token),
            ", ".join(f"{b.marker}<={b.limit:g}" for b in r.budgets) or "-",
            r.verdict.upper(),
        )
        for r in sorted(results, key=lambda r: r.nodeid)
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    numeric = {2, 3, 4}

    def fmt(row: tuple[str, ...]) -> str:
        return "  ".join(
            c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()

    lines = [fmt(header), fmt(tuple("-" * w for w in widths)), *map(fmt, rows)]
    if any(r.device == "cpu" for r in results):
        lines.append(
            "cpu rows count scalar reads and data-dependent shapes; device<->host copies and explicit "
            "synchronizes are visible only on a GPU run"
        )
    return lines
