"""A test is judged against a baseline entry once: where the report's entry is the one the run compared it with, the
run's judgement (recorded in its results file) is the report's; the report judges anew only against another entry
(another baselines folder, the default branch's history, the merge base's files) or where it is asked to judge
otherwise (``--tolerance``, ``--judge-host-timings``). On the real H100 results of the strategy suite."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from pytest_syncguard.judge.baselines import of_device, read
from pytest_syncguard.judge.run import compare_run
from pytest_syncguard.judge.verdict import Verdict

DATA = Path(__file__).parent / "data" / "h100_pr"
ROOT = Path(__file__).parents[1]


@pytest.fixture(params=["unchanged", "planted-item"])
def results(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    path = tmp_path / f"{request.param}.json"
    path.write_bytes(gzip.decompress((DATA / f"{request.param}.json.gz").read_bytes()))
    return path


def test_without_a_reference_of_its_own_the_report_takes_the_runs_judgement(results: Path) -> None:
    run = compare_run([results], None)
    assert run.cases and all(c.comparison is c.case.comparison for c in run.cases)
    assert run.rejudged == []
    # The verdict's regressions are the run's own.
    regressed = {c.key for c in run.cases if c.case.comparison is not None and c.case.comparison.status == "regression"}
    assert set(Verdict.of(run).with_reason("regressed against the baseline")) == regressed


def test_against_a_folder_the_same_entry_keeps_the_runs_judgement_and_another_is_judged_anew(results: Path) -> None:
    run = compare_run([results], ROOT / "baselines")
    kept = remade = 0
    for c in run.cases:
        baseline = of_device(read(ROOT / "baselines" / f"{c.case.device_slug}.json"), c.case.device_slug)
        assert baseline is not None
        entry, spreads = baseline.reference(c.case.nodeid, c.case.host)
        same = (
            entry is not None and dict(entry) == dict(c.case.baseline_values) and dict(spreads) == dict(c.case.spreads)
        )
        if same:
            assert c.comparison is c.case.comparison
            kept += 1
        else:
            assert c.comparison is not c.case.comparison
            remade += 1
    assert kept + remade == len(run.cases)


def test_a_tolerance_asked_of_the_report_judges_every_test_anew(results: Path) -> None:
    run = compare_run([results], None, tolerance=0.5)
    assert all(c.comparison is not c.case.comparison for c in run.cases)
    assert all(c.comparison.tolerance == 0.5 for c in run.cases if c.comparison.status != "not compared")
