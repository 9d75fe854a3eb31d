"""The suite's warm runs (tests/warm.py) are runs of their own: arguments, folder, environment, streams and status;
and so are the runs its launcher forks, which end when the launcher is ended."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import warm

REPORTER = """
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "path0": sys.path[0], "mine": os.environ.get("MINE"),
                  "imported": "pytest_syncguard.plugin" in sys.modules, "pid": os.getpid()}))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize("cold", ["0", "1"])
def test_a_warm_run_is_the_fresh_interpreters_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cold: str) -> None:
    (tmp_path / "reporter.py").write_text(REPORTER)
    monkeypatch.setenv(warm.COLD, cold)
    env = {**os.environ, "MINE": "yes", "PYTHONPATH": str(tmp_path)}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = warm.run([sys.executable, "-m", "reporter", "3", "x y"], cwd=elsewhere, env=env, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip() == "to stderr"
    seen = json.loads(done.stdout)
    assert seen["argv"] == ["3", "x y"] and seen["cwd"] == str(elsewhere) and seen["mine"] == "yes"
    assert seen["path0"] == str(elsewhere) and not seen["imported"] and seen["pid"] != os.getpid()


def test_a_warm_run_past_its_timeout_is_killed(tmp_path: Path) -> None:
    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run([sys.executable, "-m", "sleeper"], cwd=tmp_path, env=env, timeout=1)


LAUNCHED = """
import json, os, sys, time



def test_report():
    kept = int(os.environ["KEPT_FD"])
    with open(os.environ["REPORT"], "w") as out:
        json.dump({"pid": os.getpid(), "session": os.getsid(0), "executable": sys.executable,
                   "cwd": os.getcwd(), "kept": os.read(kept, 5).decode()}, out)
    if os.environ.get("HANG"):
        time.sleep(120)
"""


@pytest.fixture
def launcher() -> str:
    path = warm.launcher()
    if path is None:
        pytest.skip(f"{warm.COLD}=1: no launcher")
    return path


def _launch(launcher: str, tmp_path: Path, **env: str) -> tuple[subprocess.Popen[str], Path]:
    (tmp_path / "test_launched.py").write_text(LAUNCHED)
    report = tmp_path / "report.json"
    read, write = os.pipe()
    os.write(write, b"kept!")
    os.close(write)
    variables = {**os.environ, "KEPT_FD": str(read), "REPORT": str(report), **env}
    command = [launcher, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_launched.py"]
    process = subprocess.Popen(command, cwd=tmp_path, env=variables, pass_fds=(read,), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)  # fmt: skip
    os.close(read)
    return process, report


def _reported(report: Path) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
            return dict(json.loads(report.read_text()))
        time.sleep(0.05)
    raise AssertionError("the launched run wrote no report")


def test_the_launcher_forks_a_pytest_run_with_its_descriptors_in_a_session_of_its_own(
    launcher: str, tmp_path: Path
) -> None:
    process, report = _launch(launcher, tmp_path)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0, out
    seen = _reported(report)
    assert seen["session"] == seen["pid"] != process.pid  # forked from the server, not the launcher's own
    assert seen["executable"] == launcher and seen["cwd"] == str(tmp_path) and seen["kept"] == "kept!"


def test_any_other_command_is_the_interpreters_own(launcher: str) -> None:
    done = subprocess.run([launcher, "-c", "import sys; print(sys.executable, 'torch' in sys.modules)"],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert done.stdout.split() == [sys.executable, "False"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_signal_to_the_launcher_ends_its_run(launcher: str, tmp_path: Path, signum: int) -> None:
    """SIGTERM is passed on to the run's session, and the launcher ends as its run did; SIGKILL, which the launcher
    cannot pass on, makes the server end the run's session: nothing of it outlives the launcher."""
    process, report = _launch(launcher, tmp_path, HANG="1")
    run = int(str(_reported(report)["pid"]))
    process.send_signal(signum)
    process.communicate(timeout=60)
    assert process.returncode == -signum
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{run}").exists():
        time.sleep(0.05)
    assert not Path(f"/proc/{run}").exists(), "the run outlived its launcher"
