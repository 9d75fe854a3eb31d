"""The compile probe: what torch.compile compiled in a region, from dynamo's own records of each compilation
(``torch._dynamo.utils.get_compilation_metrics()``): frames compiled, recompilations with their reasons, and
graph breaks (each break makes dynamo compile the rest of the function as a resume frame).

It reads those records at the region's start and end, nothing in between, and never imports dynamo: a process
that has not loaded it has compiled nothing. The test's child processes write theirs as dynamo keeps them
(:mod:`.child`); a region counts those that started inside it with its own, and where a child is still in a
compilation it started there at the region's end, has no compile counts, and says so.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..analysis.counts import RegionCounts, top_items
from . import children

_RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<function>.+)_at_(?P<line>\d+)$")
#: Longest reason kept (a guard failure can list every tensor of a frame).
_REASON_CHARS = 240


def _records() -> list[Any] | None:
    """Dynamo's compilation records, oldest first (None: dynamo is not loaded)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return None
    return [r for r in utils.get_compilation_metrics() if not getattr(r, "is_runtime", False)]


def _kept() -> int:
    utils = sys.modules.get("torch._dynamo.utils")
    limit = getattr(getattr(utils, "_compilation_metrics", None), "maxlen", None)
    return limit if isinstance(limit, int) else 64


def _where(record: Any) -> str:
    """Where a record's frame is, and the child process that compiled it (:class:`.children.Compiled`)."""
    where = f"{os.path.basename(record.co_filename or '?')}:{record.co_firstlineno} {record.co_name}"
    return where + getattr(record, "process", "")


def _new_since(before: Sequence[Any] | None, after: Sequence[Any]) -> list[Any] | None:
    """The records added after ``before`` was read (None: some were dropped, dynamo keeps only the latest)."""
    if not before:
        return None if len(after) >= _kept() else list(after)
    last = before[-1]
    for index in range(len(after) - 1, -1, -1):
        if after[index] is last:
            return list(after[index + 1 :])
    return None


def counts_of(records: Sequence[Any]) -> RegionCounts:
    """Frames compiled, recompiles and graph breaks of these compilation records, with reasons and places."""
    reasons: Counter[str] = Counter()
    breaks: Counter[str] = Counter()
    for record in records:
        if record.recompile_reason:
            reasons[f"{_where(record)}: {record.recompile_reason}"[:_REASON_CHARS]] += 1
        resume = _RESUME.match(record.co_name or "")
        if resume:
            where = os.path.basename(record.co_filename or "?")
            breaks[f"{where}:{resume['line']} in {resume['function']}{getattr(record, 'process', '')}"] += 1
    values = {
        "frames_compiled": len(records),
        "recompiles": sum(reasons.values()),
        "graph_breaks": sum(breaks.values()),
    }
    return RegionCounts(values, {"recompiles": top_items(reasons), "graph_breaks": top_items(breaks)})


@contextmanager
def counting(found: list[RegionCounts], since_ns: int | None = None) -> Iterator[None]:
    """Append to ``found`` what torch.compile compiled during the block (all 0 when nothing), in this process and,
    from ``since_ns`` (wall-clock ns: the region's start), in the test's child processes (:mod:`.children`)."""
    before = _records()
    yield
    after = _records()
    window = (since_ns, time.time_ns()) if since_ns is not None else None
    theirs = children.compiles_in(window) if window is not None else ()
    added = _new_since(before, after) if after is not None else []
    busy = children.compiling_in(window) if window is not None else ()
    if added is None or busy:
        why = (
            f"the region compiled more than the {_kept()} compilations torch._dynamo keeps records of"
            if added is None
            else f"{', '.join(busy)} was still compiling at the region's end, what it compiled not known yet"
        )
        found.append(RegionCounts(unmeasured=dict.fromkeys(("frames_compiled", "recompiles", "graph_breaks"), why)))
        return
    found.append(counts_of([*added, *theirs]))
