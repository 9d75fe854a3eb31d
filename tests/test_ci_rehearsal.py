"""The GPU job rehearsed without a GPU (``SYNCGUARD_REQUIRE_GPU=false``), as a new user would before a GPU runner
exists: ci/run_gpu_suite.sh on a real repository with a bare origin, a push to main recorded into the history
branch, then a pull request's run judged against that history by the suite and the report alike (pytest's summary
no longer says "new" while the report beside it judged against the history)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
DECODE = """
import pytest
import torch


@pytest.mark.max_syncs_per_token(1)
def test_decode(syncguard):
    x = torch.ones(4)
    with syncguard.generation(tokens=4):
        for _ in range(4):
            x = x * 1.0
            if bool(x.sum() > 0):
                pass
"""


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def job(repo: Path, out: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ROOT / "ci" / "run_gpu_suite.sh"), out], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def test_the_job_rehearses_on_a_cpu_and_a_pr_is_judged_against_the_history_in_both_logs(tmp_path: Path) -> None:
    origin, repo = tmp_path / "origin.git", tmp_path / "repo"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    for key, value in (("user.email", "ci@example.com"), ("user.name", "ci")):
        git(repo, "config", key, value)
    (repo / "test_decode.py").write_text(DECODE)
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "adopt syncguard")
    git(repo, "remote", "add", "origin", str(origin))
    git(repo, "push", "-q", "origin", "main")
    env = {**os.environ, "SYNCGUARD_REQUIRE_GPU": "false", "SYNCGUARD_INSTALL": "true", "SYNCGUARD_NATIVE": "0",
           "SYNCGUARD_TESTS": "test_decode.py", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    env.pop("CUDA_VISIBLE_DEVICES", None)
    first = job(repo, "out1", env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "SYNCGUARD_REQUIRE_GPU=false: a rehearsal" in first.stderr
    assert "new (no baseline entry): test_decode.py::test_decode" in first.stdout  # nothing to judge against yet
    slug = (repo / "out1" / "device-slug").read_text().strip()
    recorded = subprocess.run(["syncguard", "history", "record", f"out1/results-{slug}.json", "--commit",
                               git(repo, "rev-parse", "HEAD").strip(), "--push", "origin"], cwd=repo, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert recorded.returncode == 0, recorded.stderr
    second = job(repo, "out2", env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "new (no baseline entry)" not in second.stdout  # the suite judged against the history's level
    comment = (repo / "out2" / f"report-{slug}.md").read_text()
    assert "judged against the default branch's history: 1 run of" in comment
    assert (repo / "out2" / f"report-{slug}.full.md").is_file()
