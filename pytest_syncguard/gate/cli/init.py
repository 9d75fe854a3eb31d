"""``syncguard init``: a repository's CI for syncguard (the GPU workflow, the action vendored or referenced), a first
budget test and pytest's configuration; a file it did not write, or one edited since, is left alone and said."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from ..scaffold import ACTION_DIR, FORK_SAFE, SINGLE, TEST, Choices, default_package, files, pytest_configuration
from ..scaffold.owned import MANIFEST, apply


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    init = commands.add_parser(
        "init", help="write a repository's syncguard CI workflow, action, first budget test and pytest configuration"
    )
    init.add_argument("dir", nargs="?", default=".", help="the repository (default: the current folder's)")
    init.add_argument(
        "--fork-safe",
        action="store_true",
        help="three workflows (the GPU job reads only; the comment and the history are written by workflows of the "
        "default branch), for a repository that takes pull requests from forks",
    )
    init.add_argument(
        "--action",
        metavar="OWNER/REPO@COMMIT",
        help="reference the action at this public address, pinned to a full commit, instead of vendoring it",
    )
    init.add_argument(
        "--package",
        metavar="REQUIREMENT",
        help="the pip requirement runners install pytest-syncguard from (default: where pip installed this one from)",
    )
    init.add_argument("--tests", default=TEST, help=f"the suite's pytest arguments (default {TEST})")
    init.add_argument(
        "--install",
        default="python -m pip install -e .",
        help="the command that installs the project and what its suite needs on the runner",
    )
    init.add_argument("--runs-on", default="self-hosted, gpu", help="the GPU runner's labels, comma-separated")
    init.add_argument("--branch", default="main", help="the default branch (pushes to it are recorded)")
    init.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not Path(args.dir).is_dir():
        print(f"syncguard init: {args.dir}: no such folder", file=sys.stderr)
        return 2
    root = _repository(Path(args.dir))
    if args.package:
        package, warning = args.package, None
    elif args.action:
        package, warning = f"pytest-syncguard @ git+https://github.com/{args.action.replace('@', '.git@', 1)}", None
    else:
        package, warning = default_package()
    configured = pytest_configuration(root)
    choices = Choices(package=package, tests=args.tests, fork_safe=args.fork_safe, action=args.action,
                      runs_on=args.runs_on, branch=args.branch, install=args.install)  # fmt: skip
    try:
        written = files(choices, pytest_configured=configured is not None)
        outcomes = apply(root, written, retired=tuple(SINGLE if args.fork_safe else FORK_SAFE))
    except (ValueError, OSError) as error:  # a manifest it cannot read, a file it cannot write: named, no traceback
        print(f"syncguard init: {error}", file=sys.stderr)
        return 2
    for outcome in outcomes:
        print(f"{outcome.done:>10}  {outcome.path}" + (f" ({outcome.why})" if outcome.why else ""))
    print(f"{'recorded':>10}  {MANIFEST} (what init wrote: a later run replaces only those files, unedited)")
    if configured is not None:
        print(f"pytest's configuration is {configured.relative_to(root)}: left alone (`syncguard = true` there prints "
              "the table on every run)")  # fmt: skip
    if warning:
        example = "'pytest-syncguard @ git+https://github.com/OWNER/pytest-syncguard@COMMIT'"
        print(f"syncguard init: {warning}: give --package (a requirement a runner can install, such as {example})",
              file=sys.stderr)  # fmt: skip
    workflows = ", ".join(FORK_SAFE if args.fork_safe else SINGLE)
    where = f"the action in {ACTION_DIR}" if args.action is None else f"the action at {args.action}"
    print(
        f"\nNext: run `python -m pytest {args.tests}`, commit {workflows}, {where} and the test, and push to "
        f"{args.branch}: its first run is the history's run 1 (docs/tutorial-ci.md rehearses it on a CPU)."
    )
    return 0


def _repository(folder: Path) -> Path:
    """The git repository's root of ``folder``, or the folder itself outside git."""
    found = subprocess.run(["git", "-C", str(folder), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    return Path(found.stdout.strip()) if found.returncode == 0 else folder.resolve()
