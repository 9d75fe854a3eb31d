"""A path option given after a space must not move pytest's rootdir, and with it every baseline key.

pytest chooses the rootdir before it knows the plugin's options: ``--syncguard-baselines /elsewhere`` read as a
test path, the rootdir became a common ancestor, node ids became ``mine/tests/...`` and no baseline key matched
(every test read "new"). Such a run now stops with a usage error that says why and what to write."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture
def project(tmp_path: Path) -> Path:
    mine = tmp_path / "mine"
    (mine / "tests").mkdir(parents=True)
    (mine / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    (mine / "tests" / "test_a.py").write_text("def test_a(syncguard):\n    pass\n")
    (tmp_path / "elsewhere").mkdir()
    return mine


def _pytest(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--syncguard", *args]
    return subprocess.run(command, cwd=project, capture_output=True, text=True, env=dict(os.environ), timeout=300)


def test_a_baselines_folder_after_a_space_that_moves_the_rootdir_is_a_usage_error(project: Path) -> None:
    elsewhere = str(project.parent / "elsewhere")
    done = _pytest(project, "--syncguard-baselines", elsewhere)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert (
        f"--syncguard-baselines {elsewhere}: pytest took {elsewhere} for a test path when it chose the rootdir "
        f"({project.parent} instead of {project})" in done.stderr
    )
    assert f"write --syncguard-baselines={elsewhere}" in done.stderr


def test_the_same_folder_after_an_equals_sign_keeps_the_node_ids(project: Path) -> None:
    done = _pytest(project, f"--syncguard-baselines={project.parent / 'elsewhere'}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "new (no baseline entry): tests/test_a.py::test_a" in done.stdout


def test_a_folder_inside_the_project_after_a_space_moves_nothing(project: Path) -> None:
    (project / "baselines").mkdir()
    done = _pytest(project, "--syncguard-baselines", "baselines")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tests/test_a.py::test_a" in done.stdout and "mine/tests" not in done.stdout
