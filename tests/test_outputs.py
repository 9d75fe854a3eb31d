"""An output never destroys an input: a results file named like the JUnit file or put in the baselines folder, a
report written over the results it reads, a device or FIFO replaced by the atomic rename, an A/B's ``--out`` folder
that is a checkout. Each is refused before anything is written, naming the option, and the input stays as it was."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_syncguard.files import write_atomically
from tests import warm

TEST = """
import torch

def test_loop(syncguard):
    with syncguard.generation(tokens=2):
        for _ in range(2):
            torch.ones(2).sum().item()
"""


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_syncguard.gate.cli", *args], cwd=cwd, capture_output=True,
                          text=True, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the test and its baseline file, recorded once."""
    folder = tmp_path_factory.mktemp("recorded")
    (folder / "test_loop.py").write_text(TEST)
    done = warm.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--syncguard",
                     "--syncguard-update-baselines"], cwd=folder)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return folder


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--syncguard-json", "out.xml", "--junitxml", "out.xml"], "--syncguard-json out.xml and --junitxml out.xml"),
        (["--syncguard-json", "baselines/cpu.json"], "is in the baselines folder"),
        (["--syncguard-json", "fifo"], "fifo is not a regular file"),
        (["--syncguard-json", "link.json"], "link.json is a symbolic link"),
    ],
    ids=["junit", "baseline", "fifo", "symlink"],
)
def test_a_results_file_that_would_replace_an_input_is_a_usage_error(
    recorded: Path, tmp_path: Path, options: list[str], said: str
) -> None:
    folder = tmp_path / "run"
    shutil.copytree(recorded, folder)
    baseline = (folder / "baselines" / "cpu.json").read_bytes()
    os.mkfifo(folder / "fifo")
    (folder / "kept.json").write_text("kept\n")
    (folder / "link.json").symlink_to(folder / "kept.json")
    done = warm.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--syncguard", *options], cwd=folder
    )
    assert done.returncode == pytest.ExitCode.USAGE_ERROR and said in done.stderr, done.stderr
    assert (folder / "baselines" / "cpu.json").read_bytes() == baseline
    assert stat.S_ISFIFO(os.lstat(folder / "fifo").st_mode)
    assert (folder / "link.json").is_symlink() and (folder / "kept.json").read_text() == "kept\n"
    assert not (folder / "out.xml").exists()


def test_the_atomic_rename_never_replaces_a_device_or_a_link(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(os.devnull)
    for name in ("fifo", "link"):
        with pytest.raises(OSError, match=r"symbolic link|not a regular file"):
            write_atomically(tmp_path / name, "x")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode) and (tmp_path / "link").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link"]  # no temporary file left


def test_a_report_over_its_own_results_is_refused(recorded: Path, tmp_path: Path) -> None:
    results = (recorded / "baselines" / "cpu.json").read_bytes()  # any file: the paths are checked before reading
    (tmp_path / "r.json").write_bytes(results)
    for option in ("--json", "--markdown"):
        done = cli(tmp_path, "report", "r.json", option, "./r.json")
        assert done.returncode == 2 and f"{option} ./r.json would overwrite the input r.json" in done.stderr
        assert (tmp_path / "r.json").read_bytes() == results


def test_an_ab_out_folder_holding_a_checkout_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "round1-base.json").write_text("committed\n")
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    done = cli(tmp_path, "ab", "--base", "HEAD", "--out", ".", "--", "test_x.py")
    assert done.returncode == 2 and "holds files pytest-syncguard did not write" in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "round1-base.json").read_text() == "committed\n"
