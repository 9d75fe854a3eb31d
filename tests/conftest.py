from __future__ import annotations

import contextlib
import gc
import io
import os
import subprocess
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

# One intra-op thread per process, set before torch starts its pool: the tests' pytest-xdist runs put two workers
# on CI's two cores, and two threads apiece spin-waiting on each other made them several times slower (the CPU
# strategy suite's first test: 17.9 s under -n 2, 0.2 s alone). No count depends on it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from tests import warm

# pytester's in-process runs unload every module a run imported. Where hypothesis is installed, its pytest plugin
# imports hypothesis in each run's terminal summary, so each run imported (and assertion-rewrote) it again: about
# 1 s a run, most of the suite's time. Imported here, before any run, it stays.
with contextlib.suppress(ImportError):
    import hypothesis.internal.observability  # noqa: F401

# What these imports made lives as long as the process: the garbage collections of pytester's in-process runs (pytest
# collects twice as a run ends, about 0.1 s each with torch imported) need not walk it.
gc.freeze()

# Subprocess runs of the plugin (pytester, the CLI) find the package from this checkout also where it is not
# installed (the GPU machine, which only has this working tree).
_ROOT = str(Path(__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)
# There, the plugin has no entry point either: subprocess runs load it by name (where it is installed, naming it
# again would register it twice).
if not any(ep.value == "pytest_syncguard.plugin" for ep in entry_points(group="pytest11")):
    os.environ["PYTEST_PLUGINS"] = "pytest_syncguard.plugin"
# pytester gives each test a HOME of its own, where torch's extension builder would build the native kernels
# again for every subprocess run that measures (about 14 s each on a 2-core machine, most of the suite's time):
# they share the user's build cache instead, fixed here before any test moves HOME.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
# Where the environment forbids bytecode files (PYTHONDONTWRITEBYTECODE, common in containers), pytest cannot keep
# the plugin's assertion-rewritten modules and rewrote all of them in every subprocess run (0.85 s of a 4 s run on
# the 2-core machine): the suite's subprocesses may write them (into the ignored __pycache__ folders).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


@pytest.fixture
def bare_remote(tmp_path: Path) -> Path:
    """A bare git repository with a ``main`` of one commit: the remote a CI job's checkout pushes to and fetches."""
    import subprocess

    remote, seed = tmp_path / "remote.git", tmp_path / "seed"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(remote)], check=True)
    seed.mkdir()
    (seed / "README.md").write_text("project\n")
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@x", "commit",
                 "-qm", "main"], ["push", "-q", str(remote), "main"]):  # fmt: skip
        subprocess.run(["git", "-C", str(seed), *args], check=True, capture_output=True)
    return remote


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


#: The process-wide signal state a test could leave behind: child processes inherit an ignored or blocked signal
#: (a later test's Ctrl-C to its subprocess would then never arrive).
_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def _signal_state() -> tuple[object, ...]:
    import signal

    numbers = [getattr(signal, name) for name in _SIGNALS]
    handlers = tuple(signal.getsignal(number) for number in numbers)
    blocked = frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, [])) & set(numbers)
    # What the kernel holds of these signals (a C library's signal() is not in Python's view): ignored, blocked. Other
    # signals are torch's business (a compiled test's workers reset SIGXFSZ on the GPU machine).
    status = Path("/proc/self/status")
    lines = status.read_text().splitlines() if status.exists() else []
    ours = sum(1 << (number - 1) for number in numbers)
    kernel = tuple(
        (line.split(":")[0], int(line.split()[1], 16) & ours) for line in lines if line.startswith(("SigIgn", "SigBlk"))
    )
    return (*handlers, blocked, kernel)


@pytest.fixture
def warm_executable() -> Iterator[str | None]:
    """The warm launcher as ``sys.executable`` for the test (tests/warm.py): the Python processes its code starts
    with it (an A/B and its sides, pytest-xdist's workers) are forked from the warm server. Its path (None where
    every run starts cold)."""
    with warm.standing_in():
        yield warm.launcher()


@pytest.fixture(autouse=True)
def _signals_left_as_found() -> Iterator[None]:
    """Every test leaves the handlers of SIGINT, SIGTERM and SIGHUP, and whether they are ignored or blocked, as it
    found them."""
    before = _signal_state()
    yield
    after = _signal_state()
    assert after == before, f"the test changed the process's signal state: {before} -> {after}"


_cold_popen = pytest.Pytester.popen


def _warm_popen(self: pytest.Pytester, cmdargs: Any, stdout: Any = subprocess.PIPE, stderr: Any = subprocess.PIPE,
                stdin: Any = pytest.Pytester.CLOSE_STDIN, **kw: Any) -> Any:  # fmt: skip
    """pytester's subprocess runs (``runpytest_subprocess``), forked from a process that has torch imported
    (tests/warm.py), where their streams are files as ``Pytester.run`` gives them."""
    if kw or not isinstance(stdout, io.IOBase) or not isinstance(stderr, io.IOBase) or stdin is not self.CLOSE_STDIN:
        return _cold_popen(self, cmdargs, stdout=stdout, stderr=stderr, stdin=stdin, **kw)
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH", "")]))
    process = warm.popen([os.fspath(arg) for arg in cmdargs], env=env, stdout=stdout, stderr=stderr)
    if process is None:
        return _cold_popen(self, cmdargs, stdout=stdout, stderr=stderr, stdin=stdin)
    return process


pytest.Pytester.popen = _warm_popen  # type: ignore[method-assign]
_inprocess = pytest.Pytester.runpytest_inprocess


def _warm_inprocess(self: pytest.Pytester, *args: Any, **kwargs: Any) -> Any:
    """pytester's in-process runs, with the warm launcher as ``sys.executable``: the processes they start with it
    (pytest-xdist's workers) are forked from the warm server too."""
    with warm.standing_in():
        return _inprocess(self, *args, **kwargs)


pytest.Pytester.runpytest_inprocess = _warm_inprocess  # type: ignore[method-assign]
