"""The comment's picture of the history: a regressed test's metric over the last runs of the default branch and this
run, as a Mermaid chart GitHub draws in a comment (:func:`mermaid`); the history page is :mod:`.page`'s. A renderer
only: the numbers come from :mod:`..judge.history`.

Text from the history or the run (test ids, commits, hosts) is untrusted: it is cut to a harmless alphabet (Mermaid
reads the block, not Markdown, and a quote or a backtick would end its string or the fence)."""

from __future__ import annotations

import math
import re

from ..judge.history import History, Run
from ..metrics import metric

#: The most runs of the default branch a chart shows, newest last.
SHOWN_RUNS = 20
_LABEL = re.compile(r"[^A-Za-z0-9_.:/\[\]() -]")
#: One saturated line, legible on GitHub's light and dark themes alike (Mermaid's default palette is pale on dark).
THEME = '%%{init: {"theme": "base", "themeVariables": {"xyChart": {"plotColorPalette": "#e8590c"}}}}%%'


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
    (labelled by commit) and this run's value last (``this run``: a pull request's, or the default branch's own before
    it is recorded); empty where the history has no run of it."""
    points = _series(history, nodeid, name)
    if not points:
        return []
    spec = metric(name)
    unit = spec.unit if spec is not None and spec.unit else name
    labels = [_label(run.commit[:7]) or "?" for run, _ in points] + ["this run"]
    values = [value for _, value in points] + [now]
    low, high = min(values), max(values)
    margin = (high - low) * 0.2 or abs(high) * 0.01 or 1.0
    axis = ", ".join(f'"{label}"' for label in labels)
    return [
        "```mermaid",
        THEME,
        "xychart-beta",
        # The metric alone: the caption above the chart names the test (a test id ran past the chart's edge).
        f'    title "{_label(name)}"',
        f"    x-axis [{axis}]",
        f'    y-axis "{_label(unit)}" {plain(low - margin)} --> {plain(high + margin)}',
        f"    line [{', '.join(plain(v) for v in values)}]",
        "```",
    ]
