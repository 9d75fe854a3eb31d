"""The CUDA-graph probe: in a region, each CUDA graph recorded and each CUDA graph torch.compile skipped, each named
by what did it and the call site that led to it.

- A recording is a capture begun (``torch.cuda.CUDAGraph.capture_begin``, which ``torch.cuda.graph``,
  ``make_graphed_callables`` and torch.compile's CUDA graph trees all call): a new capture of the user's graph, a
  tree's first recording of a compiled function, or its re-recording (a new input shape or static address).
- A skip is torch.compile's own count of graphs it decided to run without CUDA graphs (inductor's
  ``cudagraph_skips`` counter), with the message torch logs for it ("skipping cudagraphs due to ..."), read from
  its ``cudagraphs`` log while the region runs.
- An eager call is a step that fell back to eager, also where the skip was decided before the region (in a
  warm-up run): a call of a compiled graph on CUDA whose CUDA graphs torch skipped when it compiled it (with the
  reason it kept), or a call that a CUDA graph tree ran with neither a replay nor a recording outside its warm-up
  (an input it mutates and does not manage, its re-recording limit).

It never imports dynamo or inductor: a process that has not loaded them has compiled nothing. Where inductor was
first loaded inside the region (its first compilation), the calls after it are not seen: each skip decided there
counts as one eager call, the one that compiled it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import torch

from ..analysis.counts import RegionCounts, top_items
from .call_sites import first_user_frame
from .patches import Patches

#: The logger of inductor's "skipping cudagraphs due to ..." messages (its ``cudagraphs`` artifact log).
SKIP_LOG = "torch._inductor.cudagraph_utils.__cudagraphs"
_TREES = os.path.join("_inductor", "cudagraph_trees.py")
#: Longest reason kept (a skip can name every input of a graph).
_REASON_CHARS = 240
#: The functions of each CUDA graph tree recorded so far in this process, by (manager, function id): a later
#: recording of one is a re-recording.
_RECORDED: set[tuple[int, int]] = set()


def _site(frame: FrameType | None) -> str:
    """Where the user's code led to it: ``file.py:line in function`` (the file's name only, as the compile probe
    names places), or "?". The code inductor generated (in its cache folder) is torch's, not a call site."""
    generated = os.environ.get("TORCHINDUCTOR_CACHE_DIR")  # set by inductor once it has compiled
    while True:
        found, site, _ = first_user_frame(frame)
        if found is None or site is None:
            return "?"
        if not (generated and os.path.abspath(site.filename).startswith(generated + os.sep)):
            return f"{os.path.basename(site.filename)}:{site.lineno} in {site.function}"
        frame = found.f_back


def _recording(frame: FrameType | None) -> str:
    """What began a capture: a CUDA graph tree (which function, first recording or again, or the graph that holds
    its memory pool), else the user's own."""
    tree = False
    while frame is not None:
        if frame.f_code.co_filename.endswith(_TREES):
            tree = True
            if frame.f_code.co_name == "record_function":
                manager, function = frame.f_locals.get("self"), frame.f_locals.get("function_id")
                key = (id(manager), getattr(function, "id", -1))
                again = key in _RECORDED
                _RECORDED.add(key)
                what = f"torch.compile's CUDA graph trees {'re-recorded' if again else 'recorded'} function {key[1]}"
                why = _rerecord_reason(frame.f_back)
                return f"{what} ({why})" if why else what
        frame = frame.f_back
    if tree:
        return "torch.compile's CUDA graph trees captured the graph that holds their memory pool"
    return "a CUDA graph captured (torch.cuda.graph or CUDAGraph.capture_begin)"


def _rerecord_reason(frame: FrameType | None) -> str:
    """torch's reason for re-recording where the tree gives one: the invariant its recorded graph failed (a static
    input's address changed, ...), kept by the tree's ``_run`` as ``unexpected_rerecord_reason``."""
    if frame is None or not frame.f_code.co_filename.endswith(_TREES):
        return ""
    reason = frame.f_locals.get("unexpected_rerecord_reason")
    if callable(reason):  # computed on demand (torch's debug mode computes it up front)
        try:
            reason = reason()
        except Exception:  # torch's own diagnostics: never fail the user's step over them
            return ""
    return _one_line(reason) if reason else ""


def _skipped(graph: Any) -> str | None:
    """torch's reason for running a compiled graph (inductor's ``CompiledFxGraph``) without CUDA graphs, in the
    words it logged it with; None where it runs with them, runs on no CUDA device, or was not asked to."""
    if "cuda" not in getattr(graph, "device_types", ()):
        return None
    reason = getattr(graph, "disabled_cudagraphs_reason", None)
    info = getattr(graph, "cudagraph_info", None)
    failed = getattr(info, "cudagraph_fail_reasons", None)
    if not reason and failed:
        reason = f"skipping cudagraphs due to {failed}"
    return _one_line(reason) if reason else None


def _one_line(reason: object) -> str:
    """torch's reason as one line of at most :data:`_REASON_CHARS` characters."""
    return " ".join(str(reason).split())[:_REASON_CHARS]


def _tree_fallback(manager: Any, function: Any) -> str:
    """Why a CUDA graph tree ran a function without a CUDA graph, from the tree's own state."""
    key = getattr(function, "id", function)
    hints = getattr(manager, "non_cudagraph_managed_mutation_hint", {})
    if any(found.get(function) for found in hints.values()):
        why = "it mutates an input that CUDA graphs do not manage (inductor's mutated inputs)"
    elif any(found.get(function, 0) for found in getattr(manager, "num_rerecord", {}).values()):
        why = "it was re-recorded past the limit (cudagraph_unexpected_rerecord_limit)"
    else:
        why = "torch gave no reason"
    return f"torch.compile's CUDA graph trees ran function {key} without a CUDA graph: {why}"


def _skips() -> int | None:
    """inductor's count of CUDA graphs it skipped (None: dynamo is not loaded)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return None if utils is None else int(utils.counters["inductor"]["cudagraph_skips"])


class _SkipMessages(logging.Handler):
    """Takes inductor's skip messages while a region runs, each with the user's call site; passes each on as
    logging would have without it (to the log's own handlers, else Python's last resort)."""

    def __init__(self, pass_on: bool) -> None:
        super().__init__(logging.DEBUG)
        self.found: Counter[str] = Counter()
        self.pass_on = pass_on
        """Whether the log would have shown the message without this handler (its level let warnings through)."""

    def emit(self, record: logging.LogRecord) -> None:
        reason = record.getMessage()[:_REASON_CHARS]
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename == logging.__file__:  # logging's own frames
            frame = frame.f_back
        self.found[f"{reason} at {_site(frame)}"] += 1
        log = logging.getLogger(record.name)
        alone = not [h for h in log.handlers if h is not self] and not log.propagate
        if self.pass_on and alone and logging.lastResort is not None and record.levelno >= logging.lastResort.level:
            logging.lastResort.handle(record)


@contextmanager
def counting(found: list[RegionCounts]) -> Iterator[None]:
    """Append to ``found`` the CUDA graphs recorded and skipped during the block."""
    recorded: Counter[str] = Counter()
    eager: Counter[str] = Counter()
    replays = [0]

    def wrap(capture_begin: Any) -> Any:
        def counted(graph: Any, *args: Any, **kwargs: Any) -> Any:
            frame = sys._getframe(1)
            recorded[f"{_recording(frame)} at {_site(frame)}"] += 1
            return capture_begin(graph, *args, **kwargs)

        return counted

    def wrap_replay(replay: Any) -> Any:
        def counted(graph: Any, *args: Any, **kwargs: Any) -> Any:
            replays[0] += 1
            return replay(graph, *args, **kwargs)

        return counted

    def wrap_run(run: Any) -> Any:
        def counted(manager: Any, new_inputs: Any, function: Any) -> Any:
            before = replays[0] + recorded.total()
            out = run(manager, new_inputs, function)
            state = getattr(getattr(manager, "path_state", None), "name", "")
            if replays[0] + recorded.total() == before and state != "WARMUP":
                eager[f"{_tree_fallback(manager, function)} at {_site(sys._getframe(1))}"] += 1
            return out

        return counted

    def wrap_call(call: Any) -> Any:
        def counted(graph: Any, inputs: Any) -> Any:
            reason = _skipped(graph)
            if reason is not None:
                eager[f"{reason} at {_site(sys._getframe(1))}"] += 1
            return call(graph, inputs)

        return counted

    patches = Patches()
    output_code = sys.modules.get("torch._inductor.output_code")  # loaded by a compilation before the region
    if output_code is not None:
        patches.patch(output_code.CompiledFxGraph, "__call__", wrap_call)
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is not None:  # a tree exists only once a graph was compiled for CUDA graphs: then it is loaded
        patches.patch(torch.cuda.CUDAGraph, "replay", wrap_replay)
        patches.patch(trees.CUDAGraphTreeManager, "_run", wrap_run)
    log = logging.getLogger(SKIP_LOG)
    level, silenced = log.level, log.getEffectiveLevel() > logging.WARNING
    messages = _SkipMessages(pass_on=not silenced)
    before = _skips()
    patches.patch(torch.cuda.CUDAGraph, "capture_begin", wrap)
    log.addHandler(messages)
    if silenced:  # heard here, not shown
        log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        patches.undo()
        log.removeHandler(messages)
        log.setLevel(level)
    skips = (_skips() or 0) - (before or 0)
    reasons = messages.found
    if skips > sum(reasons.values()):  # inductor counts some skips without a message (a graph with no CUDA input)
        reasons["skipped without a message (inductor's cudagraph_skips counter)"] += skips - sum(reasons.values())
    if output_code is None:  # its calls were not seen: each skip decided here ran at least the call that compiled it
        eager.update(reasons)
    items = {"graph_recordings": recorded, "graph_skips": reasons, "eager_graph_calls": eager}
    values = {name: sum(counted.values()) for name, counted in items.items()}
    values["graph_skips"] = skips  # inductor's own count
    found.append(RegionCounts(values, {name: top_items(counted) for name, counted in items.items()}))
