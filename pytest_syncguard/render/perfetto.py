"""A judged GPU timeline as a file Perfetto (ui.perfetto.dev) and chrome://tracing open: the Trace Event Format's
JSON object, gzipped, whatever source recorded the timeline (a profiler trace or the PM sampler). No torch here.

Each region of the test is a process of the file, with four tracks: the device's busy over time as a counter
(the busy fraction of each stretch between two gaps, 0 in the gaps), the judged steps and the judged gaps as
slices (the widest with their causes), and the counted syncs as instant events named by their call sites. Times
are microseconds from the first region's start (``origin_us`` in the file's ``syncguardTimeline`` entry, on the
source's clock), so that they keep their precision. :func:`load` reads a file back into the plugin's timelines,
from the drawn events alone: ``syncguard trace`` on the file gives the numbers the test was judged on.
"""

from __future__ import annotations

import gzip
import itertools
import json
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis.gaps import AttributedGap, BusyRun, StepSpan, SyncMark, Timeline
from ..files import MAX_UNPACKED_BYTES, TooLarge, read_unpacked

KEY = "syncguardTimeline"
SCHEMA = "pytest-syncguard/timeline"
SCHEMA_VERSION = 1
SUFFIX = ".timeline.json.gz"
BUSY, STEPS, GAPS, SYNCS = "device busy", "steps", "gaps", "syncs"
#: The tracks of a region (thread ids inside its process); the busy counter belongs to the process itself.
TRACKS = {STEPS: 1, GAPS: 2, SYNCS: 3}
NOT_ATTRIBUTED = "not attributed"


@dataclass(frozen=True)
class TimelineFiles:
    """Where the files of judged timelines go (``directory()`` gives the folder when first asked), and whether
    every test's is kept (else those of the tests that broke a GPU timeline budget)."""

    directory: Callable[[], Path]
    every: bool = False


class TimelineFileError(Exception):
    """The file is no syncguard timeline this version reads; the message names it."""


@dataclass(frozen=True)
class Region:
    """One judged timeline of a test: its region's place among the test's regions with GPU work (1-based)."""

    region: int
    timeline: Timeline
    shown: bool = False
    """The one the test's summary and failure text show (its run closest to the judged median)."""


def render(nodeid: str, source: str, regions: Sequence[Region]) -> dict[str, Any]:
    """The Trace Event Format object of a test's judged timelines (``source``: what recorded them)."""
    first = min((r.timeline.origin_us + _earliest(r.timeline) for r in regions), default=0.0)
    events: list[dict[str, Any]] = []
    described = []
    for place in regions:
        pid = place.region
        timeline = place.timeline
        origin = first - timeline.origin_us  # the region's times less this are the file's
        events += _names(pid, f"region {place.region} of {nodeid}", place.region)
        events += _busy(pid, timeline.runs, origin)
        events += [
            {
                "ph": "X",
                "cat": "step",
                "name": f"step {s.step}",
                "pid": pid,
                "tid": TRACKS[STEPS],
                "ts": s.start - origin,
                "dur": s.end - s.start,
                "args": {"step": s.step},
            }
            for s in timeline.step_spans
        ]
        events += _gaps(pid, timeline, origin)
        events += [
            {
                "ph": "i",
                "s": "t",
                "cat": "sync",
                "name": m.label,
                "pid": pid,
                "tid": TRACKS[SYNCS],
                "ts": m.time - origin,
                "args": {"site": m.label},
            }
            for m in timeline.syncs
        ]
        described.append(
            {
                "region": place.region,
                "shown": place.shown,
                "steps": timeline.steps,
                "warmup_steps": timeline.warmup_steps,
                "judged_steps": timeline.judged_steps,
                "gpu_ops": timeline.gpu_ops,
                "steps_from": timeline.steps_from,
            }
        )
    # The entry that identifies the file comes first, so that a reader can tell it from a profiler trace at once.
    return {
        KEY: {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "nodeid": nodeid,
            "source": source,
            "origin_us": first,
            "regions": described,
        },
        "displayTimeUnit": "ns",
        "traceEvents": events,
    }


def _earliest(timeline: Timeline) -> float:
    """The earliest time a timeline draws (a sync may come before the device's first busy stretch)."""
    times = [
        *(r.start for r in timeline.runs[:1]),
        *(m.time for m in timeline.syncs),
        *(s.start for s in timeline.step_spans),
    ]
    return min(times, default=0.0)


def _names(pid: int, name: str, order: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": order}},
    ]
    events += [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": track}}
        for track, tid in TRACKS.items()
    ]
    return events


def _busy(pid: int, runs: Sequence[BusyRun], origin: float) -> list[dict[str, Any]]:
    """The busy counter: each stretch's busy fraction from its start, 0 from its end (where a gap begins)."""
    events = []
    for run in runs:
        length = run.end - run.start
        fraction = run.busy / length if length > 0 else 1.0
        events.append(
            {"ph": "C", "name": BUSY, "pid": pid, "tid": 0, "ts": run.start - origin, "args": {"busy": fraction}}
        )
        events.append({"ph": "C", "name": BUSY, "pid": pid, "tid": 0, "ts": run.end - origin, "args": {"busy": 0.0}})
    return events


def _gaps(pid: int, timeline: Timeline, origin: float) -> list[dict[str, Any]]:
    """Every judged gap as a slice where it lies (between two stretches), with its cause where it was attributed."""
    if len(timeline.runs) != len(timeline.gaps_us) + 1:
        raise ValueError(f"a timeline of {len(timeline.runs)} busy stretches cannot hold {len(timeline.gaps_us)} gaps")
    causes = {round(g.start_us, 3): g for g in timeline.top_gaps}
    events = []
    for before, length in zip(timeline.runs, timeline.gaps_us, strict=False):
        found = causes.get(round(before.end, 3))
        args: dict[str, Any] = {"duration_us": length}
        if found is not None:
            args |= {"cause": found.cause, "detail": found.detail, "step": found.step, "next_op": found.next_op}
        else:
            args |= {"cause": NOT_ATTRIBUTED, "detail": f"only the {len(timeline.top_gaps)} widest gaps are attributed"}
        name = f"{args['cause']} gap" if found is not None else "gap"
        events.append(
            {
                "ph": "X",
                "cat": "gap",
                "name": name,
                "pid": pid,
                "tid": TRACKS[GAPS],
                "ts": before.end - origin,
                "dur": length,
                "args": args,
            }
        )
    return events


def write(path: Path, nodeid: str, source: str, regions: Sequence[Region]) -> Path:
    """Write the file (gzipped JSON) and return its path."""
    data = json.dumps(render(nodeid, source, regions), allow_nan=False, separators=(",", ":"))
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=6) as sink:
        sink.write(data)
    return path


def _text(path: Path, limit: int, raise_with: str) -> str:
    try:
        return read_unpacked(path, limit, raise_with).decode("utf-8")
    except TooLarge as exc:
        raise TimelineFileError(str(exc)) from None


def is_timeline_file(path: Path) -> bool:
    """Whether ``path`` is a syncguard timeline file (its first key), read no further than needed."""
    try:
        with path.open("rb") as raw:
            head = raw.read(2)
        opener: Any = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rb") as source:
            return bool(source.read(len(KEY) + 4).lstrip(b'{ \n"').startswith(KEY.encode()))
    except (OSError, EOFError, zlib.error):  # unreadable or corrupt: not this kind of file, as far as can be told
        return False


def load(path: Path, limit: int = MAX_UNPACKED_BYTES, raise_with: str = "") -> tuple[dict[str, Any], list[Region]]:
    """The file's description and its timelines, rebuilt from its events: busy from the counter, the gaps from
    the gap slices, the steps and syncs from theirs (unpacked to at most ``limit`` bytes; ``raise_with`` says how
    to raise it). Anything malformed is a :class:`TimelineFileError` naming the file."""
    try:
        data = json.loads(_text(path, limit, raise_with))
        meta = data[KEY]
        if meta.get("schema") != SCHEMA or meta.get("schema_version") != SCHEMA_VERSION:
            found = f"{meta.get('schema')!r} version {meta.get('schema_version')!r}"
            raise TimelineFileError(f"{path}: timeline schema {found}, expected {SCHEMA!r} {SCHEMA_VERSION}")
        by_pid: dict[int, list[dict[str, Any]]] = {}
        for event in data["traceEvents"]:
            by_pid.setdefault(int(event["pid"]), []).append(event)
        origin = float(meta["origin_us"])
        regions = [_region(entry, by_pid.get(int(entry["region"]), []), origin) for entry in meta["regions"]]
    except (
        OSError,
        EOFError,
        zlib.error,
        UnicodeDecodeError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        OverflowError,
        RecursionError,
    ) as exc:
        if isinstance(exc, TimelineFileError):
            raise
        raise TimelineFileError(f"{path}: not a readable syncguard timeline ({exc!r})") from exc
    return meta, regions


def _region(entry: dict[str, Any], events: Sequence[dict[str, Any]], origin: float) -> Region:
    """A region's timeline with its times as in the file (µs from the file's ``origin_us``)."""
    counter = sorted((float(e["ts"]), float(e["args"]["busy"])) for e in events if e["ph"] == "C")
    runs = [
        BusyRun(t, t_next, value * (t_next - t)) for (t, value), (t_next, _) in itertools.pairwise(counter) if value > 0
    ]
    slices = sorted((e for e in events if e["ph"] == "X"), key=lambda e: float(e["ts"]))
    gaps = [e for e in slices if e.get("cat") == "gap"]
    attributed = [
        AttributedGap(
            float(e["dur"]),
            float(e["ts"]),
            e["args"].get("step"),
            e["args"]["cause"],
            e["args"]["detail"],
            e["args"].get("next_op", ""),
        )
        for e in gaps
        if e["args"]["cause"] != NOT_ATTRIBUTED
    ]
    steps = [
        StepSpan(int(e["args"]["step"]), float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in slices
        if e.get("cat") == "step"
    ]
    syncs = [SyncMark(float(e["ts"]), str(e["name"])) for e in events if e["ph"] == "i"]
    span = counter[-1][0] - counter[0][0] if counter else 0.0
    timeline = Timeline(
        steps=int(entry["steps"]),
        warmup_steps=int(entry["warmup_steps"]),
        judged_steps=int(entry["judged_steps"]),
        gpu_ops=int(entry["gpu_ops"]),
        span_us=span,
        busy_us=sum(r.busy for r in runs),
        gaps_us=tuple(float(e["dur"]) for e in gaps),
        top_gaps=tuple(sorted(attributed, key=lambda g: -g.duration_us)),
        steps_from=str(entry["steps_from"]),
        origin_us=origin,
        runs=tuple(runs),
        step_spans=tuple(steps),
        syncs=tuple(sorted(syncs)),
    )
    return Region(int(entry["region"]), timeline, bool(entry["shown"]))
