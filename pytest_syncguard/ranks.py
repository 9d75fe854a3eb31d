"""Each rank of a multi-process launch (``torchrun``) writes its own results.

Under ``torchrun --nproc-per-node 2 -m pytest ... --syncguard-json r.json --junitxml j.xml`` every rank runs the
same pytest with the same options: both wrote r.json and j.xml, the last writer won, and one rank's results
vanished without a word. Until ranks are first-class, each rank's files get its rank in their names
(``r.rank1.json``, ``j.rank1.xml``) and its results say which rank measured them. torchrun's own variables tell
the rank (``RANK``, ``WORLD_SIZE``)."""

from __future__ import annotations

import os
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
        raise ValueError(f"WORLD_SIZE={world} with {said}: each process of a launch of {world} needs its RANK, 0 to "
                         f"{world - 1}, so that its results files are its own")  # fmt: skip
    return Rank(int(raw_rank), world)
