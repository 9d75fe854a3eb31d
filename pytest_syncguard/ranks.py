"""Each rank of a multi-process launch (``torchrun``) writes its own results.

Under ``torchrun --nproc-per-node 2 -m pytest ... --syncguard-json r.json --junitxml j.xml`` every rank runs the
same pytest with the same options: both wrote r.json and j.xml, the last writer won, and one rank's results
vanished without a word. Each rank's files get its rank in their names (``r.rank1.json``, ``j.rank1.xml``), its
results say which rank of how many wrote them, and ``syncguard report`` joins them (:mod:`.document.launch`).
torchrun's own variables tell the rank (``RANK``, ``WORLD_SIZE``). A rank that the launcher stops (SIGTERM, after
another rank failed) leaves its stack beside its results (:func:`record_stop`): where it waited."""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Rank:
    """This process's place in a launch of several."""

    rank: int
    world_size: int

    def path(self, path: str) -> str:
        """``path`` with the rank before its suffix: ``r.json`` -> ``r.rank1.json``."""
        given = Path(path)
        return str(given.with_name(f"{given.stem}.rank{self.rank}{given.suffix}"))

    def describe(self) -> str:
        return f"rank {self.rank} of {self.world_size} (torchrun: RANK, WORLD_SIZE)"


def launch_id() -> str:
    """What the processes of one launch share and another launch's do not: torchrun's run id (``--rdzv-id``, a fresh
    one under ``--standalone``) and its rendezvous address, as the launcher set them."""
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    where = f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}"
    return f"{run}@{where}" if run or where != ":" else ""


def current() -> Rank | None:
    """This process's rank where it is one of several (WORLD_SIZE > 1), else None. A ``WORLD_SIZE`` that is no
    whole number, or one over 1 without a ``RANK`` below it, is a ValueError that names both: each rank's files would
    otherwise overwrite the others'."""
    raw_world, raw_rank = os.environ.get("WORLD_SIZE", "").strip(), os.environ.get("RANK", "").strip()
    if not raw_world:
        return None
    if not (raw_world.isascii() and raw_world.isdigit()):
        raise ValueError(f"WORLD_SIZE={raw_world!r} is not a number of processes (torchrun sets WORLD_SIZE and RANK)")
    world = int(raw_world)
    if world <= 1:
        return None
    if not (raw_rank.isascii() and raw_rank.isdigit()) or int(raw_rank) >= world:
        said = f"RANK={raw_rank!r}" if raw_rank else "no RANK"
        raise ValueError(
            f"WORLD_SIZE={world} with {said}: each process of a launch of {world} needs its RANK, 0 to "
            f"{world - 1}, so that its results files are its own"
        )
    return Rank(int(raw_rank), world)


#: The most of a stop file read back (the stacks of one process's threads).
MAX_STOP_BYTES = 64 * 1024
#: Frames of these are the interpreter's and libraries' (torch's collectives), not the test's.
_LIBRARY = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ")


def stop_path(results: Path) -> Path:
    """Where a rank whose results go to ``results`` writes its stack when stopped: ``r.rank0.json`` ->
    ``r.rank0.stopped.txt``."""
    return results.with_name(f"{results.stem}.stopped.txt")


def record_stop(results: Path) -> Callable[[], None]:
    """Until the returned function is called: on SIGTERM (torchrun stops the other ranks so when one fails), this
    process's Python stack goes to :func:`stop_path` before the signal's previous action. ``faulthandler`` writes it
    from the signal handler itself, so a rank blocked inside a collective, never back in Python, still says where it
    waited. The function puts SIGTERM back as it was and removes the file where nothing was written to it."""
    path = stop_path(results)
    out = path.open("w", encoding="utf-8")
    faulthandler.register(signal.SIGTERM, file=out, all_threads=False, chain=True)

    def restore() -> None:
        faulthandler.unregister(signal.SIGTERM)
        out.close()
        if path.is_file() and path.stat().st_size == 0:
            path.unlink()

    return restore


def stopped_at(results: Path) -> str | None:
    """Where the rank that wrote ``results`` was when SIGTERM stopped it, from its stop file: its innermost frame of
    the test's own code (``file:line in function``), else its innermost frame, said to be a library's; None where it
    was not stopped so (it finished, or died of another cause: SIGKILL, a crash)."""
    path = stop_path(results)
    try:
        found = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(found.st_mode):  # a FIFO would hang the reader, a link point anywhere on the runner
        what = "a symbolic link" if stat.S_ISLNK(found.st_mode) else "not a regular file"
        return f"a place not known (its stop file {path.name} is {what}: not read)"
    try:
        with path.open("rb") as stop:
            text = stop.read(MAX_STOP_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    frames = re.findall(r'^\s*File "(.*)", line (\d+) in (\S+)', text, re.MULTILINE)
    if not frames:
        return None
    own = next((f for f in frames if not any(part in f[0] for part in _LIBRARY)), None)
    path, line, function = own or frames[0]
    return f"{path}:{line} in {function}" + (
        "" if own else " (a library's code: none of the test's own was on the stack)"
    )
