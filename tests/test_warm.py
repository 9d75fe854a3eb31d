"""The suite's warm runs (tests/warm.py) are runs of their own: arguments, folder, environment, streams and status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
