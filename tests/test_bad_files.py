"""Files the ``syncguard`` commands read that are broken or hostile: each is an error naming the file (exit 2),
never a traceback, and nothing outside the folders named is read."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pytest_syncguard.gate.cli import main
from pytest_syncguard.judge.baselines import SCHEMA, BaselineError, read


def _baseline(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def _document(**overrides: object) -> str:
    data = {"schema": SCHEMA, "schema_version": 1, "device": "cpu", "fingerprint": {}, "tests": {"t::a": {"syncs": 2}}}
    return json.dumps({**data, **overrides})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b'{"schema": "\xff"}', "not UTF-8 text"),
        (_document(schema_version=0), "schema_version must be a whole number >= 1, got 0"),
        (_document(schema_version=-7), "schema_version must be a whole number >= 1, got -7"),
        (_document(schema_version=True), "schema_version must be a whole number >= 1, got True"),
        (_document(schema_version=4), "baseline schema version 4, this syncguard reads up to 3"),
        (_document().replace('"syncs": 2', '"syncs": NaN'), "NaN is not a number a document can hold"),
        (_document().replace('"syncs": 2', '"syncs": -Infinity'), "-Infinity is not a number a document can hold"),
        # Read as valid before: -140.0% against a run, or a 309-digit improvement. Checked as a results file is.
        (_document().replace('"syncs": 2', '"syncs": -5'), "t::a: syncs = -5.0: a measurement cannot be negative"),
        (_document().replace('"syncs": 2', '"syncs": 1e308'), "t::a: syncs = 1e[+]308: past any measurement"),
    ],
)
def test_a_broken_baseline_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | bytes, message: str
) -> None:
    path = _baseline(tmp_path / "cpu.json", text)
    with pytest.raises(BaselineError, match=message):
        read(path)
    assert main(["baselines", str(path)]) == 2
    assert f"{path}" in capsys.readouterr().err


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="1"><testcase classname="t" name="test_a"><properties>
{properties}
<property name="syncguard.verdict" value="pass"/><property name="syncguard.nodeid" value="t.py::test_a"/>
<property name="syncguard.device" value="cpu"/><property name="syncguard.syncs" value="3"/>
</properties></testcase></testsuite></testsuites>
"""


def test_odd_junit_properties_are_read_as_absent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junit = tmp_path / "run.xml"
    junit.write_text(JUNIT.format(properties='<property/><property name="syncguard.runs.syncs" value="²"/>'))
    assert main(["report", str(junit), "--json", str(tmp_path / "report.json")]) == 0
    (test,) = json.loads((tmp_path / "report.json").read_text())["tests"]
    assert (test["nodeid"], test["metrics"]) == ("t.py::test_a", {"syncs": 3.0})


def test_a_device_slug_that_is_a_path_reads_nothing_outside_the_baselines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "x" / "y.json"
    outside.parent.mkdir()
    outside.write_text(_document(tests={"secret::test_id": {"syncs": 1}}))
    (tmp_path / "baselines").mkdir()
    junit = tmp_path / "run.xml"
    junit.write_text(JUNIT.format(properties='<property name="syncguard.device_slug" value="../x/y"/>'))
    markdown = tmp_path / "comment.md"
    assert main(["report", str(junit), "--baselines", str(tmp_path / "baselines"), "--markdown", str(markdown)]) == 2
    err = capsys.readouterr().err
    assert f"{junit}: t.py::test_a: device slug '../x/y' is not one" in err
    assert not markdown.exists() and "secret" not in err


TRACE_EVENTS = [
    {"ph": "X", "cat": "kernel", "name": "k", "ts": 10.0, "dur": 1.0, "args": {"stream": 7, "correlation": 1}},
    {"ph": "X", "cat": "kernel", "name": "k", "ts": 10.0, "dur": 1.0, "args": {"stream": 7}},
    {"ph": "X", "cat": "kernel", "name": "far", "ts": 1e300, "dur": 1.0, "args": {"stream": 7}},
    {"ph": "X", "cat": "kernel", "name": "long", "ts": -1e300, "dur": 1e300, "args": {"stream": 7}},
    {"ph": "X", "cat": "kernel", "name": "k2", "ts": 20.0, "dur": 2.0, "args": {"stream": 7}},
]


def test_a_trace_with_duplicate_and_absurd_events_gives_finite_json_or_names_the_event(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": TRACE_EVENTS}))
    # An event whose times are past what a timeline can hold is an error naming the file and the event.
    assert main(["trace", str(path), "--json"]) == 2
    assert f"syncguard trace: {path}: event 2 ('kernel' 'far'): ts 1e+300 and dur 1.0 must be finite" in (
        capsys.readouterr().err
    )
    path.write_text(json.dumps({"traceEvents": TRACE_EVENTS[:2] + TRACE_EVENTS[4:]}))
    assert main(["trace", str(path), "--json"]) == 0
    timeline = json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))[
        "timeline"
    ]
    # The two identical kernels merge into one busy microsecond.
    assert (timeline["busy_fraction"], timeline["max_gap_us"]) == (pytest.approx(3 / 12), 9.0)


@pytest.mark.parametrize(
    ("event", "why"),
    [
        ({"tid": [1, 2]}, "tid must be a number or a name, got [1, 2]"),
        ({"ts": "soon"}, "ts 'soon' and dur 1.0 must be finite numbers"),
        ({"dur": -1.0}, "ts 0.0 and dur -1.0 must be finite numbers, dur not negative"),
        ({"args": [1]}, "args must be an object, got list"),
    ],
)
def test_a_malformed_event_is_an_error_naming_the_file_and_the_event(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], event: dict[str, object], why: str
) -> None:
    bad = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0.0, "dur": 1.0, "tid": 1, **event}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"traceEvents": [TRACE_EVENTS[0], bad]}))
    assert main(["trace", str(path)]) == 2
    assert f"syncguard trace: {path}: event 1 ('cuda_runtime' 'cudaLaunchKernel'): {why}" in capsys.readouterr().err


def test_a_gzip_that_unpacks_past_the_limit_is_refused_before_it_is_held(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 2 MB gzip can unpack to 2 GiB: it is read no further than the limit, which the error names with the
    option that raises it. A timeline file is bounded the same way."""
    path = tmp_path / "bomb.json.gz"
    with gzip.open(path, "wb") as sink:
        sink.write(b'{"traceEvents": [' + b" " * (3 << 20) + b"]}")
    assert path.stat().st_size < 64 << 10
    assert main(["trace", str(path), "--max-unpacked-mb", "2"]) == 2
    assert f"syncguard trace: {path}: unpacks to more than 2 MB (--max-unpacked-mb raises the limit)" in (
        capsys.readouterr().err
    )
    assert main(["trace", str(path), "--max-unpacked-mb", "4"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["trace", str(path), "--max-unpacked-mb", "0"])
    assert exit_.value.code == 2
    assert "expected a whole number of megabytes > 0, got '0'" in capsys.readouterr().err


def test_a_timeline_file_with_a_number_past_a_float_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_syncguard.render.perfetto import KEY, SCHEMA, SCHEMA_VERSION

    meta = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "origin_us": 0, "nodeid": "t", "source": "trace"}
    path = tmp_path / "t.timeline.json"
    path.write_text(json.dumps({KEY: {**meta, "regions": [{"region": 1}]}, "traceEvents": []}).replace(
        '"region": 1', '"region": 1e400'))  # fmt: skip
    assert main(["trace", str(path)]) == 2
    assert f"syncguard trace: {path}: not a readable syncguard timeline (OverflowError(" in capsys.readouterr().err


def test_a_gzip_with_corrupt_data_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = gzip.compress(json.dumps({"traceEvents": TRACE_EVENTS}).encode())
    path = tmp_path / "corrupt.json.gz"
    path.write_bytes(good[:10] + bytes(b ^ 0x55 for b in good[10:40]) + good[40:])
    assert main(["trace", str(path)]) == 2
    assert f"syncguard trace: {path}: cannot read the trace" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("abc", "property syncguard.syncs = 'abc': not a number"),
        ("NaN", "property syncguard.syncs: syncs = nan: not a finite number"),
        ("1e309", "property syncguard.syncs: syncs = inf: not a finite number"),
        ("-3", "property syncguard.syncs: syncs = -3.0: a measurement cannot be negative"),
        ("1e308", "property syncguard.syncs: syncs = 1e+308: past any measurement (over 1e+15)"),
    ],
)
def test_a_junit_metric_no_measurement_can_have_is_an_error_not_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, why: str
) -> None:
    """Dropped, it read as "unchanged" and --fail-on-regression passed; a results file with it is refused too."""
    junit = tmp_path / "run.xml"
    junit.write_text(
        JUNIT.format(properties="").replace(
            'name="syncguard.syncs" value="3"', f'name="syncguard.syncs" value="{value}"'
        )
    )
    assert main(["report", str(junit), "--fail-on-regression", "--json", str(tmp_path / "r.json")]) == 2
    assert f"{junit}: t.py::test_a: {why}" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_a_junit_tolerance_that_is_not_a_fraction_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was written into report --json as a bare NaN (invalid JSON)."""
    junit = tmp_path / "run.xml"
    junit.write_text(JUNIT.format(properties='<property name="syncguard.tolerance" value="NaN"/>'))
    assert main(["report", str(junit), "--json", str(tmp_path / "r.json")]) == 2
    assert "property syncguard.tolerance = 'NaN': not a finite fraction >= 0" in capsys.readouterr().err


def _results_file(path: Path, tests: list[dict[str, object]]) -> Path:
    from pytest_syncguard.document.file import SCHEMA, SCHEMA_VERSION

    path.write_text(json.dumps({"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "tests": tests}))
    return path


def _record(nodeid: str, syncs: float) -> dict[str, object]:
    return {"nodeid": nodeid, "device": "cpu", "tokens": 2, "regions": 1, "allowed_syncs": 0, "by_kind": {},
            "invisible_kinds": [], "metrics": {"values": {"syncs": syncs}, "runs": {"syncs": 1}}}  # fmt: skip


@pytest.mark.parametrize(
    ("tests", "why"),
    [
        ([_record("t.py::a", -4)], "tests[0].metrics: syncs = -4.0: a measurement cannot be negative"),
        ([_record("t.py::a", 1e308)], "tests[0].metrics: syncs = 1e+308: past any measurement"),
        ([_record("t.py::a", 3), _record("t.py::a", 4)], "tests[1]: test 't.py::a' is in the file twice"),
    ],
)
def test_a_results_file_with_values_no_run_can_have_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tests: list[dict[str, object]], why: str
) -> None:
    """A negative count read as an improvement, +-1e308 as a 309-digit number and -inf%, a test twice: the second
    silently won."""
    path = _results_file(tmp_path / "results.json", tests)
    assert main(["report", str(path)]) == 2
    assert f"{path}: {why}" in capsys.readouterr().err
    _results_file(path, [_record("t.py::a", 3)])
    assert main(["report", str(path)]) == 0


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"rounds": -5}, "rounds -5: not a number of rounds (0 or more)"),
        ({"confidence": 7.0}, "confidence 7.0: not a probability between 0 and 1"),
        ({"min_effect": -0.1}, "min_effect -0.1: not a fraction > 0"),
    ],
)
def test_an_ab_report_with_impossible_settings_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, object], why: str
) -> None:
    """A report with confidence=7 printed "700% intervals"."""
    source = Path(__file__).parent / "data" / "h100_device_time" / "ab-unchanged-fa20e4f6.json"
    data = json.loads(source.read_text())
    path = tmp_path / "ab.json"
    path.write_text(json.dumps({**data, **change}))
    results = _results_file(tmp_path / "results.json", [_record("t.py::a", 3)])
    assert main(["report", str(results), "--ab", str(path)]) == 2
    assert f"A/B report is malformed: {why}" in capsys.readouterr().err


def test_report_checks_its_output_paths_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """They were checked after the work, with a traceback (IsADirectoryError, NotADirectoryError)."""
    results = _results_file(tmp_path / "results.json", [_record("t.py::a", 3)])
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    cases = [
        (["--json", str(tmp_path)], f"syncguard report: --json {tmp_path}: {tmp_path} is a folder"),
        (["--markdown", str(tmp_path)], f"syncguard report: --markdown {tmp_path}: {tmp_path} is a folder"),
        (["--json", str(a_file / "r.json")], f"syncguard report: --json {a_file / 'r.json'}: {a_file} is not a folder"),
        (
            ["--markdown", "/proc/syncguard/r.md"],
            "syncguard report: --markdown /proc/syncguard/r.md: no file can be made in /proc",
        ),
    ]
    for options, message in cases:
        assert main(["report", str(results), *options]) == 2, options
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err


def test_ab_checks_its_paths_before_any_round(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ab --json DIR` ran every round, then failed with a traceback and no summary."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    cases = [
        (["--json", str(tmp_path)], f"syncguard ab: --json {tmp_path}: {tmp_path} is a folder"),
        (["--out", str(a_file)], f"syncguard ab: --out {a_file}: {a_file} exists and is not a folder"),
        (
            ["--base-dir", str(tmp_path / "missing")],
            f"--base-dir {tmp_path / 'missing'}: {tmp_path / 'missing'} is not an existing folder",
        ),
        (["--base-dir", str(a_file)], f"--base-dir {a_file}: {a_file} is not an existing folder"),
    ]
    for options, message in cases:
        where = [] if "--base-dir" in options else ["--base", "HEAD"]
        assert main(["ab", *where, *options, "--", "tests/none.py"]) == 2, options
        err = capsys.readouterr().err
        assert message in err and "round" not in err and "Traceback" not in err, err


def test_a_report_from_junit_says_where_the_explanation_of_a_count_regression_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A JUnit file carries no sync sites: the report said nothing of what moved, as if nothing could be known."""
    baselines = tmp_path / "baselines"
    baselines.mkdir()
    record = {**_record("t.py::test_a", 1), "device_slug": "cpu"}
    assert main(["baselines", str(baselines), "--record", str(_results_file(tmp_path / "r.json", [record]))]) == 0
    junit = tmp_path / "run.xml"
    junit.write_text(JUNIT.format(properties=""))  # syncs 3 against 1
    markdown = tmp_path / "report.md"
    assert main(["report", str(junit), "--baselines", str(baselines), "--markdown", str(markdown)]) == 0
    text = markdown.read_text()
    assert "syncs" in text and "regression" in text.lower()
    assert "  - **what changed:** not in a JUnit file, which carries no sync sites" in text, text
    assert "--syncguard-json" in text


def test_help_texts_are_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    """`syncguard --help` showed the module docstring's reStructuredText (``syncguard``)."""
    for command in ([], ["report"], ["trace"], ["ab"], ["baselines"], ["comment"], ["device"]):
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        shown = capsys.readouterr().out
        assert "``" not in shown and ":func:" not in shown, (command, shown)
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "The syncguard command: init (a repository's CI for syncguard" in capsys.readouterr().out


def test_baselines_record_into_a_file_names_the_folder_to_give(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`baselines PATH` is a file to show and, with --record, a folder to write into: a file given there is
    answered with the folder that holds it."""
    baselines = tmp_path / "baselines"
    baselines.mkdir()
    unnamed = _results_file(tmp_path / "unnamed.json", [_record("t.py::a", 3)])  # no device slug: a traceback before
    assert main(["baselines", str(baselines), "--record", str(unnamed)]) == 2
    assert "NOT recorded: t.py::a: the results name no device" in capsys.readouterr().err
    results = _results_file(tmp_path / "results.json", [{**_record("t.py::a", 3), "device_slug": "cpu"}])
    assert main(["baselines", str(baselines), "--record", str(results)]) == 0
    (written,) = baselines.glob("*.json")
    capsys.readouterr()
    assert main(["baselines", str(written), "--record", str(results)]) == 2
    assert (
        f"--record writes into a baselines folder (one file per GPU model, named by its slug), not into {written}: "
        f"give its folder, `syncguard baselines {baselines} --record ...`"
    ) in capsys.readouterr().err


def test_an_interrupt_after_the_rename_leaves_the_new_file_and_says_only_that_it_was_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C just after os.replace reported "NOT recorded: FileNotFoundError" (the cleanup unlinked the renamed
    temporary file) while the file held the new content."""
    import os

    from pytest_syncguard import files

    path = tmp_path / "cpu.json"
    path.write_text("old")
    replace = os.replace

    def replaced_then_interrupted(source: str, target: Path) -> None:
        replace(source, target)
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "replace", replaced_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        files.write_atomically(path, "new")
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["cpu.json"]  # no temporary file left either


def test_no_lock_file_is_left_beside_a_baseline_nor_an_ab_folder_in_git_status(tmp_path: Path) -> None:
    """--syncguard-update-baselines left cpu.json.lock, and syncguard ab its syncguard-ab/, in the working tree."""
    import subprocess

    from pytest_syncguard.files import ignored_folder
    from pytest_syncguard.judge.baselines import update

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    update(tmp_path / "baselines" / "cpu.json", "cpu", {"t::a": {"syncs": 1}}, {}, {})
    ignored_folder(tmp_path / "syncguard-ab")
    (tmp_path / "syncguard-ab" / "round1-base.json").write_text("{}")
    status = subprocess.run(["git", "-C", str(tmp_path), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    assert status == ["??", "baselines/cpu.json"]
