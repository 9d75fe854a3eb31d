"""Call sites of recorded syncs, and their grouping for reports (pure functions, no torch)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple


class Frame(NamedTuple):
    """One Python frame: where a sync was requested from (a tuple: cheap to make on the hot path)."""

    filename: str
    lineno: int
    function: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno} in {self.function}"

    def shown(self) -> str:
        """As reports show it, ``file:line in function``: the file relative to the working directory when inside it
        (the same on every checkout, and a link the PR comment can make)."""
        path = os.path.abspath(self.filename)
        cwd = os.getcwd() + os.sep
        return f"{path[len(cwd) :] if path.startswith(cwd) else self.filename}:{self.lineno} in {self.function}"


class SyncEvent(NamedTuple):
    """One blocking host-device sync (or ``syncs`` of them made by one operator call); a tuple, as it is made
    on the hot path."""

    kind: str
    op: str
    syncs: int
    stack: tuple[Frame, ...]
    """The first frames outside torch and this plugin, innermost first; empty when none was found. The probe
    records the short stack for the first sync of each (op, call site) in a measured region and the call site
    alone for the others, which is what :func:`group_sites` shows."""
    allowed: bool = False
    """Made inside ``syncguard.allow()`` (on the same thread): intended, reported, not counted."""
    compiling: bool = False
    """Made by torch.compile's compiler while it compiled (a frame of it lay between the call and its site):
    a one-off of the first call, reported, not counted."""

    @property
    def counted(self) -> bool:
        """Whether it counts against budgets."""
        return not (self.allowed or self.compiling)

    @property
    def site(self) -> Frame | None:
        return self.stack[0] if self.stack else None


@dataclass(frozen=True)
class SyncSite:
    """The syncs of one kind made from one call site, with the stack of the first of them."""

    kind: str
    op: str
    site: Frame | None
    count: int
    stack: tuple[Frame, ...]


def budgeted_syncs(events: Iterable[SyncEvent]) -> int:
    """The syncs that count against budgets: all but those made inside ``allow()`` or by the compiler."""
    return sum(e.syncs for e in events if e.counted)


def group_sites(events: Iterable[SyncEvent]) -> list[SyncSite]:
    """Group events by (kind, op, site), most frequent first, ties by location for a stable order."""
    counts: Counter[tuple[str, str, Frame | None]] = Counter()
    stacks: dict[tuple[str, str, Frame | None], tuple[Frame, ...]] = {}
    for event in events:
        key = (event.kind, event.op, event.site)
        counts[key] += event.syncs
        stacks.setdefault(key, event.stack)
    sites = [SyncSite(kind, op, site, n, stacks[(kind, op, site)]) for (kind, op, site), n in counts.items()]
    return sorted(sites, key=lambda s: (-s.count, str(s.site), s.kind, s.op))
