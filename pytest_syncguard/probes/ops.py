"""The operator probe: how many operators the dispatcher ran in a region, by name, counted by the native
extension's RecordFunction callback (``native/ops.cpp``), the events torch.profiler records as ``cpu_op``.

Counting is per process, like syncs: an operator of any thread counts in the regions open at the time. The
callback is registered while a region is open and removed after, so nothing outside regions pays for it. Where
the native extension cannot be loaded there is no operator count (a budget on it is "not measured"): a
Python-level count would cost several microseconds per operator and change the loop it measures.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..analysis.counts import RegionCounts, difference, top_items
from ..analysis.trace_file import profiler_only
from . import children
from .native import NATIVE


def unavailable() -> str | None:
    """Why operators are not counted in this process (None: they are)."""
    NATIVE.load()
    why = NATIVE.unavailable
    return None if why is None else f"the native operator counter {why}"


#: Why a region in which a child process of the test ran has no operator count.
IN_CHILDREN = "operators run in child processes are not counted, and these ran in the region"


@contextmanager
def counting(found: list[RegionCounts], since_ns: int | None = None) -> Iterator[None]:
    """Count the operators of the block, the test's child processes' with the process's own (from ``since_ns``,
    wall-clock ns: the region's start; each child's total an item of its own); on exit append their total (``ops``)
    and the largest to ``found``, or the reason they were not counted: no native counter here, or a child that ran
    in the block without one."""
    native: Any = NATIVE.load()
    if native is None:
        found.append(RegionCounts(unmeasured={"ops": unavailable() or "not counted"}))
        yield
        return
    theirs_before = children.operators_now() if since_ns is not None else {}
    native.ops_start()
    try:
        before = native.ops_counts()
        yield
        after = native.ops_counts()
    finally:
        native.ops_stop()
    theirs, blind = (
        children.operators_in((since_ns, time.time_ns()), theirs_before) if since_ns is not None else ({}, ())
    )
    if blind:
        found.append(RegionCounts(unmeasured={"ops": f"{IN_CHILDREN}: {'; '.join(blind)}"}))
        return
    # The plugin's own timeline capture makes compiled code open ranges it opens under no other profiler.
    calls = {name: n for name, n in difference(after, before).items() if not profiler_only(name)}
    calls.update(theirs)
    found.append(RegionCounts({"ops": sum(calls.values())}, {"ops": top_items(calls)}))
