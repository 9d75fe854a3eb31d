"""The history page: per GPU model, one static HTML file of every test's metrics over the default branch's runs,
with an index of the tests and a search over them; and an index of the models (:func:`pages`).

A page stays small whatever the history's age: each chart's runs are cut into at most :data:`BUCKETS` buckets, kept
within its levels (a bucket never spans the start of a level), each bucket's lowest and highest value and its last
run kept, so a glitch shows however many runs lie around it; every run stays in the history's segments. The charts
are drawn with uPlot (vendored, pinned: ``render/vendor``), only when they scroll into view, with axes, dates, the
levels' medians, zoom into runs and, on hover, the runs, commits, hosts and dates of the bucket under the pointer (a
click opens its last commit where the repository is known). Counts that never changed are one line of text.

Text from the history (test ids, commits, hosts) is untrusted: it reaches the page as JSON inside a script element
whose ``<`` are escaped, and the script sets it as text, never as HTML."""

from __future__ import annotations

import html
import json
import statistics
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..judge.history import History, Run, compact, level_starts
from ..metrics import DEVICE_TIME, metric
from ..words import plural
from .links import RepositoryWeb

#: The most buckets a chart's runs are drawn in (about one per two pixels of its width).
BUCKETS = 240


@dataclass(frozen=True)
class PageFile:
    """One file of the page: its name beside the index, and its text."""

    name: str
    text: str


def _short(value: float) -> float:
    """``value`` to 5 significant digits (what a chart can show): a third of the bytes of a full float."""
    return float(f"{value:.5g}")


class _Series:
    """A device-side metric of one test as the runs stream by: its buckets (one per ``width`` runs at most, cut at
    each level's start: ``[first run, last run, lowest, highest, last value]``) and its levels (``[first run, last
    run, median]``); each level's values are held only until it ends."""

    def __init__(self, starts: Sequence[int], width: int) -> None:
        self.starts, self.width = list(starts), width
        self.buckets: list[list[float]] = []
        self.levels: list[list[float]] = []
        self.values = array("d")
        self.bucket: list[float] | None = None
        self.until = -1  # the first run the current bucket cannot take (its window's end, or a level's start)
        self.level_first = -1
        self.runs = 0

    def add(self, number: int, value: float) -> None:
        bucket = self.bucket
        if bucket is None or number >= self.until:
            bucket = self._open(number, value)
        bucket[1] = number
        if value < bucket[2]:
            bucket[2] = value
        elif value > bucket[3]:
            bucket[3] = value
        bucket[4] = value
        self.values.append(value)
        self.runs += 1

    def _open(self, number: int, value: float) -> list[float]:
        """A new bucket at run ``number``, and a new level where one starts at or before it."""
        if self.starts and self.starts[0] <= number:
            while self.starts and self.starts[0] <= number:
                self.starts.pop(0)
            self._end_level()
        if not self.values:
            self.level_first = number
        bucket = [number, number, value, value, value]
        self.buckets.append(bucket)
        self.bucket = bucket
        window_end = (number // self.width + 1) * self.width
        self.until = min(window_end, self.starts[0]) if self.starts else window_end
        return bucket

    def _end_level(self) -> None:
        if self.values:
            self.levels.append([self.level_first, self.buckets[-1][1], _short(statistics.median(self.values))])
        self.values = array("d")

    @property
    def moved(self) -> bool:
        return any(b[2] != b[3] for b in self.buckets) or len({b[4] for b in self.buckets}) > 1

    def chart(self, name: str) -> dict[str, Any]:
        self._end_level()
        return {"metric": name, "unit": _unit(name), "runs": self.runs, **_encoded(self.buckets), "levels": self.levels}


class _Steps:
    """A count of one test as the runs stream by, as stored: a value where it changed (or a segment began), so
    the runs between keep it."""

    def __init__(self) -> None:
        self.changes: list[tuple[int, float]] = []

    def add(self, number: int, value: float) -> None:
        if not self.changes or self.changes[-1][1] != value:
            self.changes.append((number, value))

    def chart(self, name: str, last: int, width: int) -> dict[str, Any]:
        """Its buckets over its runs up to ``last`` (the last run that had its test), each window's values."""
        buckets: list[list[float]] = []
        changes, at = self.changes, 0
        value = changes[0][1]
        begin = changes[0][0]
        while begin <= last:
            end = min(last, (begin // width + 1) * width - 1)
            low = high = value
            while at + 1 < len(changes) and changes[at + 1][0] <= end:
                at += 1
                value = changes[at][1]
                low, high = min(low, value), max(high, value)
            buckets.append([begin, end, low, high, value])
            begin = end + 1
        return {
            "metric": name,
            "unit": _unit(name),
            "runs": last - changes[0][0] + 1,
            **_encoded(buckets),
            "levels": [],
        }


def _unit(name: str) -> str:
    spec = metric(name)
    return spec.unit if spec is not None and spec.unit else ""


#: The steps a chart's range is cut into: each drawn value an integer of at most 4 digits (a tenth of a pixel).
STEPS = 9999


def _encoded(buckets: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Buckets as the page holds them: each bucket's last run (its first is the bucket before's last + 1), and its
    lowest, highest and last value as whole steps of the chart's range above ``base``."""
    low, high = min(b[2] for b in buckets), max(b[3] for b in buckets)
    base, step = _short(low), float(f"{(high - low) / STEPS:.6g}")

    def at(value: float) -> int:
        return round((value - base) / step) if step else 0

    return {
        "base": base,
        "step": step,
        "first": buckets[0][0],
        "ends": [b[1] for b in buckets],
        "lo": [at(b[2]) for b in buckets],
        "hi": [at(b[3]) for b in buckets],
        "last": [at(b[4]) for b in buckets],
    }


def data(history: History, runs: Iterable[Run] | None = None, web: RepositoryWeb | None = None) -> dict[str, Any]:
    """What one GPU model's page draws, from ``runs``, every run of it streamed oldest first as stored (each count
    only where it changed: :func:`.history.every_run` without ``filled``; the history's own runs where None): the
    runs (commit, time, host), the hosts, where a commit's page is, and per test its charts and steady counts.
    ``history`` (its checkpoint and open segment) gives the run count and the levels' starts."""
    first = history.first if runs is None else 0
    width = max(1, -(-(history.count - first) // BUCKETS))
    starts = level_starts(history)
    hosts: dict[str, int] = {}
    table: list[list[str | int]] = []
    series: dict[str, dict[str, _Series | _Steps]] = {}
    seen: dict[str, int] = {}  # the last run that had each test
    stored = compact(history.runs) if runs is None else runs
    for number, run in enumerate(stored, first):
        table.append([run.commit[:12], run.time, hosts.setdefault(run.host, len(hosts))])
        for nodeid, values in run.tests.items():
            seen[nodeid] = number
            held = series.setdefault(nodeid, {})
            for name, value in values.items():
                kept = held.get(name)
                if kept is None:
                    spec = metric(name)
                    counted = spec is not None and spec.counted
                    kept = held[name] = _Steps() if counted else _Series(starts.get((nodeid, name), ()), width)
                kept.add(number, value)
    tests = []
    for nodeid, names in sorted(series.items()):
        charts, steady = [], {}
        for name in sorted(names, key=_first):
            kept = names[name]
            if isinstance(kept, _Steps):
                if len(kept.changes) == 1:
                    steady[name] = kept.changes[0][1]
                else:
                    charts.append(kept.chart(name, seen[nodeid], width))
            elif name != DEVICE_TIME and not kept.moved:
                steady[name] = kept.buckets[0][4]
            else:
                charts.append(kept.chart(name))
        tests.append({"id": nodeid, "charts": charts, "steady": steady})
    link = web.commit("0" * 40) if web is not None else None
    return {
        "device": history.device,
        "first": first,
        "runs": table,
        "hosts": list(hosts),
        "commit_url": link.removesuffix("0" * 40) if link else "",
        "tests": tests,
        "time_metric": DEVICE_TIME,
    }


def model_page(
    history: History, web: RepositoryWeb | None = None, index: str | None = None, runs: Iterable[Run] | None = None
) -> str:
    """One GPU model's page from ``runs`` (:func:`data`); ``index``: the name of the models' index beside it,
    linked at its top."""
    found = data(history, runs, web)
    table = found["runs"]
    held = f"{plural(history.count, 'run')} on {plural(len(history.hosts), 'host')}"
    when = f", {table[0][1]} to {table[-1][1]}" if table else ""
    back = f'<p><a href="{html.escape(index)}">all GPU models</a></p>' if index else ""
    payload = json.dumps(found, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    return "\n".join(
        [
            "<!doctype html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>syncguard history: {html.escape(history.device)}</title>",
            f"<style>{_UPLOT_STYLE}{_STYLE}</style>",
            "</head><body>",
            back,
            f"<h1>{html.escape(history.device)}</h1>",
            f"<p>{html.escape(held + when)}. Each chart: every run of the default branch in buckets (the bar: the "
            "bucket's lowest to highest value, the dot: its last run), the level each run was judged against (its "
            "median, a stepped line), the newest run last. Drag across a chart to zoom into its runs, double-click to "
            "zoom out; hover for the runs, click for the commit.</p>",
            '<p><input id="search" type="search" placeholder="search tests" size="60"> <span id="shown"></span></p>',
            '<table id="index"><thead><tr><th>test</th><th>device time, last run</th><th>levels</th></tr></thead>'
            "<tbody></tbody></table>",
            '<div id="tests"></div><div id="tip" hidden></div>',
            f'<script type="application/json" id="data">{payload}</script>',
            f"<!-- uPlot {UPLOT_VERSION}, MIT license (c) Leon Sorokin: https://github.com/leeoniya/uPlot -->",
            f"<script>{_UPLOT}</script>",
            f"<script>{_SCRIPT}</script>",
            "</body></html>",
        ]
    )


def index_page(histories: Sequence[History], names: Sequence[str]) -> str:
    """The models' index: per GPU model, its runs, hosts and dates, and a link to its page (``names``, in order)."""
    rows = []
    for history, name in zip(histories, names, strict=True):
        when = history.runs[-1].time if history.runs else history.before.last_run[1] if history.before else ""
        held = f"{plural(history.count, 'run')} on {plural(len(history.hosts), 'host')}"
        rows.append(
            f'<tr><td><a href="{html.escape(name)}">{html.escape(history.device)}</a></td>'
            f"<td>{html.escape(held)}</td><td>{html.escape(when)}</td></tr>"
        )
    return "\n".join(
        [
            "<!doctype html>",
            '<html lang="en"><head><meta charset="utf-8"><title>syncguard history</title>',
            f"<style>{_STYLE}</style></head><body>",
            "<h1>syncguard history</h1>",
            "<table><thead><tr><th>GPU model</th><th>runs</th><th>last run</th></tr></thead><tbody>",
            *rows,
            "</tbody></table></body></html>",
        ]
    )


def page_names(index: str, devices: Sequence[str]) -> list[str]:
    """The files :func:`pages` writes beside the index named ``index`` (``NAME.html``): one per GPU model,
    ``NAME.<slug>.html``, in ``devices``' order, then the index."""
    stem = index.removesuffix(".html")
    return [*(f"{stem}.{device}.html" for device in devices), index]


def pages(
    histories: Sequence[tuple[History, Iterable[Run]]], index: str, web: RepositoryWeb | None = None
) -> Iterator[PageFile]:
    """One page per GPU model (``NAME.<slug>.html``), each from its history and every run of it, streamed, then
    the models' index that links them, named ``index`` (``NAME.html``): :func:`page_names`."""
    names = page_names(index, [history.device for history, _ in histories])[:-1]
    for (history, runs), name in zip(histories, names, strict=True):
        yield PageFile(name, model_page(history, web, index, runs))
    yield PageFile(index, index_page([history for history, _ in histories], names))


def _first(name: str) -> tuple[int, str]:
    """Device time first, then the rest by name."""
    return (name != DEVICE_TIME, name)


_STYLE = (
    "body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;font-size:13px}"
    "td,th{padding:2px 8px;text-align:left;border-bottom:1px solid #eee}h2{font-size:15px;margin:1.5em 0 .3em}"
    "figure{display:inline-block;margin:0 12px 8px 0;vertical-align:top}figcaption{font-size:12px}"
    ".chart{width:520px;height:220px;border:1px solid #ddd}"
    "#tip{position:fixed;background:#fff;border:1px solid #888;padding:4px 6px;font-size:12px;pointer-events:none;"
    "white-space:pre}#index{max-height:40vh;overflow:auto;display:block}"
)

#: The page's script: the index, the search, and each chart drawn when it scrolls into view.
_SCRIPT = Path(__file__).with_name("page.js").read_text(encoding="utf-8")
#: The chart library, vendored and pinned (render/vendor/README.md says from where and how to update it).
UPLOT_VERSION = "1.6.32"
_VENDOR = Path(__file__).with_name("vendor")
_UPLOT = (_VENDOR / "uPlot.iife.min.js").read_text(encoding="utf-8")
_UPLOT_STYLE = (_VENDOR / "uPlot.min.css").read_text(encoding="utf-8")
