"""The options of the ``syncguard`` commands that more than one takes, and the one way a number option is checked
(:func:`bounded`)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

from ...document.ab import MAX_PROCESSES
from ...metrics import parse_tolerance
from ..forge.choice import NAMES

#: The most timed runs a test's measure() makes in an A/B round (each run is a whole generation).
MAX_TIMED_RUNS = 1000
T = TypeVar("T", int, float)


def tolerance(text: str) -> float:
    try:
        return parse_tolerance(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def whole(text: str) -> int:
    """A whole number written in ASCII digits alone (no sign, no space, no other script's digits)."""
    if not (text.isascii() and text.isdigit()):
        raise ValueError(text)
    return int(text)


def bounded(convert: Callable[[str], T], accept: Callable[[T], bool], expected: str) -> Callable[[str], T]:
    """An option's type: ``convert`` of its text where ``accept`` takes the value, else an argparse error saying what
    was ``expected`` and what was given. The one way every number option of the command is checked."""

    def parse(text: str) -> T:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


def forge_options(parser: argparse.ArgumentParser) -> None:
    """``--forge`` and ``--server``: where the comment goes and the links lead."""

    parser.add_argument(
        "--forge",
        choices=NAMES,
        help="the forge of the repository (default: gitlab inside a GitLab job, which sets GITLAB_CI; else github)",
    )
    parser.add_argument(
        "--server", metavar="URL", help="GitLab's server (default: the job's CI_SERVER_URL, else https://gitlab.com)"
    )


probability = bounded(float, lambda v: 0.5 <= v < 1, "a confidence from 0.5 to below 1 (e.g. 0.95)")
effect = bounded(float, lambda v: 0 < v < 1, "a relative change above 0 and below 1 (0.01: 1%)")
timed_runs = bounded(whole, lambda v: v <= MAX_TIMED_RUNS, f"a number of runs from 0 to {MAX_TIMED_RUNS}")
pairs = bounded(whole, lambda v: 1 <= v <= MAX_PROCESSES, f"a number of processes from 1 to {MAX_PROCESSES}")
rounds = bounded(whole, lambda v: 1 <= v <= 1000, "a number of rounds from 1 to 1000")
positive = bounded(whole, lambda v: v > 0, "a pull request number")
seconds = bounded(float, lambda v: 0 < v < math.inf, "a number of seconds > 0")
megabytes = bounded(whole, lambda v: v > 0, "a whole number of megabytes > 0")
