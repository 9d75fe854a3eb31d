"""The ``syncguard`` command: ``init`` (a repository's CI for syncguard, a first budget test), ``report`` (a run's
results against baselines -> Markdown/JSON verdicts), ``comment`` (one sticky comment per GPU model on a GitHub pull
request or a GitLab merge request), ``trace`` (gap analysis of any PyTorch profiler trace), ``baselines`` (show or
diff baseline files), ``history`` (the default branch's runs), ``device`` (this machine's slug and fingerprint) and
``ab`` (base and head of a change run in interleaved rounds on this runner, and judged)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from . import ab, baselines, comment, device, history, init, post_artifact, report, trace

#: Each command is a module with ``add(commands)``, its parser, and ``run(args)``, its exit status.
COMMANDS = (init, report, ab, comment, post_artifact, trace, baselines, history, device)


def build_parser() -> argparse.ArgumentParser:
    """The ``syncguard`` command's parser: every subcommand and option (docs/reference/cli.md is made from it)."""
    # The module docstring without its reStructuredText markup: --help is read in a terminal.
    parser = argparse.ArgumentParser(prog="syncguard", description=(__doc__ or "").replace("``", ""))
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "warmup_steps", 0) < 0 or getattr(args, "top", 1) < 0:
        parser.error("--warmup-steps and --top must be >= 0")
    if args.command == "baselines" and len(args.files) > 2:
        parser.error("baselines: give one file to show or two to compare")
    try:
        return int(args.run(args))
    except KeyboardInterrupt:  # before a command's own handling of it (ab's first half second): no traceback
        print(f"syncguard {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`syncguard trace f.json | head -1`): nothing more to say
        # Python flushes stdout again at exit: point it at nothing, or that flush raises once more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports a command ended by SIGPIPE
