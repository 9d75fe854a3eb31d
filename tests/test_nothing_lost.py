"""Nothing lost, nothing read as a traceback: an output onto an input or another output, a history of a newer
version, numbers no float holds, files in a history folder that are not a GPU model's.

Each case runs the ``syncguard`` command as a user would, on the real H100 results document (tests/data/h100_pr)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_syncguard.document import file as results_file
from pytest_syncguard.judge import history

DATA = Path(__file__).parent / "data" / "h100_pr"
SLUG = "nvidia-h100-80gb-hbm3"


def syncguard(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_syncguard.gate.cli", *args], cwd=cwd, capture_output=True,
                          text=True, check=False)  # fmt: skip


@pytest.fixture
def results(tmp_path: Path) -> Path:
    path = tmp_path / "run.json"
    path.write_bytes(gzip.decompress((DATA / "unchanged.json.gz").read_bytes()))
    return path


@pytest.fixture
def recorded(tmp_path: Path, results: Path) -> Path:
    """A history folder of two runs."""
    folder = tmp_path / "h"
    tests = results_file.read(results)
    for push in range(2):
        history.record(folder, tests, f"{push:040x}", f"t{push}")
    return folder


def test_the_page_never_replaces_a_history_file(tmp_path: Path, recorded: Path) -> None:
    before = (recorded / f"{SLUG}.jsonl").read_bytes()
    done = syncguard(tmp_path, "history", "page", "h", "--out", f"h/{SLUG}.jsonl")
    assert done.returncode == 2 and "would overwrite the input DIR" in done.stderr, done.stderr
    assert (recorded / f"{SLUG}.jsonl").read_bytes() == before
    done = syncguard(tmp_path, "history", "page", "h", "--out", "page.html")
    assert done.returncode == 0, done.stderr


def test_the_json_report_and_the_full_markdown_report_are_never_one_file(tmp_path: Path, results: Path) -> None:
    done = syncguard(tmp_path, "report", str(results), "--json", "r.full.md", "--markdown", "r.md")
    assert (
        done.returncode == 2 and "--json r.full.md and --markdown's full report r.full.md are one file" in done.stderr
    )
    assert not (tmp_path / "r.full.md").exists() and not (tmp_path / "r.md").exists()


def test_a_history_of_a_newer_version_is_read_and_never_rewritten_without_its_fields(
    tmp_path: Path, recorded: Path, results: Path
) -> None:
    path = recorded / f"{SLUG}.jsonl"
    lines = path.read_text().splitlines()
    newer = json.loads(lines[-1])
    newer["runner_labels"] = ["gpu", "h100"]  # a field of a later minor version
    path.write_text("\n".join([*lines[:-1], json.dumps(newer)]) + "\n")
    before = path.read_bytes()
    found = history.read(recorded, SLUG)
    assert found is not None and found.unknown == ("runner_labels",) and len(found.runs) == 2
    done = syncguard(tmp_path, "history", "record", str(results), "--commit", "9" * 40, "--into", "h")
    assert done.returncode == 2 and "written by a newer pytest-syncguard" in done.stderr
    assert "runner_labels" in done.stderr and "Traceback" not in done.stderr
    assert path.read_bytes() == before


def test_numbers_no_float_holds_are_refused_naming_the_file(tmp_path: Path, recorded: Path, results: Path) -> None:
    huge = "1" + "0" * 400
    path = recorded / f"{SLUG}.jsonl"
    lines = path.read_text().splitlines()
    assert '"gpu_us_per_token": ' in lines[-1]
    lines[-1] = lines[-1].replace('"gpu_us_per_token": ', f'"gpu_us_per_token": {huge}, "x": ', 1)
    path.write_text("\n".join(lines) + "\n")
    done = syncguard(tmp_path, "report", str(results), "--history", "h")
    assert done.returncode == 2 and f"{SLUG}.jsonl: not readable" in done.stderr and "Traceback" not in done.stderr
    text = results.read_text()
    (tmp_path / "huge.json").write_text(text.replace('"tokens": ', f'"tokens": {huge}, "y": ', 1))
    done = syncguard(tmp_path, "report", "huge.json")
    assert done.returncode == 2 and "huge.json" in done.stderr and "Traceback" not in done.stderr
    baselines = tmp_path / "b"
    baselines.mkdir()
    (baselines / f"{SLUG}.json").write_text(json.dumps({"schema": "pytest-syncguard/baselines", "schema_version": 3,
                                                         "device": SLUG, "tests": {"t": {"syncs": 1}}})
                                             .replace('"syncs": 1', f'"syncs": {huge}'))  # fmt: skip
    done = syncguard(tmp_path, "report", str(results), "--baselines", "b")
    assert done.returncode == 2 and f"{SLUG}.json" in done.stderr and "Traceback" not in done.stderr


def test_a_file_in_a_history_folder_that_is_no_gpu_models_is_left_out_said(tmp_path: Path, recorded: Path) -> None:
    (recorded / "README.jsonl").write_text("notes\n")
    done = syncguard(tmp_path, "history", "page", "h", "--out", "page.html")
    assert done.returncode == 0, done.stderr
    assert "README.jsonl: not a GPU model's history (its name is no device slug): left out" in done.stderr


@pytest.mark.parametrize("word", ["timeout", "crashed"])
def test_an_outcome_of_another_version_is_no_pass(tmp_path: Path, results: Path, word: str) -> None:
    document = json.loads(results.read_text())
    document["tests"][0]["outcome"] = word
    (tmp_path / "newer.json").write_text(json.dumps(document))
    done = syncguard(tmp_path, "report", "newer.json", "--markdown", "r.md", "--fail-on-regression")
    assert done.returncode == 1 and "1 of 17 tests failed: 1 failed in the run" in done.stderr, done.stderr
    assert (tmp_path / "r.md").read_text().startswith("**❌ syncguard:")


def test_an_ab_verdict_of_another_version_is_no_pass(tmp_path: Path, results: Path) -> None:
    ab = json.loads((DATA / "ab-planted-cuda-graph.json").read_text())
    for test in ab["tests"]:
        for timing in test["timings"].values():
            timing["verdict"] = "regression-likely" if "cuda_graph" in test["nodeid"] else "unchanged"
    (tmp_path / "ab.json").write_text(json.dumps(ab))
    done = syncguard(tmp_path, "report", str(results), "--ab", "ab.json", "--fail-on-regression")
    assert done.returncode == 1 and "1 regressed in the A/B" in done.stderr, done.stderr


def test_a_junit_metric_of_another_version_is_said_and_no_pass(tmp_path: Path, results: Path) -> None:
    from junitparser import JUnitXml, Properties, Property, TestCase, TestSuite

    from pytest_syncguard.render.junit import properties

    (test, *_) = results_file.read(results)
    case = TestCase("t", classname="c")
    props = Properties()
    for name, value in properties(test):
        props.add_property(Property(name, str(value)))
    props.add_property(Property("syncguard.stalls_per_token", "40"))  # a metric of a later version
    props.add_property(Property("syncguard.baseline.stalls_per_token", "4"))
    case.append(props)
    suite = TestSuite("s")
    suite.add_testcase(case)
    xml = JUnitXml()
    xml.add_testsuite(suite)
    xml.write(str(tmp_path / "junit.xml"))
    done = syncguard(tmp_path, "report", "junit.xml", "--markdown", "r.md")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "r.md").read_text()
    assert text.startswith("**⚠️ syncguard:") and "1 file of another version read in part" in text
    assert "this one does not know metric `stalls_per_token`" in text


@pytest.mark.parametrize(("repository", "commit"), [("o/r\n", "a" * 40), ("o/..", "a" * 40), ("../r", "a" * 40),
                                                    ("o/r", "a" * 40 + "\n"), ("o/r", "a" * 39 + "\n")])  # fmt: skip
def test_links_of_a_repository_or_commit_with_a_newline_or_a_climb_are_refused(
    tmp_path: Path, results: Path, repository: str, commit: str
) -> None:
    from pytest_syncguard.gate.forge.github import GITHUB
    from pytest_syncguard.render.links import commit_problem

    assert (GITHUB.repository_problem(repository) or commit_problem(commit)) is not None
    done = syncguard(tmp_path, "report", str(results), "--repository", repository, "--commit", commit)
    assert done.returncode == 2 and ("--repository" in done.stderr or "--commit" in done.stderr) and not done.stdout


@pytest.mark.parametrize("damage", ["negative ratio", "interval backwards", "estimate outside", "negative count"])
def test_ab_numbers_no_rounds_can_give_are_refused_naming_the_test(tmp_path: Path, results: Path, damage: str) -> None:
    ab = json.loads((DATA / "ab-planted-cuda-graph.json").read_text())
    test = ab["tests"][0]
    timing = next(iter(test["timings"].values()))
    if damage == "negative ratio":
        timing["ratio"] = -1.03
    elif damage == "interval backwards":
        timing["low"], timing["high"] = timing["high"], timing["low"]
    elif damage == "estimate outside":
        timing["ratio"] = 9.0
    else:
        test["counts"] = [{"metric": "syncs", "base": 4.0, "head": -40.0, "status": "improvement"}]
    (tmp_path / "ab.json").write_text(json.dumps(ab))
    done = syncguard(tmp_path, "report", str(results), "--ab", "ab.json")
    assert done.returncode == 2 and "A/B report is malformed" in done.stderr and test["nodeid"] in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("ref", ["HEAD~1", "--output=x"])
def test_a_base_ref_whose_baseline_is_not_utf8_or_that_is_an_option_is_an_error(
    tmp_path: Path, results: Path, ref: str
) -> None:
    """A baseline committed in another encoding at the merge base, or a ref that git would take as an option: each an
    error naming it, never a traceback nor a file written."""
    repo = tmp_path / "repo"
    (repo / "baselines").mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@x"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "baselines" / f"{SLUG}.json").write_bytes(b'{"schema": "pytest-syncguard/baselines", "device": "\xff"}')
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    (repo / "baselines" / f"{SLUG}.json").write_text("{}")
    subprocess.run([*git, "commit", "-qam", "head"], check=True)
    done = syncguard(repo, "report", str(results), "--baselines", "baselines", f"--base-ref={ref}")
    assert done.returncode == 2 and f"--base-ref {ref}" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (repo / "x").exists()
