"""``syncguard report`` on real results and JUnit files written by pytester runs of the plugin: verdict sections,
merging, escaping of hostile test ids, truncation to GitHub's comment limit."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_syncguard.report.markdown import COMMENT_LIMIT, escape, render
from pytest_syncguard.report.run import compare_run

# Each test's reads per step come from an environment variable, so that one file regresses, improves and
# stays put between the baseline run and the PR run.
SUITE = """
import os
import pytest
import torch

def loop(steps, name):
    x = torch.ones(4)
    for _ in range(steps):
        x = x * 1.0
        for _ in range(int(os.environ.get(name, "1"))):
            x.sum().item()

def test_regresses(syncguard):
    with syncguard.generation(tokens=4):
        loop(4, "READS_A")

def test_improves(syncguard):
    with syncguard.generation(tokens=4):
        loop(4, "READS_B")

def test_steady(syncguard):
    with syncguard.generation(tokens=4):
        loop(4, "READS_C")

@pytest.mark.skipif(os.environ.get("WITH_OLD") != "1", reason="removed in the PR")
def test_removed(syncguard):
    with syncguard.generation(tokens=1):
        loop(1, "READS_C")

HOSTILE = ["@octocat", "<img src=x onerror=alert(1)>", "a|b", "**bold** [x](http://e.vil)", "#1 `code`"]

@pytest.mark.skipif(os.environ.get("WITH_NEW") != "1", reason="added in the PR")
@pytest.mark.parametrize("name", HOSTILE, ids=HOSTILE)
def test_new(syncguard, name):
    with syncguard.generation(tokens=1):
        loop(1, "READS_C")
"""


def run(cwd: Path, *args: str, **env: str) -> None:
    """A pytest run of the plugin in ``cwd`` (a subprocess, as CI runs it)."""
    variables = {name: "1" if name.startswith("READS") else "0" for name in ("READS_A", "READS_B", "READS_C")}
    variables.update({"WITH_OLD": "0", "WITH_NEW": "0", **env})
    subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--syncguard", *args],
        cwd=cwd, env={**os.environ, **variables}, capture_output=True, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pr_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Baselines from main (READS_B=2, with test_removed), then the PR's JUnit and results files, written by xdist
    workers."""
    root = tmp_path_factory.mktemp("pr")
    (root / "test_suite.py").write_text(SUITE)
    run(root, "--syncguard-update-baselines", READS_B="2", WITH_OLD="1")
    run(root, "--junitxml=pr.xml", "--syncguard-json=pr.json", "-p", "xdist", "-n", "2", READS_A="3", WITH_NEW="1")
    assert (root / "pr.xml").exists() and (root / "pr.json").exists() and (root / "baselines" / "cpu.json").exists()
    return root


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_syncguard.cli", "report", *args], cwd=cwd, capture_output=True, text=True
    )


def test_report_lists_regressions_first_then_improvements_new_and_missing(pr_run: Path) -> None:
    done = cli(pr_run, "pr.xml", "--baselines", "baselines", "--markdown", "out/comment.md", "--json", "out/r.json")
    assert done.returncode == 0, done.stderr
    text = (pr_run / "out" / "comment.md").read_text()
    lines = text.splitlines()
    assert lines[0] == "**❌ syncguard: 1 regressions** (8 tests on cpu: 1 regressed, 1 improved, 5 new, 1 missing)"
    order = [lines.index(h) for h in ("### Regressions", "### Improvements", "### New tests (no baseline entry)")]
    assert order == sorted(order)
    assert (
        order[0]
        < lines.index("### In the baselines, not in this run")
        < lines.index("<details><summary>All measured tests</summary>")
    )
    # Each regressed metric has its row: the syncs, and the operators the extra reads dispatched.
    regressed = lines[order[0] + 4 : lines.index("### Improvements")]
    assert r"| test\_suite\.py\:\:test\_regresses | cpu | syncs | 4 → 12 | \+8 \(\+200\.0\%\) |" in regressed
    assert any(r"| test\_suite\.py\:\:test\_regresses | cpu | ops |" in line for line in regressed)
    assert r"| test\_suite\.py\:\:test\_improves | cpu | syncs | 8 → 4 | \-4 \(\-50\.0\%\) |" in lines
    assert r"- test\_suite\.py\:\:test\_removed on cpu" in lines
    data = json.loads((pr_run / "out" / "r.json").read_text())
    assert {t["nodeid"]: t["comparison"]["status"] for t in data["tests"]}["test_suite.py::test_steady"] == "unchanged"
    assert data["missing"] == [{"device": "cpu", "nodeid": "test_suite.py::test_removed"}]
    failing = cli(pr_run, "pr.xml", "--baselines", "baselines", "--fail-on-regression")
    assert failing.returncode == 1 and failing.stdout.startswith("**❌ syncguard: 1 regressions**")


def test_the_results_file_gives_the_junit_files_verdicts_and_what_explains_them(pr_run: Path) -> None:
    """The results document (sent by the xdist workers, written by the controller) judges as the JUnit file does,
    and carries what a JUnit file does not: the sync site whose count grew."""
    from_results, from_junit = (compare_run([pr_run / name], pr_run / "baselines") for name in ("pr.json", "pr.xml"))
    verdicts = [{(c.case.nodeid, c.case.device_slug, c.comparison.status) for c in r.cases} for r in (from_results,
                from_junit)]  # fmt: skip
    assert verdicts[0] == verdicts[1] and len(verdicts[0]) == 8
    assert from_results.missing == from_junit.missing == [("cpu", "test_suite.py::test_removed")]
    (regressed,) = from_results.with_status("regression")
    lines = regressed.comparison.explanation.lines()
    assert any(line.startswith("sync site grew test_suite.py:") and "x.sum().item()" in line for line in lines)
    (without,) = from_junit.with_status("regression")
    assert not without.comparison.explanation  # a JUnit file carries no details
    done = cli(pr_run, "pr.json", "--baselines", "baselines")
    assert done.returncode == 0 and "x\\.sum\\(\\)\\.item\\(\\)" in done.stdout, done.stderr


def test_without_a_baselines_folder_the_runs_own_comparison_is_reported(pr_run: Path) -> None:
    done = cli(pr_run, "pr.xml", "--json", "r.json")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("**❌ syncguard: 1 regressions** (8 tests on cpu: 1 regressed, 1 improved, 5 new, 0")


def test_hostile_test_ids_cannot_inject_markdown_html_or_mentions(pr_run: Path) -> None:
    text = cli(pr_run, "pr.xml", "--baselines", "baselines").stdout
    hostile = [line for line in text.splitlines() if "test\\_new" in line]
    assert len(hostile) == 10  # in the new-tests list and in the details table
    for line in hostile:  # every bracket, star, backtick and angle from the run is escaped
        assert not re.search(r"(?<!\\)[<>\[\]()*`]", line), line
    assert "@octocat" not in text and "**bold**" not in text
    assert "#1" not in text and "`code`" not in text
    assert "@\u200boctocat" in text and r"\<img src\=x onerror\=alert\(1\)\>" in text
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            # Every table row has as many cells as its header: no '|' from a test id splits a cell.
            assert len(re.findall(r"(?<!\\)\|", line)) in (4, 5, 6), line
    assert escape("a\nb\x1b[31m\u202e") == "a b \\[31m "


def test_files_from_several_jobs_are_merged_and_deduplicated(pr_run: Path) -> None:
    run(pr_run, "--junitxml=again.xml", "-k", "steady or improves")
    merged = compare_run([pr_run / "pr.xml", pr_run / "again.xml"], pr_run / "baselines")
    assert len(merged.cases) == 8
    assert len([c for c in merged.cases if c.case.nodeid == "test_suite.py::test_steady"]) == 1


def test_a_long_report_is_cut_to_githubs_limit_with_the_full_one_as_a_file(pr_run: Path) -> None:
    run_ = compare_run([pr_run / "pr.xml"], pr_run / "baselines")
    text, cut = render(run_, limit=1200, full_report="comment.full.md")
    assert cut and len(text) <= 1200
    assert text.startswith("**❌ syncguard: 1 regressions**") and "### Regressions" in text
    assert text.rstrip().endswith(
        "more lines left out to fit a GitHub comment. The full report is comment\\.full\\.md._"
    )
    full, cut_full = render(run_)
    assert not cut_full and len(full) < COMMENT_LIMIT


MANY = """
import pytest
import torch

@pytest.mark.parametrize("case", range(700))
def test_case_with_a_long_descriptive_name_for_the_generation_strategy_under_test(syncguard, case):
    with syncguard.generation(tokens=1):
        torch.ones(1).sum().item()
"""


def test_cli_truncates_a_report_over_65536_characters(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_many=MANY)
    pytester.runpytest_subprocess("--syncguard", "--junitxml=many.xml", "-q")
    done = cli(pytester.path, "many.xml", "--markdown", "comment.md")
    assert done.returncode == 0, done.stderr
    comment = (pytester.path / "comment.md").read_text()
    full = (pytester.path / "comment.full.md").read_text()
    assert len(comment) <= COMMENT_LIMIT < len(full)
    assert "Report truncated" in comment and "comment\\.full\\.md" in comment
    assert comment.count("<details>") == comment.count("</details>")
    assert "full report in comment.full.md" in done.stderr
    # Printed (`syncguard report many.xml > out.md`), the report was cut as a comment is, and its stderr said
    # "full report in None": the full text was written nowhere. Printed, it is whole.
    printed = cli(pytester.path, "many.xml")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.strip() == full.strip() and "truncated" not in printed.stderr
    # A reader that goes away (`| head -1`) ends the command quietly, as a shell's pipeline expects.
    head = subprocess.run(f"{sys.executable} -m pytest_syncguard.cli report many.xml | head -1", shell=True,
                          cwd=pytester.path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert head.stdout.count("\n") == 1 and "Traceback" not in head.stderr and "BrokenPipe" not in head.stderr


def test_bad_input_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "bad.xml").write_text("<testsuite><testcase")
    done = cli(tmp_path, "bad.xml")
    assert done.returncode == 2 and "bad.xml: not a" in done.stderr
    (tmp_path / "plain.xml").write_text('<testsuite name="x" tests="1"><testcase name="t" classname="c"/></testsuite>')
    done = cli(tmp_path, "plain.xml")
    assert done.returncode == 2 and "no measured test in plain.xml" in done.stderr


def test_report_of_a_real_h100_run(tmp_path: Path) -> None:
    """The JUnit file of the strategy suite on an H100 (tests/data/h100_suite), against the baseline it was
    compared with. That run judged host timings against a baseline from another host and failed 6 tests on them,
    every count unchanged; judged the same way the report agrees, and by default it finds no regression."""
    data = Path(__file__).parent / "data" / "h100_suite"
    junit = tmp_path / "junit-nvidia-h100-80gb-hbm3.xml"
    junit.write_bytes(gzip.decompress((data / "junit-nvidia-h100-80gb-hbm3.xml.gz").read_bytes()))
    judged = compare_run([junit], data / "baselines", host_timings=True)
    assert judged.devices == ["nvidia-h100-80gb-hbm3"] and len(judged.cases) == 17 and not judged.missing
    own = {c.case.nodeid: c.case.baseline_status for c in judged.cases}
    assert {c.case.nodeid: c.comparison.status for c in judged.cases} == own  # same verdicts as the run's
    text, _ = render(judged)
    assert text.splitlines()[0].startswith("**❌ syncguard: 6 regressions** (17 tests on nvidia\\-h100\\-80gb\\-hbm3")
    run_ = compare_run([junit], data / "baselines")
    assert not run_.with_status("regression")
    speed = next(c for c in run_.cases if c.case.nodeid.endswith("test_speed[cuda_graph]"))
    assert speed.case.metrics["syncs"] == 1 and speed.comparison.status == "unchanged"
    assert "0 regressed" in render(run_)[0].splitlines()[0]  # the run's own failures stay listed as such
    assert "| seconds | 0\\.664 s → 0\\.9515 s | \\+0\\.2875 \\(\\+43\\.3\\%\\) |" in text


def test_every_case_names_its_device_slug_and_an_older_cuda_case_without_one_is_not_filed_as_cuda(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    from pytest_syncguard.report.junit import read_cases

    # A test kept out of baselines has no comparison: its case still names the baseline file of its device.
    pytester.makepyfile(
        test_off="import pytest\n\n@pytest.mark.syncguard(baseline=False)\n@pytest.mark.max_syncs(5)\n"
        "def test_off(syncguard):\n    with syncguard.generation(tokens=1):\n        pass\n"
    )
    pytester.runpytest("--syncguard", "--junitxml=off.xml", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    (case,) = read_cases(pytester.path / "off.xml")
    assert case.baseline_status is None and case.device_slug == "cpu"
    assert '<property name="syncguard.device_slug" value="cpu"' in (pytester.path / "off.xml").read_text()
    # Files written before every case carried a slug: a CUDA case's GPU model is unknown, not "cuda".
    older = (
        '<testsuite name="s" tests="2"><testcase classname="t" name="{name}"><properties>'
        '<property name="syncguard.verdict" value="pass"/><property name="syncguard.device" value="{device}"/>'
        "</properties></testcase></testsuite>"
    )
    for device, slug in (("cuda", "unknown"), ("cpu", "cpu")):
        (tmp_path / f"{device}.xml").write_text(older.format(name=f"test_{device}", device=device))
        assert [c.device_slug for c in read_cases(tmp_path / f"{device}.xml")] == [slug]
