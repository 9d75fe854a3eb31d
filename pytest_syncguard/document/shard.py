"""Which shard of a suite split across CI jobs a results document holds (``--syncguard-shard K/N``, or
``SYNCGUARD_SHARD``), so that the report, given every job's documents, sees a shard that left none: a job that died,
or whose artifact was not downloaded, fails the run by name rather than shrinking it. No torch here."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..metrics import Metrics
from .measured import MeasuredTest

#: The most shards a suite may say it is split into: a larger count is a damaged or hostile file.
MAX_SHARDS = 4096


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1 to ``count``) of a suite split into ``count``."""

    index: int
    count: int

    def problem(self) -> str | None:
        if not 1 <= self.index <= self.count <= MAX_SHARDS:
            return f"shard {self.index} of {self.count} is no shard (1 <= K <= N <= {MAX_SHARDS})"
        return None

    def __str__(self) -> str:
        return f"shard {self.index} of {self.count}"


def parsed(text: str) -> Shard:
    """``K/N`` as a shard; ValueError saying what is wrong with it."""
    index, slash, count = text.strip().partition("/")
    if not (slash and index.isdigit() and count.isdigit()):
        raise ValueError(f"{text!r}: give the shard as K/N (shard K of N, from 1)")
    shard = Shard(int(index), int(count))
    if (problem := shard.problem()) is not None:
        raise ValueError(f"{text!r}: {problem}")
    return shard


def missing(shards: Iterable[Shard], device_slug: str) -> list[MeasuredTest]:
    """A failed entry for each shard of a split that no document said it held, named (and, where two documents say
    different splits, each split's own)."""
    counts: dict[int, set[int]] = {}
    for shard in shards:
        counts.setdefault(shard.count, set()).add(shard.index)
    entries = []
    for count, present in sorted(counts.items()):
        for index in range(1, count + 1):
            if index not in present:
                name = str(Shard(index, count))
                why = (
                    f"{name} left no results file (its job failed before writing one, or its file was not given to "
                    "the report)"
                )
                entries.append(
                    MeasuredTest(name, "", None, 0, Metrics({}, {}), 0, {}, (), error=why, device_slug=device_slug)
                )
    return entries
