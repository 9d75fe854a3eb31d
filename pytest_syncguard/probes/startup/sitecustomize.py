"""syncguard's start-up hook for the Python processes a measured test starts (as coverage.py's for subprocesses):
the plugin puts this folder first on ``PYTHONPATH`` while a measured test runs, so every Python interpreter it
starts (``subprocess``, multiprocessing's spawn and forkserver, at any depth) loads it at start-up, and it starts
the child's sync probe (:mod:`pytest_syncguard.probes.child`). Then it runs the ``sitecustomize`` this one hides,
if there is one. It does nothing where the test's folder for children is not set."""

import os
import sys


def _start() -> None:
    if os.environ.get("SYNCGUARD_CHILDREN"):
        try:
            from pytest_syncguard.probes.child import start

            start()
        except Exception as exc:  # a child must run whatever the probe's fate; the test is told it was not measured
            sys.stderr.write(f"syncguard: this process's syncs are not measured: {exc!r}\n")


def _chain() -> None:
    """Run the next ``sitecustomize`` on ``sys.path`` (the one this hides), as Python would have."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_start()
_chain()
