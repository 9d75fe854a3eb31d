"""The gate's judgement of device time: measured in a measure()'s counting run from the kernels' own records (a
real H100 trace), judged against a baseline within the tolerance its recorded history calibrates, that history
kept, bounded, restarted and reset; and the A/B that stops each test once its verdict is settled."""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from pytest_syncguard.analysis import gaps, trace_file
from pytest_syncguard.budgets import GuardOptions
from pytest_syncguard.capture import CallCapture
from pytest_syncguard.document.ab import INCONCLUSIVE, REGRESSION, UNCHANGED, ABReport
from pytest_syncguard.document.comparison import Spread
from pytest_syncguard.document.measured import MeasuredTest
from pytest_syncguard.gate.ab.plan import _head_against_base, compare_sides
from pytest_syncguard.gate.ab.stats import judge
from pytest_syncguard.gate.cli import main
from pytest_syncguard.guard import SyncGuard
from pytest_syncguard.instruments import CountingRuns
from pytest_syncguard.judge.baselines import HISTORY_LIMIT, Recording, read, reset_history, spread_of, update
from pytest_syncguard.judge.comparison import SPREAD_DEVIATIONS, calibrated_tolerance, compare
from pytest_syncguard.measurement import Measurement
from pytest_syncguard.metrics import DEVICE_TIME, METRICS, Metrics
from pytest_syncguard.render.ab import summary_lines

DATA = Path(__file__).parent / "data"
H100 = "nvidia-h100-80gb-hbm3"


def _events(name: str) -> list[dict[str, Any]]:
    with gzip.open(DATA / f"{name}.trace.json.gz", "rt") as source:
        return list(json.load(source)["traceEvents"])


def _union_us(intervals: list[tuple[float, float]]) -> float:
    """Busy time of the intervals (µs), an idle stretch under a microsecond counted busy (the one definition)."""
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b > end:
            total += b - (a if a - end >= 1.0 else end)
            end = b
    return total


@pytest.mark.parametrize("name", ["capture_graph_steps", "capture_marked_steps"])
def test_device_time_of_a_counting_run_is_the_union_of_its_kernels_records(tmp_path: Path, name: str) -> None:
    """A counting run traced on its own (a real H100 capture): its device time per step is the union of the
    device ops' own intervals in its judged steps, counted here from the raw events."""
    found = _events(name)
    path = tmp_path / "counting.trace.json"
    path.write_text(json.dumps({"traceEvents": found}))
    trace = trace_file.from_events(found)
    ((number, window),) = gaps.regions(trace).items()
    capture = CallCapture("t", SyncGuard("t"), (), GuardOptions(warmup_steps=2), CountingRuns(trace_files=[path]))
    # The counting run is not one of the timed regions: only its part's.
    measurement = capture.with_timelines(Measurement("cuda", 12, (), count_parts=((number,),)))
    (time,) = measurement.device_times.values()
    assert (time.steps, time.judged_steps) == (12, 10)
    # The truth: the kernels and device-to-device copies launched after the third step began, merged; host copies
    # and memsets are no busy time.
    starts, _ = gaps.step_starts(trace, window)
    device = [e for e in found if e.get("ph") == "X" and (e.get("cat") == "kernel" or (
        e.get("cat") == "gpu_memcpy" and "DtoD" in str(e.get("name"))))]  # fmt: skip
    launches = {c.correlation: c.start for c in trace.host_calls if c.correlation is not None}
    judged = [
        (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in device
        if launches.get(e.get("args", {}).get("correlation"), float(e["ts"])) >= starts[2]
        and launches.get(e.get("args", {}).get("correlation"), float(e["ts"])) <= window[1]
    ]
    assert time.busy_us == pytest.approx(_union_us(judged), rel=1e-6)
    assert measurement.device_us_per_token() == [pytest.approx(time.busy_us / 10)]
    assert Metrics.of(measurement).runs[DEVICE_TIME] == 1
    assert measurement.count("launches") is not None  # its device work is counted too
    assert measurement.timelines == ()  # a counting run is no judged timeline


def test_a_counting_run_in_which_a_child_process_ran_has_no_device_time_or_work_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace records the test's process alone: where a child of the test ran in the region (here one still running,
    its file in the test's folder), the region's device time and device-work counts would miss its kernels, so it
    has none, and the reason names the child."""
    from pytest_syncguard.probes import children

    found = _events("capture_marked_steps")
    path = tmp_path / "counting.trace.json"
    path.write_text(json.dumps({"traceEvents": found}))
    ((number, _),) = gaps.regions(trace_file.from_events(found)).items()
    folder = tmp_path / "children"
    folder.mkdir()
    monkeypatch.setenv(children.FOLDER_VARIABLE, str(folder))
    monkeypatch.setenv(children.OWNER_VARIABLE, str(os.getpid()))
    header = {"pid": os.getpid(), "ppid": 1, "argv": ["python", "engine.py"], "t": 1}  # alive: this process
    (folder / f"{os.getpid()}.jsonl").write_text(json.dumps(header) + "\n")
    instrument = CountingRuns(trace_files=[path])
    try:
        instrument.ended(number, (10, 20))
    finally:
        children._FILES.pop(folder / f"{os.getpid()}.jsonl", None)
        children.forget()
    capture = CallCapture("t", SyncGuard("t"), (), GuardOptions(warmup_steps=2), instrument)
    measurement = capture.with_timelines(Measurement("cuda", 12, (), count_parts=((number,),)))
    assert measurement.device_times == {} and measurement.count("launches") is None
    why = measurement.uncounted("launches") or ""
    assert "records the GPU work of the test's process alone" in why and "(python engine.py)" in why, why


def test_a_calibrated_tolerance_is_the_recordings_spread_never_below_the_metrics_floor() -> None:
    spec = METRICS[DEVICE_TIME]
    assert spec.min_tolerance is not None and spec.tolerance == 0.05
    assert calibrated_tolerance(DEVICE_TIME, None) is None
    assert calibrated_tolerance(DEVICE_TIME, Spread(1, 1, None)) is None  # one recording: the metric's own 5%
    assert calibrated_tolerance(DEVICE_TIME, Spread(4, 1, 0.0003)) == spec.min_tolerance  # one quiet host
    wide = calibrated_tolerance(DEVICE_TIME, Spread(4, 3, 0.005))
    assert wide == pytest.approx(SPREAD_DEVIATIONS * 0.005 * math.sqrt(1 + 1 / 4))
    assert calibrated_tolerance("busy_fraction", Spread(4, 1, 0.1)) is None  # a host timing keeps no history
    # The allocator's numbers keep one too: a loop whose reserved peak differs by host (1020 or 1062 MiB) is
    # judged within what its recordings showed.
    assert calibrated_tolerance("reserved_mb", Spread(3, 3, 0.023)) == pytest.approx(4 * 0.023 * math.sqrt(4 / 3))


def _compared(old: float, new: float, spread: Spread | None, runs: int = 1) -> tuple[str, str]:
    metrics = Metrics({DEVICE_TIME: new}, {DEVICE_TIME: runs})
    spreads = {DEVICE_TIME: spread} if spread else {}
    comparison = compare({DEVICE_TIME: old}, metrics, device=H100, file="b.json", tolerance=None, spreads=spreads)
    (change,) = comparison.changes
    return change.status, change.describe()


def test_device_time_is_judged_within_its_recorded_spread() -> None:
    quiet = Spread(3, 2, 0.002)  # 4 * 0.2% * sqrt(4/3) = 0.92%: the 1.5% floor holds
    assert _compared(2000.0, 2060.0, quiet) == (
        "regression",
        f"{DEVICE_TIME} 2000 us -> 2060 us (+60 us, +3.0%; tolerance 1.5%: spread ±0.20% over 3 recordings on 2 hosts)",
    )
    assert _compared(2000.0, 2020.0, quiet)[0] == "unchanged"
    assert _compared(2000.0, 1940.0, quiet)[0] == "improvement"
    assert _compared(2000.0, 2060.0, Spread(3, 3, 0.01))[0] == "unchanged"  # a noisy history: 4.6%
    # Uncalibrated (one recording): the metric's own 5%, and only for a value of at least 3 runs.
    assert _compared(2000.0, 2060.0, Spread(1, 1, None), runs=5)[0] == "unchanged"
    assert _compared(2000.0, 2200.0, Spread(1, 1, None), runs=5)[0] == "regression"
    assert _compared(2000.0, 2200.0, Spread(1, 1, None), runs=1)[0] == "not compared"


def test_an_update_appends_to_the_history_restarts_it_when_the_value_moved_and_keeps_it_bounded(
    tmp_path: Path,
) -> None:
    path = tmp_path / f"{H100}.json"
    fingerprint = {"device_name": "NVIDIA H100 80GB HBM3"}
    # One recording calibrates no tolerance: a second joins it however far it lies (4% here).
    update(path, H100, {"t::m": {"reserved_mb": 1062.0}}, fingerprint, host="aaaa")
    assert update(path, H100, {"t::m": {"reserved_mb": 1020.0}}, fingerprint, host="bbbb").restarted == []
    for value, host in [(2000.0, "aaaa"), (2004.0, "bbbb"), (1998.0, "cccc")]:
        update(path, H100, {"t::a": {"syncs": 1, DEVICE_TIME: value, "seconds": 0.3}}, fingerprint, host=host)
    baseline = read(path)
    assert baseline is not None
    assert baseline.tests["t::m"]["reserved_mb"] == 1041.0 and len(baseline.history["t::m"]["reserved_mb"]) == 2
    assert baseline.tests["t::a"][DEVICE_TIME] == 2000.0  # the median of the recordings
    assert baseline.history["t::a"] == {DEVICE_TIME: (Recording(2000.0, "aaaa"), Recording(2004.0, "bbbb"),
                                                      Recording(1998.0, "cccc"))}  # fmt: skip
    spread = baseline.spreads("t::a")[DEVICE_TIME]
    assert (spread.recordings, spread.hosts) == (3, 3)
    # 6% more, once: beyond the level's tolerance, an outlier kept aside and out of its statistics.
    written = update(path, H100, {"t::a": {"syncs": 1, DEVICE_TIME: 2120.0}}, fingerprint, host="aaaa")
    baseline = read(path)
    assert written.restarted == [] and baseline is not None and len(baseline.history["t::a"][DEVICE_TIME]) == 4
    assert baseline.tests["t::a"][DEVICE_TIME] == 2000.0 and baseline.spreads("t::a")[DEVICE_TIME].recordings == 3
    # A second run beyond, on the same side: still outliers (two glitches in a row start no level).
    written = update(path, H100, {"t::a": {"syncs": 1, DEVICE_TIME: 2118.0}}, fingerprint, host="bbbb")
    assert written.restarted == []
    # A third: the code changed; the three start a new level.
    written = update(path, H100, {"t::a": {"syncs": 1, DEVICE_TIME: 2121.0}}, fingerprint, host="cccc")
    assert written.restarted == [f"t::a: {DEVICE_TIME}"]
    baseline = read(path)
    assert baseline is not None
    assert baseline.history["t::a"][DEVICE_TIME] == (Recording(2120.0, "aaaa"), Recording(2118.0, "bbbb"),
                                                     Recording(2121.0, "cccc"))  # fmt: skip
    # A run back within the old level after two outliers drops them: the level is as it was.
    for value in (2300.0, 2310.0, 2119.0):
        update(path, H100, {"t::a": {"syncs": 1, DEVICE_TIME: value}}, fingerprint, host="dddd")
    baseline = read(path)
    assert baseline is not None and len(baseline.history["t::a"][DEVICE_TIME]) == 4
    assert baseline.tests["t::a"][DEVICE_TIME] == 2119.5
    for i in range(HISTORY_LIMIT + 2):
        update(path, H100, {"t::a": {"syncs": 1, DEVICE_TIME: 2120.0 + i % 3}}, fingerprint, host="dddd")
    baseline = read(path)
    assert baseline is not None and len(baseline.history["t::a"][DEVICE_TIME]) == HISTORY_LIMIT


def test_a_maintainer_sees_and_resets_the_history(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / f"{H100}.json"
    for value, host in [(2000.0, "aaaa"), (2010.0, "bbbb")]:
        update(path, H100, {"t::a": {DEVICE_TIME: value}, "t::b": {DEVICE_TIME: 500.0}}, {}, host=host)
    assert main(["baselines", str(path)]) == 0
    shown = capsys.readouterr().out
    assert f"    {DEVICE_TIME} history: 2000 us (aaaa), 2010 us (bbbb); spread ±0.35% over 2 recordings on 2 hosts: " \
        "tolerance 1.7%" in shown  # fmt: skip
    assert main(["baselines", str(path), "--reset-history", "t::nope"]) == 2
    assert "no entry for t::nope" in capsys.readouterr().err
    assert main(["baselines", str(path), "--reset-history", "t::a"]) == 0
    baseline = read(path)
    assert baseline is not None and set(baseline.history) == {"t::b"}
    assert baseline.tests["t::a"][DEVICE_TIME] == 2005.0  # the value stays
    assert reset_history(path) == 1
    baseline = read(path)
    assert baseline is not None and baseline.history == {}


def test_a_version_2_baseline_reads_with_no_history(tmp_path: Path) -> None:
    path = tmp_path / f"{H100}.json"
    path.write_bytes(gzip.decompress((DATA / "h100_results" / "baselines" / f"{H100}.json.gz").read_bytes()))
    assert json.loads(path.read_text())["schema_version"] == 2
    baseline = read(path)
    assert baseline is not None and baseline.history == {} and baseline.spreads("x") == {}
    assert len(baseline.tests) == 17
    assert spread_of([Recording(1.0), Recording(3.0)]).relative_sd == pytest.approx(math.sqrt(2) / 2)


def _measured(nodeid: str, values: dict[str, float]) -> MeasuredTest:
    metrics = Metrics(values, dict.fromkeys(values, 5))
    return MeasuredTest(nodeid, "cuda", 100, 1, metrics, 0, {}, (), device_slug=H100)


def test_ab_judges_each_test_over_the_rounds_that_measured_it_and_device_time_at_1_percent() -> None:
    """A test settled after 6 rounds and left out of the next two is judged on its 6 pairs; device time 2% slower
    is a regression at its own 1% minimum effect while seconds, as noisy as a host makes it, is inconclusive and
    says what its rounds could resolve."""
    seconds = [1.0, 1.3, 0.8, 1.1, 0.9, 1.25, 1.05, 0.95]
    base = [{"t::a": _measured("t::a", {DEVICE_TIME: 2000.0 + i, "seconds": s}),
             "t::b": _measured("t::b", {"syncs": 1, "seconds": 1.0})} for i, s in enumerate(seconds)]  # fmt: skip
    head = [{"t::a": _measured("t::a", {DEVICE_TIME: 2040.0 + i, "seconds": s * (1.1 if i % 2 else 0.95)}),
             "t::b": _measured("t::b", {"syncs": 2, "seconds": 1.0})} for i, s in enumerate(seconds)]  # fmt: skip
    for late in (*base[6:], *head[6:]):
        del late["t::b"]  # settled after round 6: not run again
    tests, only_in = compare_sides(base, head, min_effect=None, confidence=0.95)
    a, b = tests
    assert only_in == {}
    assert a.timings[DEVICE_TIME].verdict == REGRESSION and a.timings[DEVICE_TIME].min_effect == 0.01
    assert a.timings["seconds"].verdict == INCONCLUSIVE and a.timings["seconds"].rounds == 8
    assert b.timings["seconds"].rounds == 6 and b.verdict == REGRESSION and b.settled
    assert a.settled  # a regression in device time settles it whatever the host timings do
    resolvable = a.timings["seconds"].resolvable
    assert resolvable is not None and resolvable > 0.03
    report = ABReport("base", "head", 8, None, 0.95, H100, ("x",), tuple(tests), stopped="every test settled")
    lines = summary_lines(report)
    assert any(line.startswith("    seconds: x") and f"resolves ±{resolvable:.1%}; minimum effect 3%" in line
               for line in lines), lines  # fmt: skip
    # Device time is listed before host timings.
    a_lines = lines[lines.index(next(x for x in lines if x.endswith("t::a"))) :]
    assert a_lines[1].startswith(f"    {DEVICE_TIME}:") and a_lines[2].startswith("    seconds:")


def test_an_unchanged_metric_settles_and_a_narrow_interval_resolves_less() -> None:
    same = judge([(1.0, 1.0 + 0.001 * (i % 3)) for i in range(6)], higher_is_better=False, min_effect=0.01,
                 confidence=0.95)  # fmt: skip
    wide = judge([(1.0, 1.0 + 0.05 * (i % 3 - 1)) for i in range(6)], higher_is_better=False, min_effect=0.01,
                 confidence=0.95)  # fmt: skip
    assert same.verdict == UNCHANGED and wide.verdict == INCONCLUSIVE
    assert same.resolvable is not None and wide.resolvable is not None and same.resolvable < wide.resolvable
    test = _head_against_base("t", [(_measured("t", {"seconds": 1.0}), _measured("t", {"seconds": 1.0}))] * 6,
                              None, 0.95)  # fmt: skip
    assert test.settled and test.verdict == UNCHANGED


EVIDENCE = DATA / "h100_device_time"


def _baselines_dir(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    packed = EVIDENCE / name / f"{H100}.json.gz"
    (folder / f"{H100}.json").write_bytes(gzip.decompress(packed.read_bytes()))
    return folder


def _results(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name.removesuffix(".gz")
    path.write_bytes(gzip.decompress((EVIDENCE / name).read_bytes()))
    return path


@pytest.mark.parametrize(("name", "regressed"), [
    ("plant-0-a68aba1e.json.gz", False), ("plant-3-cf706d0b.json.gz", True), ("plant-5-cf706d0b.json.gz", True),
])  # fmt: skip
def test_planted_device_time_on_another_h100_is_a_regression_of_device_time_alone(
    tmp_path: Path, name: str, regressed: bool
) -> None:
    """Real H100 runs (tests/data/README.md): against a baseline of the planted base recorded twice on host
    a68aba1e, 3% and 5% of device time planted per step of cuda_graph and static_compiled, run on host
    cf706d0b, regress in device time and nothing else; the base run again passes."""
    from pytest_syncguard.judge.run import compare_run

    run = compare_run([_results(tmp_path, name)], _baselines_dir(tmp_path, "plant_baselines"))
    assert len(run.cases) == 2
    for case in run.cases:
        moved = {c.metric for c in case.comparison.changes if c.status == "regression"}
        assert moved == ({DEVICE_TIME} if regressed else set()), case.case.nodeid
        (device_time,) = (c for c in case.comparison.changes if c.metric == DEVICE_TIME)
        assert device_time.spread is not None and device_time.spread.recordings == 2
        assert device_time.tolerance == METRICS[DEVICE_TIME].min_tolerance  # spread ±0.11%: the floor


def test_the_unchanged_suite_on_a_fourth_h100_passes_against_the_history_of_two_others(tmp_path: Path) -> None:
    """The unchanged suite on host 4d192679 against the history of three recordings on two other hosts: every
    test's device time and counts unchanged, and static_compiled's allocator peak (1062 MiB there and on the first
    host, 1020 on the host that recorded twice) within the tolerance its history calibrates: no regression. (On
    the device it failed that peak against a baseline that kept only the last recording, at a fixed 2%.)"""
    from pytest_syncguard.judge.run import compare_run

    run = compare_run([_results(tmp_path, "suite-4d192679.json.gz")], _baselines_dir(tmp_path, "suite_baselines"))
    assert len(run.cases) == 17
    device_times = [c for case in run.cases for c in case.comparison.changes if c.metric == DEVICE_TIME]
    assert len(device_times) == 14 and {c.status for c in device_times} == {"unchanged"}
    assert max(abs(c.relative or 0.0) for c in device_times) < 0.015
    counted = [c for v in run.cases for c in v.comparison.changes if c.metric in METRICS and METRICS[c.metric].counted]
    assert counted and {c.status for c in counted} == {"unchanged"}
    assert run.with_status("regression") == []
    compiled = next(v for v in run.cases if v.case.nodeid.endswith("test_timeline[static_compiled]"))
    (reserved,) = (c for c in compiled.comparison.changes if c.metric == "reserved_mb")
    assert (reserved.old, reserved.new, reserved.status) == (1020.0, 1062.0, "unchanged")
    assert reserved.tolerance is not None and reserved.tolerance > 0.05


def test_the_ab_of_planted_device_time_settled_in_the_fewest_rounds() -> None:
    from pytest_syncguard.document.ab import read_report

    report = read_report(EVIDENCE / "ab-plant-3-cf706d0b.json")
    (test,) = report.tests
    assert report.rounds == 6 and report.stopped == "every test settled after 6 rounds"
    assert test.verdict == REGRESSION and test.timings[DEVICE_TIME].verdict == REGRESSION
    low = test.timings[DEVICE_TIME].low
    assert low is not None and low > 1.01


def test_with_warm_sides_the_planted_3_percent_settles_in_6_rounds_and_the_unchanged_code_does_not_regress() -> None:
    """One warm pytest per side (fa20e4f6): the +3% planted in cuda_graph alone, and in cuda_graph and
    static_compiled at once, are device-time regressions after the 6 rounds a 95% interval needs; the unchanged code
    against a copy of itself, over 7 rounds, keeps every count and every device time within 1%."""
    from pytest_syncguard.document.ab import read_report

    for name, strategies in (("ab-plant-3-fa20e4f6", 1), ("ab-plant-3-two-fa20e4f6", 2)):
        report = read_report(EVIDENCE / f"{name}.json")
        assert report.warm_sides and report.rounds == 6 and report.stopped == "every test settled after 6 rounds"
        assert len(report.tests) == strategies
        for test in report.tests:
            device = test.timings[DEVICE_TIME]
            assert test.counts == () and device.verdict == REGRESSION
            assert device.low is not None and device.low > 1.01 and device.ratio is not None and device.ratio < 1.04
    unchanged = read_report(EVIDENCE / "ab-unchanged-fa20e4f6.json")
    assert unchanged.warm_sides and unchanged.rounds == 7 and unchanged.regressions == 0
    for test in unchanged.tests:
        assert test.counts == () and test.timings[DEVICE_TIME].verdict == "unchanged"


def test_a_metric_a_round_did_not_measure_is_judged_over_the_others_and_the_report_says_so(tmp_path: Path) -> None:
    """Device time that one side's trace lost in two rounds is judged over the other six, not dropped; a metric
    that only the head measures is named, not judged; both survive the A/B file and reach the Markdown."""
    from pytest_syncguard.document.ab import document, read_report
    from pytest_syncguard.render.markdown import ab_lines

    base = [{"t::a": _measured("t::a", {DEVICE_TIME: 2000.0 + i, "seconds": 1.0})} for i in range(8)]
    head = [{"t::a": _measured("t::a", {DEVICE_TIME: 2100.0 + i, "seconds": 1.0, "launches": 300})} for i in range(8)]
    for lost in (2, 6):
        base[lost]["t::a"] = _measured("t::a", {"seconds": 1.0})
    ((test,), _) = compare_sides(base, head, min_effect=None, confidence=0.95)
    device = test.timings[DEVICE_TIME]
    assert device.rounds == 6 and device.verdict == REGRESSION
    assert test.unmeasured == {
        DEVICE_TIME: "not measured by a side in rounds 3, 7: judged over the other 6",
        "launches": "measured on the head only",
    }
    report = ABReport("base", "head", 8, None, 0.95, H100, ("x",), (test,), stopped="every test settled")
    assert f"    {DEVICE_TIME}: not measured by a side in rounds 3, 7: judged over the other 6" in summary_lines(report)
    path = tmp_path / "ab.json"
    path.write_text(json.dumps(document(report)))
    assert read_report(path).tests[0].unmeasured == test.unmeasured
    markdown = "\n".join(ab_lines(report))
    assert "| `t::a` | `launches` | | measured on the head only |" in markdown


def test_a_timing_more_rounds_cannot_settle_stops_and_says_what_the_host_resolves() -> None:
    """`syncguard ab` on unchanged code spent 11 rounds and its whole budget on an eager test whose wall time
    resolved only +-12.5% on the host, while its device time settled after 6: such a metric stops, and says so."""
    from pytest_syncguard.document.ab import INCONCLUSIVE, HeadAgainstBase
    from pytest_syncguard.gate.ab.stats import judge, rounds_needed
    from pytest_syncguard.render.ab import verdict_note

    noisy = [(1.0, r) for r in (0.88, 1.13, 0.95, 1.10, 0.90, 1.07, 0.93, 1.12)]  # +-12%, no shift
    quiet = [(1.0, r) for r in (1.004, 0.998, 1.001, 0.999, 1.002, 1.000, 0.997, 1.003)]
    early = judge(noisy[: rounds_needed(0.95)], higher_is_better=False, min_effect=0.03, confidence=0.95, max_rounds=12)
    assert early.verdict == INCONCLUSIVE and early.spread is None  # too few rounds to tell how wide it stays
    wall = judge(noisy, higher_is_better=False, min_effect=0.03, confidence=0.95, max_rounds=12)
    assert wall.verdict == INCONCLUSIVE and wall.spread is not None and wall.spread > 0.03
    assert judge(noisy, higher_is_better=False, min_effect=0.03, confidence=0.95, max_rounds=400).spread is None
    device = judge(quiet, higher_is_better=False, min_effect=0.01, confidence=0.95, max_rounds=12)
    assert device.verdict == "unchanged" and device.spread is None
    test = HeadAgainstBase("t.py::test_speed[kv_cache]", (), {"seconds": wall, DEVICE_TIME: device})
    # Its device time settled unchanged: the test reads so, the host time's note beside it (not "inconclusive").
    assert test.settled and test.verdict == "unchanged"
    note = verdict_note(wall, "seconds")
    assert note.startswith(f" (8 rounds; host time not resolvable on this runner: ±{wall.spread:.1%} after the most")
    assert "wider than the minimum effect 3%" in note
    # Without the bound it would take more rounds: the test is not settled.
    assert not HeadAgainstBase("t", (), {"seconds": judge(noisy, higher_is_better=False, min_effect=0.03,
                                                          confidence=0.95)}).settled  # fmt: skip


def test_timed_rounds_judge_counts_on_the_round_that_counted_and_host_timings_only_when_asked() -> None:
    """After a first round that counts, an A/B's rounds measure timings only: a count that moves in them (a warm
    process's allocator reusing what it cached) is no "varies"; with --no-host-timings a host timing that moved is
    not judged, while device time is."""
    base = [_measured("t", {"device_mallocs": 2, DEVICE_TIME: 2000.0 + i, "seconds": 1.0}) for i in range(6)]
    head = [_measured("t", {"device_mallocs": 2 if i == 0 else 1, DEVICE_TIME: 2001.0 + i, "seconds": 1.5})
            for i in range(6)]  # fmt: skip
    pairs = list(zip(base, head, strict=True))
    every = _head_against_base("t", pairs, None, 0.95)
    assert [(c.metric, c.status) for c in every.counts] == [("device_mallocs", "varies")]
    assert every.timings["seconds"].verdict == "regression"
    first = _head_against_base("t", pairs, None, 0.95, host_timings=False, counted_rounds=1)
    assert first.counts == () and set(first.timings) == {DEVICE_TIME}
    assert first.timings[DEVICE_TIME].verdict == UNCHANGED and first.verdict == UNCHANGED


class _SleepingSide:
    """A side of an A/B whose every test takes ``seconds`` per turn: ``steady`` tests measure the same device time
    on both sides (they settle), the ``noisy`` one a head/base that swings ±5% (it stays inconclusive)."""

    times_only = True

    def __init__(self, name: str, seconds: float) -> None:
        self.name, self.seconds, self.turns = name, seconds, 0

    def run(self, label: str, settled: Any, timeout: float, timings_only: bool = False, repeat: Any = None) -> Any:
        import time

        self.turns += 1
        swing = 1.0 if self.name == "base" else (1.05 if self.turns % 2 else 0.95)
        tests = {f"t::steady{i}": {DEVICE_TIME: 100.0} for i in range(3)} | {"t::noisy": {DEVICE_TIME: 100.0 * swing}}
        running = {nodeid: values for nodeid, values in tests.items() if nodeid not in settled}
        time.sleep(self.seconds * len(running))
        return {nodeid: _measured(nodeid, values) for nodeid, values in running.items()}


def test_the_time_budget_is_spent_on_the_tests_still_running(tmp_path: Path) -> None:
    """Once three of four tests settle, the next round is judged by what the one left costs, not by the pace of the
    rounds that ran all four: the A/B goes on within its budget instead of stopping at the first settling."""
    from pytest_syncguard.gate.ab.plan import Plan, run_rounds

    said: list[str] = []
    sides = {name: _SleepingSide(name, 0.15) for name in ("base", "head")}
    plan = Plan(1000, None, 0.5, time_budget=3.0)  # 2 rounds settle a test at 50%; 4 tests x 2 sides: 1.2 s a round
    base, _, stopped = run_rounds(sides, plan, tmp_path, timeout=60, progress=said.append)
    assert any("settled after 2 rounds: t::steady0, t::steady1, t::steady2" in line for line in said)
    assert len(base) >= 3, said  # 2.4 s for two rounds of four tests, then 0.3 s a round for the one left
    assert "would pass the time budget" in stopped[0] and set(base[-1]) == {"t::noisy"}


def test_a_settled_device_time_is_the_ab_verdict_when_host_time_cannot_be_resolved_here() -> None:
    """Device time unchanged, its host time past settling (±10% rounds on a runner that cannot resolve 3%): the
    test reads unchanged, not "inconclusive", with the host timing's note kept."""
    seconds = [1.0, 1.2, 0.85, 1.1, 0.9, 1.15, 0.95, 1.05]
    base = [_measured("t", {DEVICE_TIME: 2000.0, "seconds": 1.0}) for _ in seconds]
    head = [_measured("t", {DEVICE_TIME: 2000.5, "seconds": s}) for s in seconds]
    test = _head_against_base("t", list(zip(base, head, strict=True)), None, 0.95, max_rounds=8)
    assert test.timings[DEVICE_TIME].verdict == UNCHANGED
    host = test.timings["seconds"]
    assert host.verdict == INCONCLUSIVE and not host.undecided  # more rounds would not settle it
    assert test.verdict == UNCHANGED and test.settled
    assert "not resolvable on this runner" in "\n".join(summary_lines(ABReport("b", "h", 8, None, 0.95, "d", (),
                                                                               (test,))))  # fmt: skip
