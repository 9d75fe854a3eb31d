"""The judged timeline as a Perfetto file: real H100 timelines of both sources (a capture's trace, PM samples)
written, checked against the Trace Event Format, and read back by ``syncguard trace`` to the numbers judged."""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_syncguard.analysis import gaps, sampled, trace_file
from pytest_syncguard.analysis.gaps import Timeline
from pytest_syncguard.budgets import GuardOptions
from pytest_syncguard.capture import CallCapture
from pytest_syncguard.document.budget import Budget
from pytest_syncguard.document.measured import MeasuredTest
from pytest_syncguard.guard import SyncGuard
from pytest_syncguard.instruments import Traced
from pytest_syncguard.measurement import Measurement
from pytest_syncguard.render import perfetto
from pytest_syncguard.render.terminal import failure_text
from pytest_syncguard.timeline_source import TRACE, TimelineSource

DATA = Path(__file__).parent / "data"
#: The phases of the Trace Event Format (Google's "Trace Event Format" document) that a timeline file may use,
#: with the keys each must have.
PHASES = {"X": ("ts", "dur", "tid"), "C": ("ts", "args"), "i": ("ts", "s", "tid"), "M": ("args",)}
METADATA = {"process_name": "name", "process_sort_index": "sort_index", "thread_name": "name"}


def check_trace_event_format(data: dict[str, Any]) -> None:
    """The JSON Object Format: ``traceEvents`` a list of events, each with a known phase and the keys it needs;
    times in microseconds, non-negative; counter values numbers; instant scopes g, p or t; metadata named."""
    assert isinstance(data["traceEvents"], list) and data["traceEvents"]
    assert data.get("displayTimeUnit") in (None, "ms", "ns")
    for event in data["traceEvents"]:
        phase = event["ph"]
        assert phase in PHASES, event
        assert isinstance(event["name"], str) and event["name"], event
        assert isinstance(event["pid"], int) and isinstance(event.get("tid", 0), int), event
        assert all(key in event for key in PHASES[phase]), event
        if phase != "M":
            assert isinstance(event["ts"], (int, float)) and math.isfinite(event["ts"]) and event["ts"] >= 0, event
        if phase == "X":
            assert isinstance(event["dur"], (int, float)) and event["dur"] >= 0, event
        if phase == "C":
            assert all(isinstance(v, (int, float)) for v in event["args"].values()), event
        if phase == "i":
            assert event["s"] in ("g", "p", "t"), event
        if phase == "M":
            assert METADATA[event["name"]] in event["args"], event
        if "args" in event:
            assert isinstance(event["args"], dict), event


def _trace_timeline() -> Timeline:
    """The judged timeline of a real capture: 12 eager steps marked by region.step(), a .item() in each."""
    trace = trace_file.load(str(DATA / "capture_marked_steps.trace.json.gz"))
    (window,) = gaps.regions(trace).values()
    found = gaps.analyze(trace, window=window, warmup_steps=2)
    assert found is not None
    return found


def _sampled_timeline() -> Timeline:
    """The judged timeline of real PM samples (kv_cache on an H100), with two syncs stamped inside it."""
    with gzip.open(DATA / "sampled" / "h100_kv_cache.json.gz", "rt") as source:
        data = json.load(source)
    fractions = sampled.active_fractions([v[0] for v in data["values"]], [v[1] for v in data["values"]])
    found = sampled.analyze(data["start_ns"], data["end_ns"], fractions)
    origin = found.origin_ns
    return found.timeline(syncs=[(origin + 10_000, "scalar read at loop.py:3 in step"), (origin - 5_000, "before it")])


@pytest.mark.parametrize("source", ["trace", "sampled"])
def test_a_judged_timeline_is_a_trace_event_file_that_reads_back_to_its_numbers(source: str, tmp_path: Path) -> None:
    timeline = _trace_timeline() if source == "trace" else _sampled_timeline()
    assert len(timeline.runs) == len(timeline.gaps_us) + 1 and timeline.gaps_us
    assert sum(r.busy for r in timeline.runs) == pytest.approx(timeline.busy_us, rel=1e-12)
    path = perfetto.write(tmp_path / f"t{perfetto.SUFFIX}", "test_x.py::test_loop", source,
                          [perfetto.Region(1, timeline, shown=True)])  # fmt: skip
    data = json.loads(gzip.decompress(path.read_bytes()))
    check_trace_event_format(data)
    assert next(iter(data)) == perfetto.KEY and perfetto.is_timeline_file(path)
    events = data["traceEvents"]
    gap_slices = [e for e in events if e.get("cat") == "gap"]
    assert len(gap_slices) == len(timeline.gaps_us)  # every judged gap is drawn, none dropped
    assert {e["args"]["cause"] for e in gap_slices} >= {g.cause for g in timeline.top_gaps}
    attributed = [e for e in gap_slices if e["args"]["cause"] != perfetto.NOT_ATTRIBUTED]
    assert len(attributed) == len(timeline.top_gaps)
    steps = [e for e in events if e.get("cat") == "step"]
    instants = [e for e in events if e["ph"] == "i"]
    if source == "trace":
        assert timeline.steps_from == gaps.MARKED_STEPS and len(steps) == timeline.judged_steps == 10
        assert {e["args"]["cause"] for e in attributed} <= {gaps.HOST_SYNC, gaps.LAUNCH_BOUND, gaps.OTHER}
        # The .item() of each judged step, with its call site; the 2 warm-up steps' syncs are left out.
        assert len(instants) == 10 and all("capture_traces.py:128 in capture_loops" in e["name"] for e in instants)
    else:
        # The sync stamped 10 us in returned inside the widest gap, which it made; the others are idle.
        widest = max(attributed, key=lambda e: e["dur"])
        assert steps == [] and widest["args"]["cause"] == gaps.HOST_SYNC
        assert {e["args"]["cause"] for e in attributed if e is not widest} == {sampled.IDLE}
        assert [e["name"] for e in instants] == ["scalar read at loop.py:3 in step"]  # the one inside the region
    # Read back from the drawn events alone: the same judged numbers.
    meta, (region,) = perfetto.load(path)
    back = region.timeline
    assert (meta["source"], meta["nodeid"], region.shown) == (source, "test_x.py::test_loop", True)
    assert back.gaps_us == pytest.approx(timeline.gaps_us, abs=1e-6)
    assert back.busy_us == pytest.approx(timeline.busy_us, rel=1e-9)
    assert back.span_us == pytest.approx(timeline.span_us, rel=1e-9)
    for stat in ("max", "p99", "p50"):
        assert back.gap_stat(stat) == pytest.approx(timeline.gap_stat(stat), abs=1e-6)
    assert [(g.cause, g.detail) for g in back.top_gaps] == [(g.cause, g.detail) for g in timeline.top_gaps]
    assert (back.steps, back.judged_steps, back.steps_from) == (timeline.steps, timeline.judged_steps,
                                                                timeline.steps_from)  # fmt: skip
    # And through the command, as a user would.
    done = subprocess.run([sys.executable, "-m", "pytest_syncguard.gate.cli", "trace", str(path), "--json"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    (shown,) = json.loads(done.stdout)["regions"]
    assert shown["busy_fraction"] == pytest.approx(timeline.busy_fraction, abs=1e-5)
    assert shown["max_gap_us"] == pytest.approx(timeline.gap_stat("max"), abs=1e-5)
    assert shown["p99_gap_us"] == pytest.approx(timeline.gap_stat("p99"), abs=1e-5)
    assert shown["gaps"] == len(timeline.gaps_us)
    text = subprocess.run([sys.executable, "-m", "pytest_syncguard.gate.cli", "trace", str(path)], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    assert f"max gap {timeline.gap_stat('max'):.1f} us, p99 gap {timeline.gap_stat('p99'):.1f} us" in text
    assert f"({source} source)" in text


def test_a_profiler_trace_is_not_taken_for_a_timeline_file_and_a_broken_one_is_named(tmp_path: Path) -> None:
    assert not perfetto.is_timeline_file(DATA / "capture_marked_steps.trace.json.gz")
    newer = tmp_path / f"newer{perfetto.SUFFIX}"
    newer.write_bytes(gzip.compress(json.dumps({perfetto.KEY: {"schema": perfetto.SCHEMA, "schema_version": 99},
                                                "traceEvents": []}).encode()))  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "pytest_syncguard.gate.cli", "trace", str(newer)], capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 2 and f"{newer}: timeline schema 'pytest-syncguard/timeline' version 99" in done.stderr
    cut = tmp_path / f"cut{perfetto.SUFFIX}"
    cut.write_text('{"syncguardTimeline": {"schema": ')
    done = subprocess.run([sys.executable, "-m", "pytest_syncguard.gate.cli", "trace", str(cut)], capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 2 and f"{cut}: not a readable syncguard timeline" in done.stderr


def _captured(tmp_path: Path, budgets: list[Budget], files: perfetto.TimelineFiles) -> MeasuredTest:
    """The plugin's result of a test whose call the real capture of 12 marked steps recorded."""
    with gzip.open(DATA / "capture_marked_steps.trace.json.gz", "rt") as source:
        found = json.load(source)
    path = tmp_path / "capture.trace.json"
    path.write_text(json.dumps(found))
    (number,) = gaps.regions(trace_file.load(str(path)))
    guard = SyncGuard("test_x.py::test_loop", device="cuda")
    guard.measurements = [Measurement("cuda", 12, (), region_numbers=(number,), count_parts=((number,),))]
    instrument = Traced(TimelineSource(TRACE, "the test's"), [path])
    capture = CallCapture("test_x.py::test_loop", guard, budgets, GuardOptions(warmup_steps=2), instrument)
    result = capture.result(raised=None, require_gpu=False, store=None, artifacts=None, timelines=files)
    assert result is not None
    return result


def test_a_test_that_breaks_a_gap_budget_keeps_its_judged_timeline_and_its_failure_names_it(tmp_path: Path) -> None:
    folder = tmp_path / "timelines"
    result = _captured(tmp_path, [Budget("max_gpu_idle_us", 1.0)], perfetto.TimelineFiles(lambda: folder))
    assert result.failed and result.broke("timeline")
    (kept,) = result.artifacts
    assert kept == str(folder / f"test_x.py_test_loop{perfetto.SUFFIX}")
    assert f"syncguard: judged timeline {kept} (open in ui.perfetto.dev" in failure_text(result)
    _, (region,) = perfetto.load(Path(kept))
    assert region.shown
    # The judged metrics, to the precision they are stored with.
    assert region.timeline.gap_stat("max") == pytest.approx(result.metrics["max_gap_us"], abs=0.005)
    assert region.timeline.gap_stat("p99") == pytest.approx(result.metrics["p99_gap_us"], abs=0.005)
    assert region.timeline.busy_fraction == pytest.approx(result.metrics["busy_fraction"], abs=5e-5)
    # A test within its budgets keeps none, unless every test's is asked for.
    passing = [Budget("max_gpu_idle_us", 1e9)]
    assert _captured(tmp_path, passing, perfetto.TimelineFiles(lambda: tmp_path / "none")).artifacts == ()
    assert not (tmp_path / "none").exists()
    every = _captured(tmp_path, passing, perfetto.TimelineFiles(lambda: tmp_path / "all", every=True))
    assert [Path(p).parent for p in every.artifacts] == [tmp_path / "all"]
