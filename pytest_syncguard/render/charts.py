"""Pictures of the history: a regressed test's metric over the last runs of the default branch and this run, as a
Mermaid chart GitHub draws in a comment (:func:`mermaid`), and every test's metrics per GPU model as a static HTML
page whose points link to their commits (:func:`page`). Renderers only: the numbers come from :mod:`..history`.

Text from the history or the run (test ids, commits, hosts) is untrusted: in the chart it is cut to a harmless
alphabet (Mermaid reads the block, not Markdown, and a quote or a backtick would end its string or the fence), in
the page it is HTML-escaped."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence

from ..judge.history import History, Run
from ..metrics import DEVICE_TIME, metric
from ..words import plural
from .links import RepositoryWeb

#: The most runs of the default branch a chart shows, newest last.
SHOWN_RUNS = 20
_LABEL = re.compile(r"[^A-Za-z0-9_.:/\[\]() -]")


def _label(text: str, limit: int = 80) -> str:
    return _LABEL.sub("_", text)[:limit]


def plain(value: float, significant: int = 6) -> str:
    """``value`` to ``significant`` digits in positional notation (``12800000``, ``0.000125``): Mermaid's xychart
    reads no exponent form (``1.28e+07``)."""
    if not math.isfinite(value) or value == 0:
        return "0"
    decimals = min(15, max(0, significant - 1 - math.floor(math.log10(abs(value)))))
    text = f"{value:.{decimals}f}"
    return (text.rstrip("0").rstrip(".") if "." in text else text) or "0"


def _series(history: History, nodeid: str, name: str) -> list[tuple[Run, float]]:
    return history.series(nodeid, name)[-SHOWN_RUNS:]


def mermaid(history: History, nodeid: str, name: str, now: float) -> list[str]:
    """A fenced Mermaid ``xychart-beta`` of metric ``name`` of test ``nodeid``: its last runs on the default branch
    (labelled by commit) and this run's value last (``this PR``); empty where the history has no run of it."""
    points = _series(history, nodeid, name)
    if not points:
        return []
    spec = metric(name)
    unit = spec.unit if spec is not None and spec.unit else name
    labels = [_label(run.commit[:7]) or "?" for run, _ in points] + ["this PR"]
    values = [value for _, value in points] + [now]
    low, high = min(values), max(values)
    margin = (high - low) * 0.2 or abs(high) * 0.01 or 1.0
    axis = ", ".join(f'"{label}"' for label in labels)
    return [
        "```mermaid",
        "xychart-beta",
        f'    title "{_label(nodeid)} {_label(name)}"',
        f"    x-axis [{axis}]",
        f'    y-axis "{_label(unit)}" {plain(low - margin)} --> {plain(high + margin)}',
        f"    line [{', '.join(plain(v) for v in values)}]",
        "```",
    ]


def page(histories: Sequence[History], web: RepositoryWeb | None = None) -> str:
    """A static HTML page: per GPU model, per test, a small SVG chart of each metric the history keeps, each point a
    link to its commit (on the repository's pages ``web`` where given) with its value and host in its title."""
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8"><title>syncguard history</title>',
        "<style>body{font-family:sans-serif;margin:2em}svg{background:#fafafa;border:1px solid #ddd;margin:4px}"
        "h2{margin-top:2em}figure{display:inline-block;margin:0 8px}figcaption{font-size:12px}</style>",
        "</head><body>",
        "<h1>syncguard history</h1>",
    ]
    for history in histories:
        held = f"{plural(history.count, 'run')} on {plural(len(history.hosts), 'host')}"
        parts.append(f"<h2>{html.escape(history.device)}: {held}</h2>")
        tests = sorted({nodeid for run in history.runs for nodeid in run.tests})
        for nodeid in tests:
            parts.append(f"<h3>{html.escape(nodeid)}</h3>")
            names = sorted({n for run in history.runs for n in run.tests.get(nodeid, {})}, key=_first)
            steady = []
            for name in names:
                points = history.series(nodeid, name)
                if name != DEVICE_TIME and len({v for _, v in points}) == 1:
                    steady.append(f"{name} {points[0][1]:g}")
                    continue
                parts.append(_chart(points, name, web))
            if steady:
                parts.append(f"<p>the same in every run: {html.escape(', '.join(steady))}</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _chart(points: Sequence[tuple[Run, float]], name: str, web: RepositoryWeb | None) -> str:
    width, height, pad = 320, 120, 12
    values = [v for _, v in points]
    low, high = min(values), max(values)
    span = (high - low) or abs(high) or 1.0
    step = (width - 2 * pad) / max(len(points) - 1, 1)

    def y(value: float) -> float:
        if high == low:
            return height / 2
        return height - pad - (value - low) / span * (height - 2 * pad)

    coordinates = [(pad + i * step, y(v)) for i, v in enumerate(values)]
    line = " ".join(f"{x:.1f},{yy:.1f}" for x, yy in coordinates)
    dots = []
    for (run, value), (x, yy) in zip(points, coordinates, strict=True):
        title = html.escape(f"{run.commit[:12]} on {run.host}: {name} {value:g}")
        href = web.commit(run.commit) if web is not None else None
        dot = f'<circle cx="{x:.1f}" cy="{yy:.1f}" r="3" fill="#1f6feb"><title>{title}</title></circle>'
        dots.append(f'<a href="{html.escape(href)}">{dot}</a>' if href else dot)
    label = html.escape(f"{name}: {values[-1]:g} (last), {low:g} to {high:g}")
    return (
        f'<figure><svg width="{width}" height="{height}" role="img" aria-label="{label}">'
        f'<polyline points="{line}" fill="none" stroke="#888"/>{"".join(dots)}</svg>'
        f"<figcaption>{label}</figcaption></figure>"
    )


def _first(name: str) -> tuple[int, str]:
    """Device time first, then the rest by name."""
    return (name != DEVICE_TIME, name)
