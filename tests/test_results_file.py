"""The results document and its one codec: a results file of schema version 1 (written by the plugin before this
one, tests/data/results-v1-cpu.json.gz) reads into the same numbers, today's files round-trip, and a file that
holds no results document is an error naming the file and the field."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pytest_syncguard.codec import CodecError, decode, encode, layout
from pytest_syncguard.document import file as results_file
from pytest_syncguard.document.measured import MeasuredTest

DATA = Path(__file__).parent / "data"


@pytest.fixture
def version_1(tmp_path: Path) -> tuple[Path, dict]:
    """``pytest examples/test_strategies.py -k "kv_cache or hf_generate" --syncguard --syncguard-baselines baselines
    --syncguard-json`` on the CPU, at f94b8d3 (schema version 1)."""
    path = tmp_path / "results-v1.json"
    path.write_bytes(gzip.decompress((DATA / "results-v1-cpu.json.gz").read_bytes()))
    data = json.loads(path.read_text())
    assert data["schema_version"] == 1
    return path, data


def test_a_version_1_file_reads_into_the_numbers_it_holds(version_1: tuple[Path, dict], tmp_path: Path) -> None:
    path, data = version_1
    tests = results_file.read(path)
    assert [t.nodeid for t in tests] == [t["nodeid"] for t in data["tests"]] and len(tests) == 4
    for test, raw in zip(tests, data["tests"], strict=True):
        assert dict(test.metrics.values) == raw["metrics"] and dict(test.metrics.runs) == raw["samples"]
        assert [(c.budget.marker, c.budget.limit, c.held, c.value) for c in test.checks] == [
            (b["marker"], b["limit"], b["passed"], b["value"]) for b in raw["budgets"]
        ]
        assert test.comparison is not None and test.comparison.status == raw["baseline"]["status"]
        assert test.comparison.drift == {k: tuple(v) for k, v in raw["baseline"]["fingerprint_changes"].items()}
        assert [c.metric for c in test.comparison.changes] == [c["metric"] for c in raw["baseline"]["changes"]]
        assert test.device_slug == raw["baseline"]["device"] == "cpu"
        assert test.verdict == raw["verdict"] and test.syncs == raw["syncs"]
        assert [s.count for s in test.sites] == [s["count"] for s in raw["sites"]]
        assert {k: [list(i) for i in v] for k, v in test.counted_top.items()} == raw["counted_top"]
    # Written again, it is a file of today's version that reads back equal.
    again = tmp_path / "again.json"
    results_file.write(again, tests, "2.13.0")
    assert json.loads(again.read_text())["schema_version"] == results_file.SCHEMA_VERSION
    assert results_file.read(again) == tests


def test_a_file_that_is_no_results_document_is_an_error_naming_the_file_and_the_field(
    version_1: tuple[Path, dict], tmp_path: Path
) -> None:
    tests = results_file.read(version_1[0])
    good = tmp_path / "good.json"
    results_file.write(good, tests, "2.13.0")
    document = json.loads(good.read_text())

    def broken(change: str, value: object) -> str:
        copy = json.loads(json.dumps(document))
        *parents, last = change.split(".")
        target = copy["tests"][1]
        for key in parents:
            target = target[int(key)] if key.isdigit() else target[key]
        target[last] = value
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(copy))
        with pytest.raises(results_file.ResultsError) as raised:
            results_file.read(bad)
        return str(raised.value)

    expected = f"{tmp_path / 'bad.json'}: tests[1].metrics.values.syncs: a finite number expected, got '29'"
    assert broken("metrics.values.syncs", "29") == expected
    assert "tests[1].checks[0].held: true/false expected, got 'yes'" in broken("checks.0.held", "yes")
    assert "tests[1].comparison.changes: a list expected, got object" in broken("comparison.changes", {})
    assert "tests[1].regions: a whole number expected, got True" in broken("regions", True)
    del document["tests"][0]["nodeid"]
    (tmp_path / "missing.json").write_text(json.dumps(document))
    with pytest.raises(results_file.ResultsError, match=r"tests\[0\]: 'nodeid' is missing"):
        results_file.read(tmp_path / "missing.json")
    document["schema_version"] = results_file.SCHEMA_VERSION + 1
    (tmp_path / "newer.json").write_text(json.dumps(document))
    with pytest.raises(results_file.ResultsError, match="upgrade pytest-syncguard"):
        results_file.read(tmp_path / "newer.json")
    (tmp_path / "junit.json").write_text('{"schema": "pytest-syncguard/ab"}')
    with pytest.raises(results_file.ResultsError, match=r"junit\.json: not a syncguard results file"):
        results_file.read(tmp_path / "junit.json")


def test_the_codec_ignores_keys_it_does_not_know_and_lists_every_record_of_the_layout(
    version_1: tuple[Path, dict],
) -> None:
    path, _ = version_1
    test = results_file.read(path)[0]
    data = encode(test)
    assert data["verdict"] == test.verdict  # written for the reader
    assert decode(MeasuredTest, {**data, "added_by_a_newer_minor_version": 1}) == test
    with pytest.raises(CodecError, match=r"MeasuredTest.metrics: an object expected, got list"):
        decode(MeasuredTest, {**data, "metrics": []})
    records = layout(MeasuredTest)
    assert next(iter(records)) == "MeasuredTest" and {"Metrics", "BudgetCheck", "Budget", "Comparison", "Change",
                                                    "Explanation", "SiteChange", "SiteCount", "TimelineSummary",
                                                    "AttributedGap", "MemoryStats", "AsyncRace"} <= set(records)  # fmt: skip
    assert ("held", "true/false or null") in records["BudgetCheck"]


def test_a_real_h100_results_document_reads_and_reports_as_the_run_judged_it(tmp_path: Path) -> None:
    """The suite's results document from an H100 run (tests/data/h100_results), reported against the baseline
    that run compared with: each test's comparison agrees with the run's own, and every count is unchanged."""
    from pytest_syncguard.judge.run import compare_run

    data = DATA / "h100_results"
    results = tmp_path / "results.json"
    results.write_bytes(gzip.decompress((data / "results-nvidia-h100-80gb-hbm3.json.gz").read_bytes()))
    (tmp_path / "baselines").mkdir()
    baseline = tmp_path / "baselines" / "nvidia-h100-80gb-hbm3.json"
    baseline.write_bytes(gzip.decompress((data / "baselines" / "nvidia-h100-80gb-hbm3.json.gz").read_bytes()))
    tests = {t.nodeid: t for t in results_file.read(results)}
    assert len(tests) == 17 and {t.device_slug for t in tests.values()} == {"nvidia-h100-80gb-hbm3"}
    graph = tests["examples/test_strategies.py::test_timeline[cuda_graph]"]
    assert graph.timeline is not None and graph.memory and graph.metrics["graph_launches"] == 99
    run = compare_run([results], tmp_path / "baselines")
    assert {c.case.nodeid: c.comparison.status for c in run.cases} == {
        nodeid: t.comparison.status for nodeid, t in tests.items() if t.comparison is not None
    }
    assert not run.with_status("regression") and not run.missing
    counted = [change for c in run.cases for change in c.comparison.changes if change.metric in ("syncs", "launches")]
    assert counted and all(change.status == "unchanged" for change in counted)


def test_a_record_of_another_version_reads_each_way_and_the_report_says_what_it_does_not_know(
    tmp_path: Path,
) -> None:
    """A history spans versions. Newer: a record with a field, a metric, a budget's marker and a counter this
    version does not know reads, is judged on what it knows, and the report names each unknown part. Older: a
    record without the fields added since (the host, the timeline's source, the CUDA calls' note, the diagnosis)
    reads with their defaults."""
    from pytest_syncguard.judge.run import compare_run
    from pytest_syncguard.render.markdown import render

    data = json.loads(gzip.decompress((DATA / "h100_pr" / "unchanged.json.gz").read_bytes()))
    newer, older = json.loads(json.dumps(data)), json.loads(json.dumps(data))
    record = newer["tests"][0]
    record["energy_joules"] = 12.5
    record["metrics"]["values"]["kv_bytes_per_token"] = 4096.0
    record["checks"].append({"budget": {"marker": "max_kv_bytes_per_token", "limit": 1000.0, "stat": "max"},
                             "value": 4096.0, "held": False, "text": "max_kv_bytes_per_token: limit 1000"})  # fmt: skip
    record["counted_top"]["kv_evictions"] = [["layer 3", 7]]
    path = tmp_path / "newer.json"
    path.write_text(json.dumps(newer))
    tests, unknown = results_file.read_with_unknown(path)
    assert unknown == ["field energy_joules", "metric kv_bytes_per_token", "budget max_kv_bytes_per_token",
                       "counter kv_evictions"]  # fmt: skip
    assert "kv_bytes_per_token" in tests[0].metrics.values  # kept as recorded, never judged
    assert "(a budget this version of syncguard does not know)" in tests[0].checks[-1].budget.describe()
    run = compare_run([path], None)
    text, _ = render(run)
    assert (
        "⚠️ `newer.json` was written by another version of syncguard: this one does not know field `energy_joules`, "
        "metric `kv_bytes_per_token`, budget `max_kv_bytes_per_token`, counter `kv_evictions`; read without them "
        "(not judged)." in text
    )
    assert "max_kv_bytes_per_token: limit 1000" in text  # the record's own words of its failed budget
    assert run.to_dict()["unknown"] == {str(path): unknown}

    added_since = ("host", "timeline_source", "cuda_calls_uncounted", "gap_diagnosis", "allocation_sites")
    for record in older["tests"]:
        for name in added_since:
            record.pop(name, None)
    path = tmp_path / "older.json"
    path.write_text(json.dumps(older))
    tests, unknown = results_file.read_with_unknown(path)
    assert unknown == [] and len(tests) == len(older["tests"])
    assert all(t.host == "" and t.timeline_source is None and t.allocation_sites == () for t in tests)
    assert "was written by another version" not in render(compare_run([path], None))[0]
