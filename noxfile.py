"""The CPU tests under the lowest versions pyproject.toml claims (``nox -s lowest``), beside the main run of
.ci/run, which takes the newest a fresh install gets (tools/install.sh). The lowest session runs a reduced set
that covers the plugin's hooks, the probes, the CLI and the examples' use of transformers.

torch is the CPU build 2.13.0 here as in the main run: the registry serves older torch only as CUDA builds of
several GB, which CI cannot install in its time. The GPU machine's image (torch 2.11) runs the GPU tests."""

from __future__ import annotations

import nox

nox.options.sessions = ["lowest"]

#: The lowest release of each claimed requirement (pyproject.toml), as pins.
LOWEST = [
    "pytest==8.0.*", "transformers==4.56.*", "orjson==3.8.*", "filelock==3.12.*", "junitparser==3.1.*",
    "ninja==1.11.*", "numpy==1.26.*", "pytest-xdist==3.5.*", "pyyaml==6.0.*", "cmarkgfm==2024.11.*",
]  # fmt: skip
#: The tests run under them: hooks and markers (an xdist run among them), the probes (operators through the native
#: extension), the CLI's report, the examples' strategies, the rootdir check. About 70 s on the 2-core machine.
REDUCED = [
    "tests/test_markers.py", "tests/test_sync_counts.py", "tests/test_counters.py", "tests/test_report.py",
    "tests/test_strategies.py", "tests/test_rootdir.py",
]  # fmt: skip


@nox.session(venv_backend="venv")
def lowest(session: nox.Session) -> None:
    """The reduced set under the lowest claimed versions, in a virtual environment of its own."""
    session.install("torch==2.13.0", *LOWEST)
    session.install("--no-deps", "-e", ".")
    session.run("python", "-m", "pip", "list", "--format=freeze")
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", "-q", *REDUCED, *session.posargs,
                env={"SYNCGUARD_NATIVE": "1"})  # fmt: skip
