"""The paths a ``syncguard`` command writes, checked before any work: each one writable as what it is (a file, a
folder), none of them an input of the command or another of its outputs by any name."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def path_problem(command: str, outputs: Sequence[tuple[str, str | None, str]]) -> str | None:
    """Why one of a command's paths cannot be used, checked before any work: (option, value, kind) with kind
    ``file`` (written), ``folder`` (written into) or ``checkout`` (an existing folder, read)."""
    from ..files import file_problem, folder_problem

    for option, value, kind in outputs:
        if not value:
            continue
        path = Path(value)
        if kind == "checkout":
            problem = None if path.is_dir() else f"{path} is not an existing folder"
        else:
            problem = file_problem(path) if kind == "file" else folder_problem(path)
        if problem is not None:
            return f"syncguard {command}: {option} {value}: {problem}"
    return None


def clobbers(
    command: str, outputs: Sequence[tuple[str, str | None, str]], inputs: Sequence[tuple[str, str | None]]
) -> str | None:
    """Why an output path would overwrite one of the command's inputs, or another of its outputs (the same file, by
    any name), if so."""
    for index, (option, value, _) in enumerate(outputs):
        if not value:
            continue
        for other, given, _ in outputs[index + 1 :]:
            if given and (Path(value).resolve() == Path(given).resolve() or same_file(value, given)):
                return (
                    f"syncguard {command}: {option} {value} and {other} {given} are one file: one would replace "
                    "the other"
                )
        if not Path(value).exists():
            continue
        for source, given in inputs:
            if given and same_file(value, given):
                name = given if source == "RESULTS" else f"{source} {given}"
                return f"syncguard {command}: {option} {value} would overwrite the input {name}: write it elsewhere"
    return None


def same_file(one: str, other: str) -> bool:
    try:
        return Path(one).exists() and Path(other).exists() and os.path.samefile(one, other)
    except OSError:
        return False
