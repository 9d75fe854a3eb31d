"""What one test's call records beyond syncs, and what happens to it afterwards.

The GPU timeline and the allocator history are recorded over the whole call when the test's budgets need
them and it runs on CUDA (torch.profiler does not nest, so regions are annotated inside one session and found
again in the trace). After the call the trace is analysed per region, and the files of a failing test are
kept in the artifacts folder.
"""

from __future__ import annotations

import gzip
import re
import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from .analysis import gaps, snapshot, trace_file
from .guard import SyncMeasurement
from .probes.memory import allocation_history
from .probes.timeline import TIMELINE


def artifact_stem(nodeid: str) -> str:
    """A file name for a test: its node id with everything but letters, digits, '.', '-' and '_' replaced."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", nodeid).strip("_")[:180] or "test"


@dataclass
class TestCapture:
    """The timeline and allocator recordings of one test's call."""

    timeline: bool
    memory: bool
    trace_files: list[Path] = field(default_factory=list)
    snapshots: list[Path] = field(default_factory=list)

    @classmethod
    def for_signals(cls, signals: set[str], device: str) -> TestCapture:
        cuda = device != "cpu" and torch.cuda.is_available()
        return cls(timeline=cuda and "timeline" in signals, memory=cuda and "memory" in signals)

    @contextmanager
    def recording(self) -> Iterator[TestCapture]:
        with ExitStack() as stack:
            if self.timeline:
                self.trace_files = stack.enter_context(TIMELINE.capturing())
            if self.memory:
                self.snapshots = stack.enter_context(allocation_history())
            yield self

    def with_timelines(self, measurement: SyncMeasurement, warmup_steps: int) -> SyncMeasurement:
        """The measurement with the GPU timeline of each of its regions, from the recorded trace."""
        if not self.trace_files:
            return measurement
        trace = trace_file.load(self.trace_files[0])
        windows = gaps.regions(trace)
        timelines = tuple(
            gaps.analyze(trace, window=windows[n], warmup_steps=warmup_steps) if n in windows else None
            for n in measurement.region_numbers
        )
        return replace(measurement, timelines=timelines)

    def allocation_sites(self) -> list[dict[str, Any]]:
        """The largest allocation sites of the recorded allocator history (empty when none was recorded)."""
        from .probes.syncs import is_internal_file

        sites: list[dict[str, Any]] = []
        for path in self.snapshots:
            sites.extend(s.to_dict() for s in snapshot.allocation_sites(snapshot.load(path), is_internal_file))
        return sites

    def keep(self, directory: Path | None, nodeid: str, failed: bool) -> list[str]:
        """Move the recordings of a failing test to ``directory`` (trace gzipped); remove them otherwise.
        Returns the paths kept."""
        kept: list[str] = []
        try:
            if failed and directory is not None:
                directory.mkdir(parents=True, exist_ok=True)
                stem = artifact_stem(nodeid)
                for path in self.trace_files:
                    target = directory / f"{stem}.trace.json.gz"
                    with path.open("rb") as source, gzip.open(target, "wb", compresslevel=6) as sink:
                        shutil.copyfileobj(source, sink)
                    kept.append(str(target))
                for path in self.snapshots:
                    target = directory / f"{stem}.memory.pickle"
                    shutil.copyfile(path, target)
                    kept.append(str(target))
        finally:
            for path in [*self.trace_files, *self.snapshots]:
                path.unlink(missing_ok=True)
        return kept
