"""Whether a syncguard option's value, given after a space, moved pytest's rootdir.

pytest chooses the rootdir before the plugin's options are known: ``--syncguard-baselines /elsewhere`` then reads
as a test path, the rootdir becomes a common ancestor of it and of the tests, and every node id (so every key of
a baseline) moves with it (``mine/tests/test_a.py::test_a``). ``--syncguard-baselines=/elsewhere`` does not."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path

import pytest

#: The plugin's options that take a path.
PATH_OPTIONS = ("--syncguard-baselines", "--syncguard-json", "--syncguard-artifacts")


def _rootdir(args: Sequence[str], config: pytest.Config) -> Path | None:
    """The rootdir pytest chooses for ``args`` (its own function; None where this pytest's differs too much)."""
    try:
        from _pytest.config.findpaths import determine_setup
    except ImportError:
        return None
    offered = {
        "inifile": config.known_args_namespace.inifilename,
        "override_ini": None,
        "args": list(args),
        "rootdir_cmd_arg": config.known_args_namespace.rootdir or None,
        "invocation_dir": config.invocation_params.dir,
    }
    try:
        accepted = inspect.signature(determine_setup).parameters
        found = determine_setup(**{k: v for k, v in offered.items() if k in accepted})
    except (TypeError, ValueError, pytest.UsageError):
        return None
    return Path(found[0])


def space_form_problem(config: pytest.Config) -> str | None:
    """A usage error's text where a path option given as ``--option VALUE`` moved the rootdir, else None."""
    args = [str(a) for a in config.invocation_params.args]
    spaced = [(i, args[i]) for i in range(len(args) - 1) if args[i] in PATH_OPTIONS]
    if not spaced:
        return None
    values = {i + 1 for i, _ in spaced}
    positional = [a for i, a in enumerate(args) if not a.startswith("-")]
    without = [a for i, a in enumerate(args) if not a.startswith("-") and i not in values]
    moved, kept = _rootdir(positional, config), _rootdir(without, config)
    if moved is None or kept is None or moved == kept or moved != config.rootpath:
        return None
    given = [(option, args[i + 1]) for i, option in spaced]
    paths = " and ".join(value for _, value in given)
    return (
        f"{', '.join(f'{o} {v}' for o, v in given)}: pytest took {paths} for "
        f"{'a test path' if len(given) == 1 else 'test paths'} when it chose the rootdir ({moved} instead of "
        f"{kept}), and every node id, so every baseline key, would move with it: write "
        f"{' '.join(f'{o}={v}' for o, v in given)}"
    )
