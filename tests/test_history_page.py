"""The history page at a history's age: each chart a bounded number of buckets that never span a level's start and
keep every run's extreme, the levels the level rule found, and the levels' starts the record keeps equal to a replay
of every run. Runs made from the H100 suite's real results (tests/data/h100_pr/unchanged.json.gz)."""

from __future__ import annotations

import gzip
import json
import random
import re
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_syncguard.document import file as results_file
from pytest_syncguard.document.measured import MeasuredTest
from pytest_syncguard.judge import history
from pytest_syncguard.judge.history import History, Run
from pytest_syncguard.metrics import DEVICE_TIME, Metrics
from pytest_syncguard.render.page import BUCKETS, data, model_page

DATA = Path(__file__).parent / "data" / "h100_pr" / "unchanged.json.gz"
GRAPH = "examples/test_strategies.py::test_speed[cuda_graph]"
HOSTS = ("a9dc0a68", "c3cd64c4", "56c4121f", "8423f385")


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> list[MeasuredTest]:
    path = tmp_path_factory.mktemp("suite") / "unchanged.json"
    path.write_bytes(gzip.decompress(DATA.read_bytes()))
    return results_file.read(path)


def _runs(suite: list[MeasuredTest], count: int, step_at: int, glitch_at: int) -> list[Run]:
    """``count`` runs of the suite: device time +3% from run ``step_at`` (a change merged on purpose), +40% in run
    ``glitch_at`` alone, 0.2% noise."""
    base = history.run_of(suite, "0" * 40, "t")
    rng = random.Random(1)
    runs = []
    for n in range(count):
        factor = (1.03 if n >= step_at else 1.0) * (1.4 if n == glitch_at else 1.0)
        tests = {
            nodeid: {k: v * factor * (1 + rng.gauss(0, 0.002)) if k == DEVICE_TIME else v for k, v in values.items()}
            for nodeid, values in base.tests.items()
        }
        if n >= count * 7 // 15:  # a count that moved once: 1 sync more per step
            tests[GRAPH] = {**tests[GRAPH], "syncs": tests[GRAPH]["syncs"] + 100}
        runs.append(Run(f"{n:040x}", f"2026-{1 + n // 600:02d}-01T{n % 24:02d}:00:00Z", HOSTS[n % 4], tests))
    return runs


def _rows(chart: dict[str, Any]) -> list[list[float]]:
    """A chart's buckets as ``[first run, last run, lowest, highest, last value]``, decoded as the page's script
    decodes them."""
    rows, first = [], chart["first"]
    for end, *steps in zip(chart["ends"], chart["lo"], chart["hi"], chart["last"], strict=True):
        rows.append([first, end, *(chart["base"] + q * chart["step"] for q in steps)])
        first = end + 1
    return rows


def test_a_long_history_is_drawn_in_bounded_buckets_within_its_levels(suite: list[MeasuredTest]) -> None:
    """1,500 runs with a glitch at run 400 and a merged +3% step at run 1,000: each chart at most BUCKETS buckets,
    none across the step; the glitch is its bucket's highest value; the device time's levels are the two the rule
    found (the glitch none), each with its runs' median."""
    runs = _runs(suite, 1500, step_at=1000, glitch_at=400)
    found = data(History("nvidia-h100-80gb-hbm3", tuple(runs)))
    (graph,) = [t for t in found["tests"] if t["id"] == GRAPH]
    (chart,) = [c for c in graph["charts"] if c["metric"] == DEVICE_TIME]
    buckets = _rows(chart)
    assert chart["runs"] == 1500 and len(buckets) <= BUCKETS
    assert all(b[0] >= 1000 or b[1] < 1000 for b in buckets), "a bucket spans the level's start"
    assert buckets[0][0] == 0 and buckets[-1][1] == 1499
    values = [run.tests[GRAPH][DEVICE_TIME] for run in runs]
    glitch = next(b for b in buckets if b[0] <= 400 <= b[1])
    assert glitch[3] == pytest.approx(values[400], rel=1e-4) and glitch[3] == pytest.approx(max(values), rel=1e-4)
    for first, last, low, high, end in buckets:  # within a ten-thousandth of the chart's range
        held = values[int(first) : int(last) + 1]
        assert (low, high, end) == pytest.approx((min(held), max(held), held[-1]), abs=chart["step"])
    assert [level[:2] for level in chart["levels"]] == [[0, 999], [1000, 1499]]
    assert chart["levels"][1][2] == pytest.approx(statistics.median(values[1000:]), rel=1e-4)
    others = [t for t in found["tests"] if t["id"] != GRAPH]
    assert all(set(t["steady"]) and all(c["metric"] != "syncs" for c in t["charts"]) for t in others)
    (syncs,) = [c for c in graph["charts"] if c["metric"] == "syncs"]  # the count that moved at run 700, as steps
    steps = _rows(syncs)
    assert len(steps) <= BUCKETS and steps[0][0] == 0 and steps[-1][1] == 1499 and not syncs["levels"]
    before, after = runs[0].tests[GRAPH]["syncs"], runs[-1].tests[GRAPH]["syncs"]
    moved = next(b for b in steps if b[0] <= 700 <= b[1])
    assert moved[2:] == pytest.approx([before, after, after]) and steps[0][2:] == pytest.approx([before] * 3)
    assert all(b[2:] == pytest.approx([after] * 3) for b in steps if b[0] > 700)
    text = model_page(History("nvidia-h100-80gb-hbm3", tuple(runs)))
    payload = re.search(r'<script type="application/json" id="data">(.*?)</script>', text, re.S)
    assert payload is not None and json.loads(payload.group(1)) == found
    from pytest_syncguard.render.page import _UPLOT, _UPLOT_STYLE

    library = len((_UPLOT + _UPLOT_STYLE).encode())  # the chart library, the same 53 kB in every page
    assert len(text.encode()) - library < 100 * len(runs)  # runs' commits, times, hosts; a bounded chart per test


def test_the_level_starts_a_record_keeps_are_those_of_a_replay_of_every_run(
    tmp_path: Path, suite: list[MeasuredTest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recorded push by push in segments of 10, the levels' starts in the latest state are those a replay of every
    run from the first finds: the step's, not the glitch's."""
    monkeypatch.setattr(history, "SEGMENT", 10)
    for run in _runs(suite, 45, step_at=30, glitch_at=12):
        scaled = [
            replace(t, metrics=Metrics(run.tests[t.nodeid], dict(t.metrics.runs)), host=run.host)
            for t in suite
            if t.nodeid in run.tests
        ]
        history.record(tmp_path, scaled, run.commit, run.time)
    kept = history.read(tmp_path, "nvidia-h100-80gb-hbm3", every_run=True)
    assert kept is not None and kept.latest is not None and kept.count == 45
    by_record = history.level_starts(kept)
    by_replay = history.level_starts(History(kept.device, kept.runs))
    assert by_record == by_replay and by_record[(GRAPH, DEVICE_TIME)] == [0, 30]
    # The page streams the closed segments one at a time beside the window a report reads: the same page.
    window = history.read(tmp_path, "nvidia-h100-80gb-hbm3")
    assert window is not None and window.first == 40
    assert data(window, history.every_run(tmp_path, window, filled=False)) == data(kept)
    (tmp_path / "nvidia-h100-80gb-hbm3.000010.jsonl").unlink()
    with pytest.raises(history.HistoryError, match=r"000020\.jsonl: holds runs from 20, after 10 runs"):
        data(window, history.every_run(tmp_path, window, filled=False))


def test_the_page_carries_its_chart_library_pinned_and_licensed(suite: list[MeasuredTest]) -> None:
    """uPlot is vendored at one version (render/vendor/README.md says from where), its license beside it and named in
    each page, which carries the library inline (one file, no network)."""
    from pytest_syncguard.render import page

    vendor = Path(page.__file__).with_name("vendor")
    script = (vendor / "uPlot.iife.min.js").read_text()
    assert script.startswith(f"/*! https://github.com/leeoniya/uPlot (v{page.UPLOT_VERSION}) */")
    assert f"uPlot {page.UPLOT_VERSION}" in (vendor / "README.md").read_text()
    assert (vendor / "LICENSE.uPlot").read_text().startswith("The MIT License (MIT)")
    text = model_page(History("nvidia-h100-80gb-hbm3", tuple(_runs(suite, 30, step_at=20, glitch_at=5))))
    assert f"<!-- uPlot {page.UPLOT_VERSION}, MIT license (c) Leon Sorokin" in text and script in text
