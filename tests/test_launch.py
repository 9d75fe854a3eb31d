"""One verdict from the documents of every rank of a launch (:mod:`pytest_syncguard.document.launch`), on the
records of a real H100 job: each test once with its ranks, its metrics the worst rank's, a rank's failed budget named
by rank, a rank with no document a failure naming it. The end-to-end run under torchrun is in test_ranks.py."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_syncguard.document import file as results_file
from pytest_syncguard.document.launch import Launch
from pytest_syncguard.document.measured import MeasuredTest
from pytest_syncguard.gate.cli import main
from pytest_syncguard.judge.run import compare_run
from pytest_syncguard.metrics import Metrics

H100_JOB = Path(__file__).parent / "data" / "h100_pr" / "unchanged.json.gz"
GRAPHS = "examples/test_strategies.py::test_speed[cuda_graph]"


def _tests() -> list[MeasuredTest]:
    data = json.loads(gzip.decompress(H100_JOB.read_bytes()))
    return [results_file.from_record(t, where=f"tests[{i}]") for i, t in enumerate(data["tests"])]


def _write(path: Path, tests: list[MeasuredTest], launch: Launch | None) -> Path:
    path.write_text(json.dumps(results_file.document(tests, "2.11.0", launch)))
    return path


def _slower(test: MeasuredTest, factor: float) -> MeasuredTest:
    """The test as a slower rank measured it: device time and wall time longer by ``factor``, one sync more."""
    values = dict(test.metrics.values)
    values["gpu_us_per_token"] *= factor
    values["tokens_per_second"] /= factor
    values["syncs"] += 1
    return replace(test, metrics=Metrics(values, test.metrics.runs))


def test_a_tests_metrics_are_its_worst_ranks_each_by_its_direction(tmp_path: Path) -> None:
    tests = _tests()
    graphs = next(t for t in tests if t.nodeid == GRAPHS)
    rank0 = _write(tmp_path / "r.rank0.json", tests, Launch(0, 2))
    rank1 = _write(tmp_path / "r.rank1.json", [_slower(t, 1.1) if t is graphs else t for t in tests], Launch(1, 2))
    joined = {t.nodeid: t for t in results_file.read_all([rank0, rank1])}
    assert len(joined) == len(tests)
    test = joined[GRAPHS]
    assert test.world_size == 2 and [r.rank for r in test.ranks] == [0, 1]
    values = graphs.metrics.values
    assert test.metrics.values["gpu_us_per_token"] == pytest.approx(values["gpu_us_per_token"] * 1.1)
    assert test.metrics.values["tokens_per_second"] == pytest.approx(values["tokens_per_second"] / 1.1)
    assert test.metrics.values["syncs"] == values["syncs"] + 1
    others = [t for t in joined.values() if t.nodeid != GRAPHS]
    assert all(t.metrics == next(u for u in tests if u.nodeid == t.nodeid).metrics for t in others)


def test_a_budget_one_rank_broke_fails_the_test_named_by_rank(tmp_path: Path) -> None:
    tests = _tests()
    budgeted = next(t for t in tests if t.checks)
    check = budgeted.checks[0]
    broken = replace(budgeted, checks=(replace(check, held=False, text="max_syncs_per_token: limit 1, measured 2"),))
    rank0 = _write(tmp_path / "r.rank0.json", [budgeted], Launch(0, 2))
    rank1 = _write(tmp_path / "r.rank1.json", [broken], Launch(1, 2))
    run = compare_run([rank0, rank1], None)
    (case,) = run.cases
    assert case.case.broken == ("rank 1: max_syncs_per_token: limit 1, measured 2",)
    assert [r.verdict for r in case.case.ranks] == [budgeted.verdict, "fail"]
    assert main(["report", str(rank0), str(rank1), "--markdown", str(tmp_path / "c.md")]) == 0
    comment = (tmp_path / "c.md").read_text()
    assert "- **ranks:** rank 0 of 2: pass" in comment
    assert "rank 1 of 2: fail: `max_syncs_per_token: limit 1, measured 2`" in comment


def test_a_rank_that_left_no_document_fails_every_test_naming_it(tmp_path: Path) -> None:
    rank0 = _write(tmp_path / "r.rank0.json", _tests()[:2], Launch(0, 2))
    cases = compare_run([rank0], None).cases
    assert len(cases) == 2
    for case in cases:
        assert case.case.outcome == "error"
        assert case.case.error is not None and case.case.error.startswith("rank 1 of 2 left no results file")


def test_two_documents_of_one_rank_are_refused_naming_both(tmp_path: Path) -> None:
    first = _write(tmp_path / "a.json", _tests()[:1], Launch(0, 2))
    second = _write(tmp_path / "b.json", _tests()[:1], Launch(0, 2))
    with pytest.raises(results_file.ResultsError, match=f"{first} and {second} are both rank 0 of 2"):
        results_file.read_all([first, second])


@pytest.mark.parametrize("launch", [{"rank": 2, "world_size": 2}, {"rank": 0, "world_size": 1},
                                    {"rank": 0, "world_size": 10**9}, {"rank": -1, "world_size": 2}])  # fmt: skip
def test_a_launch_no_process_can_have_is_refused_naming_the_file(tmp_path: Path, launch: dict[str, int]) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**results_file.document(_tests()[:1], "2.11.0"), "launch": launch}))
    with pytest.raises(results_file.ResultsError, match=f"{path}: launch: rank .* is no rank of a launch"):
        results_file.read_all([path])


def test_a_launchs_device_slug_that_is_a_path_is_refused_naming_the_file(tmp_path: Path) -> None:
    """The slug of a test no rank finished names a baselines file: a path in it would reach outside the folder."""
    path = _write(tmp_path / "r.json", _tests()[:1], Launch(0, 2, device_slug="../../etc/passwd"))
    with pytest.raises(results_file.ResultsError, match=f"{path}: launch.device_slug: '../../etc/passwd' is no"):
        results_file.read_all([path])


def test_a_rank_that_skipped_hides_neither_the_others_regression_nor_their_error(tmp_path: Path) -> None:
    """Rank 0 skipped the test; rank 1 measured 40 syncs against a baseline of 4: the joined test is judged on rank
    1's numbers (a regression), its ranks said; rank 1's error fails it."""
    tests = _tests()
    graphs = next(t for t in tests if t.nodeid == GRAPHS)
    skipped = replace(graphs, outcome="skipped")
    values = {**graphs.metrics.values, "syncs": 40.0}
    noisy = replace(graphs, metrics=Metrics(values, graphs.metrics.runs))
    rank0 = _write(tmp_path / "r.rank0.json", [skipped], Launch(0, 2))
    rank1 = _write(tmp_path / "r.rank1.json", [noisy], Launch(1, 2))
    baselines = tmp_path / "b"
    baselines.mkdir()
    (baselines / f"{graphs.device_slug}.json").write_text(json.dumps({
        "schema": "pytest-syncguard/baselines", "schema_version": 3, "device": graphs.device_slug,
        "tests": {GRAPHS: {**graphs.metrics.values, "syncs": 4.0}}}))  # fmt: skip
    (case,) = compare_run([rank0, rank1], baselines).cases
    assert case.case.outcome == "passed" and case.comparison.status == "regression"
    assert [r.verdict for r in case.case.ranks] == ["skipped", graphs.verdict]
    assert main(["report", str(rank0), str(rank1), "--baselines", str(baselines), "--fail-on-regression"]) == 1
    errored = _write(tmp_path / "r.rank1.json", [replace(graphs, error="CUDA error: an illegal memory access")],
                     Launch(1, 2))  # fmt: skip
    (case,) = compare_run([rank0, errored], None).cases
    assert case.case.outcome == "error" and "rank 1: CUDA error" in (case.case.error or "")


def test_documents_of_two_launches_are_refused_naming_both(tmp_path: Path) -> None:
    rank0 = _write(tmp_path / "r.rank0.json", _tests()[:1], Launch(0, 2, launch_id="run-a@10.0.0.1:29500"))
    rank1 = _write(tmp_path / "r.rank1.json", _tests()[:1], Launch(1, 2, launch_id="run-b@10.0.0.1:29500"))
    with pytest.raises(results_file.ResultsError, match="are not one launch's: launch 'run-a@"):
        results_file.read_all([rank0, rank1])
    other = tmp_path / "old.rank1.json"
    document = results_file.document(_tests()[:1], "2.10.0", Launch(1, 2))
    other.write_text(json.dumps({**document, "syncguard": "0.0.9"}))
    with pytest.raises(results_file.ResultsError, match=r"are not one launch's: syncguard .* against 0\.0\.9"):
        results_file.read_all([_write(tmp_path / "r.rank0.json", _tests()[:1], Launch(0, 2)), other])


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_stop_file_that_is_no_regular_file_is_named_and_never_read(tmp_path: Path, kind: str) -> None:
    import os

    graphs = next(t for t in _tests() if t.nodeid == GRAPHS)
    rank0 = _write(tmp_path / "r.rank0.json", [graphs], Launch(0, 2))
    rank1 = _write(tmp_path / "r.rank1.json", [], Launch(1, 2, finished=False, in_flight=GRAPHS))
    secret = tmp_path / "secret.txt"
    secret.write_text('  File "/home/runner/.ssh/id_rsa", line 1 in leaked\n')
    stop = tmp_path / "r.rank1.stopped.txt"
    if kind == "fifo":
        os.mkfifo(stop)
    else:
        stop.symlink_to(secret)
    (case,) = compare_run([rank0, rank1], None).cases  # a FIFO read would block here
    assert "its stop file r.rank1.stopped.txt is" in (case.case.error or "") and "not read" in (case.case.error or "")
    assert "id_rsa" not in (case.case.error or "")
