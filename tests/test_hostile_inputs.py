"""Hostile or broken input wherever the tools read it (results, baselines, options): a clear error naming the file or
option, never a traceback, a hang or memory exhausted, and never a baseline of another GPU model judged silently."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_syncguard.gate.forge.github import GITHUB
from pytest_syncguard.judge.baselines import update
from pytest_syncguard.render.chain import Site
from pytest_syncguard.render.links import SiteLinks
from tests import warm
from tests.test_outputs import TEST, cli


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run's results (cpu) and its baselines folder."""
    root = tmp_path_factory.mktemp("measured")
    (root / "test_loop.py").write_text(TEST)
    done = warm.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--syncguard",
                     "--syncguard-update-baselines", "--syncguard-json", "r.json"], cwd=root)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return root


@pytest.mark.parametrize("kind", ["fifo", "symlink", "another model"])
def test_a_baseline_that_is_no_regular_file_of_its_model_is_refused_naming_it(
    measured: Path, tmp_path: Path, kind: str
) -> None:
    folder = tmp_path / "baselines"
    folder.mkdir()
    target = folder / "cpu.json"
    if kind == "fifo":
        os.mkfifo(target)  # a reader would wait for a writer forever
        said = "not a regular file"
    elif kind == "symlink":
        target.symlink_to(measured / "baselines" / "cpu.json")  # a PR can commit one pointing anywhere
        said = "a symbolic link"
    else:
        text = (measured / "baselines" / "cpu.json").read_text()
        target.write_text(text.replace('"device": "cpu"', '"device": "nvidia-h100-80gb-hbm3"'))
        said = "recorded on 'nvidia-h100-80gb-hbm3', not 'cpu'"
    done = cli(measured, "report", "r.json", "--baselines", str(folder))
    assert done.returncode == 2 and str(target) in done.stderr and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not done.stdout


def test_baselines_of_two_models_compared_say_so(tmp_path: Path) -> None:
    update(tmp_path / "a.json", "nvidia-h100-80gb-hbm3", {"t::a": {"syncs": 1}}, {})
    update(tmp_path / "b.json", "nvidia-h200", {"t::a": {"syncs": 1}}, {})
    done = cli(tmp_path, "baselines", "a.json", "b.json")
    assert done.returncode == 0
    assert done.stdout.splitlines()[0] == (
        "warning: a.json is the baseline of nvidia-h100-80gb-hbm3, b.json of nvidia-h200: another GPU model's device time and memory are not comparable; counts are"
    )


@pytest.mark.parametrize(
    "poison",
    [
        pytest.param(lambda text: text.replace('"syncs": 2', '"syncs": ' + "9" * 5000), id="a number too long"),
        pytest.param(lambda text: text.replace('"syncs": 2', '"syncs": 1e400'), id="infinity"),
        pytest.param(lambda text: text.replace('"notes": [', '"notes": ' + "[" * 100_000), id="deep nesting"),
    ],
)
def test_a_results_document_with_hostile_json_is_an_error_naming_it(measured: Path, tmp_path: Path, poison) -> None:  # type: ignore[no-untyped-def]
    text = (measured / "r.json").read_text()
    assert '"syncs": 2' in text and '"notes": [' in text
    (tmp_path / "bad.json").write_text(poison(text))
    done = cli(tmp_path, "report", "bad.json")
    assert done.returncode == 2 and done.stderr.startswith("syncguard report: bad.json: "), done.stderr
    assert "Traceback" not in done.stderr


def test_a_site_whose_path_no_file_system_can_hold_is_shown_unlinked(tmp_path: Path) -> None:
    links = SiteLinks.of(GITHUB.web("o/r"), "a" * 40, tmp_path)
    assert links is not None
    assert links.url(Site("x" * 5000 + "/y.py", 3)) is None and links.url(Site("a\0b.py", 3)) is None


@pytest.mark.parametrize("value", ["99999999999999999999,1", "-1,-2", "1,2,3", "0,1", "3,4", "5,5"])
def test_a_bad_ab_worker_option_is_a_usage_error(pytester: pytest.Pytester, value: str) -> None:
    pytester.makepyfile(test_loop=TEST)
    done = pytester.runpytest_subprocess(f"--syncguard-ab-worker={value}")
    assert done.ret == pytest.ExitCode.USAGE_ERROR and f"--syncguard-ab-worker {value!r}" in done.stderr.str()
    assert "INTERNALERROR" not in done.stdout.str() + done.stderr.str()


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A file system of 8 kB, filled: every write to it fails with ENOSPC (root mounts it; skipped where none can)."""
    folder = tmp_path / "full"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(folder)], capture_output=True).returncode:
        pytest.skip("no tmpfs can be mounted here (root only)")
    with contextlib.suppress(OSError):  # the filler fills it: its last page may not fit
        (folder / "filler").write_bytes(b"x" * 4096 * 2)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True, check=False)


def test_a_full_disk_under_report_is_an_error_and_leaves_no_part_of_a_file(measured: Path, full_disk: Path) -> None:
    done = cli(measured, "report", "r.json", "--markdown", str(full_disk / "comment.md"))
    assert done.returncode == 2 and "syncguard report: cannot write the report: " in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]  # no temporary or half-written file
