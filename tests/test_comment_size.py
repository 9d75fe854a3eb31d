"""The comment of a large suite: within the forge's limit counted in bytes, the verdict and what failed first, the
tests that passed unchanged counted (their rows in the full report beside it). From the real H100 results of the
strategy suite, its tests repeated under other names as a suite of 2,040 tests would be."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

from pytest_syncguard.judge.run import compare_run
from pytest_syncguard.render.markdown import render

DATA = Path(__file__).parent / "data" / "h100_pr"


def suite_of(tmp_path: Path, copies: int, name: str = "unchanged") -> Path:
    document = json.loads(gzip.decompress((DATA / f"{name}.json.gz").read_bytes()))
    tests = document["tests"]
    document["tests"] = [{**t, "nodeid": f"{t['nodeid']}[copy{i}]"} for i in range(copies) for t in tests]
    path = tmp_path / f"{name}-{copies}.json"
    path.write_text(json.dumps(document))
    return path


def test_a_clean_suite_of_two_thousand_tests_is_a_short_comment_with_every_row_beside_it(tmp_path: Path) -> None:
    results = suite_of(tmp_path, 120)
    done = subprocess.run([sys.executable, "-m", "pytest_syncguard.gate.cli", "report", str(results), "--markdown",
                           "c.md"], cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    comment, full = (tmp_path / "c.md").read_text(), (tmp_path / "c.full.md").read_text()
    assert comment.startswith("**✅ syncguard: no regressions: 2040 tests passed**")
    assert len(comment.encode()) < 4_000, len(comment.encode())
    assert "2040 tests passed unchanged" in comment and "`c.full.md`" in comment
    assert full.count("[copy") >= 2040 and "truncated" not in done.stderr


def test_a_cut_comment_stays_within_the_limit_in_bytes_whatever_its_characters(tmp_path: Path) -> None:
    document = json.loads(gzip.decompress((DATA / "planted-item.json.gz").read_bytes()))
    document["tests"] = [
        {**t, "nodeid": f"{t['nodeid']}[{'é' * 20}🚀{i}]", "verdict": "fail", "outcome": "failed"}
        for i in range(300)
        for t in document["tests"]
    ]
    results = tmp_path / "wide.json"
    results.write_text(json.dumps(document))
    run = compare_run([results], None)
    for limit in (3_000, 20_000):
        text, cut = render(run, limit=limit, full_report="c.full.md", every_row=False)
        assert cut and len(text.encode()) <= limit < len(text) * 2
        assert text.count("<details>") == text.count("</details>")
