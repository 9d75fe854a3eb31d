"""The sampled timeline probe (``--syncguard-timeline=sampled``): CUPTI's PM sampler over each timed region of a
test's call, which adds nothing to a kernel launch (bench/bench_pm_sampling.py).

The sampler reads, every :data:`INTERVAL_NS` of device time, how many cycles of the graphics engine the compute
work kept active (``gr__compute_cycles_active``). Against the kernels, copies and memsets that CUPTI's activity
records put on the same run's clock, this gave busy time 2.2-7.3% above theirs and the widest gap within 6 µs on an
H100 (README). Its timestamps are the GPU's timer, which the driver keeps on the host's wall clock, so a region
is found by ``time.time_ns()`` stamps taken after device syncs at its ends. Its decode steps are put on the same
clock by CUDA events (:class:`.sampled.StepEvents`): one recorded at each step's start (the loop's marks, its
model's forward calls; of a loop that replays a CUDA graph per step, before its first replay and once each replay is
queued), timed from an anchor event that a short marker kernel follows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..analysis.gaps import FORWARD_STEPS, GRAPH_STEPS, MARKED_STEPS
from ..analysis.sampled import IDLE_BELOW, StepEvents
from ..environment import available_cores
from . import cupti
from .cupti import NOT_INITIALIZED, CuptiError
from .patches import Patches
from .pm_sampling import PmSampler, Samples
from .syncs import PROBE

#: What the sampler reads: the active and the elapsed cycles of the engine that runs kernels (its PM counters).
ACTIVE_CYCLES, ELAPSED_CYCLES = "gr__compute_cycles_active.sum", "gr__cycles_elapsed.max"
INTERVAL_NS = 1000
#: The device buffer the sampler writes into (a 1 s region sampled every microsecond fitted in 512 MiB on an H100).
BUFFER_BYTES = 1 << 30
#: The most samples decoded per region: 2 s at :data:`INTERVAL_NS`. A longer region's timeline is unreliable.
MAX_SAMPLES = 2_000_000
#: Room for samples beyond a region's window (fractional, and a count): the image is sized to the window, its
#: counter data allocated once per test and reused by its next region (no_cache: 0.63 s of 2.4 s a region,
#: bench/bench_pm_decode.py).
WINDOW_MARGIN, SAMPLE_MARGIN = 0.05, 10_000


def samples_for(window: tuple[int, int]) -> int:
    """The most samples a region sampled over ``window`` (ns) may hold: the window at :data:`INTERVAL_NS`, with a
    margin, at most :data:`MAX_SAMPLES`."""
    begin, end = window
    return min(MAX_SAMPLES, int((end - begin) / INTERVAL_NS * (1 + WINDOW_MARGIN)) + SAMPLE_MARGIN)


#: Threads that evaluate a region's samples (each with a CUPTI host object of its own), after its timed run: CUPTI
#: evaluates a sample in about 1 µs, 1.5 s for no_cache's run on one thread of an H100 host, 0.64 s on eight and
#: 0.46 s on sixteen (bench/bench_pm_decode.py).
DECODE_THREADS = min(16, available_cores())
#: The marker kernel's length in clock cycles (``torch.cuda._sleep``): about 50 µs on an H100, long enough that the
#: host has recorded the event after it before it ends (that event then completes at the marker's end).
MARKER_CYCLES = 100_000
#: Where steps come from, in the order a trace prefers them (:func:`.gaps.step_starts`).
STEP_SOURCES = (MARKED_STEPS, FORWARD_STEPS, GRAPH_STEPS)


@dataclass(frozen=True)
class SampledRegion:
    """A region's samples, its window (ns, the host's wall clock, between device syncs) and its step events
    (None: sampled without them, e.g. samples recorded by a benchmark)."""

    samples: Samples
    window: tuple[int, int]
    events: StepEvents | None = None


class _StepClock:
    """The CUDA events of one sampled region: the anchor, the end of the marker kernel launched after it, and one
    event per step start, by source. Recording one costs the host about as much as a kernel launch, and the
    device nothing but the marker before the region's work."""

    def __init__(self) -> None:
        self.anchor = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        self.marker_end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        self.steps: dict[str, list[torch.cuda.Event]] = {source: [] for source in STEP_SOURCES}
        self.anchor.record()
        torch.cuda._sleep(MARKER_CYCLES)  # type: ignore[no-untyped-call]
        self.marker_end.record()

    def mark(self, source: str) -> None:
        if torch.cuda.is_current_stream_capturing():  # a step captured into a graph is marked when it replays
            return
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record()
        self.steps[source].append(event)

    def replay(self, replay: Callable[[torch.cuda.CUDAGraph], None], graph: torch.cuda.CUDAGraph) -> None:
        """Replay ``graph`` as a decode step: an event before the region's first replay, then one once each replay
        is queued, which completes when the replay ends: the next step's start. Recorded after the replay, the
        host's few microseconds for it overlap the replay on the device; before it, they delay the replay, which
        cost a compiled loop that waits for each step 2.7% (bench/bench_step_marks.py)."""
        if not self.steps[GRAPH_STEPS]:
            self.mark(GRAPH_STEPS)
        replay(graph)
        self.mark(GRAPH_STEPS)

    def resolve(self) -> StepEvents:
        """The events' times from the anchor, once the device has finished (after the region's last sync)."""
        source = next((s for s in STEP_SOURCES if self.steps[s]), "")
        chosen = self.steps[source] if source else []
        if source == GRAPH_STEPS:
            chosen = chosen[:-1]  # the end of the last replay starts no step
        elapsed = self.anchor.elapsed_time
        return StepEvents(elapsed(self.marker_end) * 1e3, tuple(elapsed(e) * 1e3 for e in chosen), source)


class SamplerProbe:
    """Process-wide: armed over a test's call, it samples each region asked for (not nested ones)."""

    def __init__(self) -> None:
        self._armed: dict[int, SampledRegion] | None = None
        self._sampler: PmSampler | None = None
        self._sampling = False
        self._clock: _StepClock | None = None
        self.problem: str | None = None
        """Why the sampler could not run in the armed call, if it could not."""
        self._unavailable: str | None = None
        """:meth:`unavailable`'s answer once found ("" when the sampler can run)."""

    @property
    def sampling(self) -> bool:
        """A region is being sampled now."""
        return self._sampling

    @contextmanager
    def arming(self) -> Iterator[dict[int, SampledRegion]]:
        """Arm the probe for a test's call; the yielded dict gets each sampled region by number. The sampler is
        enabled at the first region (after the counting run's trace capture, which finalizes CUPTI) and disabled
        on exit."""
        if self._armed is not None:
            raise RuntimeError("syncguard: the sampler is already armed")
        self._armed, self.problem = {}, None
        try:
            yield self._armed
        finally:
            self._armed = None
            sampler, self._sampler = self._sampler, None
            if sampler is not None:
                sampler.disable()

    def step(self, source: str) -> None:
        """Mark a decode step's start (``source``: :data:`STEP_SOURCES`) in the region being sampled, if any."""
        if self._clock is not None:
            self._clock.mark(source)

    def forward_step(self, module: torch.nn.Module, args: object) -> None:
        """A forward pre-hook: each forward call of the region's model starts a step."""
        self.step(FORWARD_STEPS)

    @contextmanager
    def region(self, number: int) -> Iterator[None]:
        """Sample the block as region ``number`` when armed (and not inside another sampled region)."""
        if self._armed is None or self._sampling or self.problem is not None or not self._enabled():
            yield
            return
        sampler = self._sampler
        assert sampler is not None
        started = time.time_ns()  # the samples' span: from the sampler's start to its stop
        if not self._tried(sampler.start):
            yield
            return
        self._sampling = True
        replays = Patches()
        try:
            with PROBE.unobserved():  # the sampler's own waits are no sync of the test's (nor stamped as one)
                torch.cuda.synchronize()
            begin = time.time_ns()
            clock = self._clock = _StepClock()
            replays.patch(torch.cuda.CUDAGraph, "replay", self._marking_replays)
            yield
            with PROBE.unobserved():
                torch.cuda.synchronize()
            end = time.time_ns()
        finally:
            replays.undo()
            self._sampling, self._clock = False, None
            stopped = self._tried(sampler.stop)
        most = samples_for((started, time.time_ns()))
        decoded: list[Samples] = []
        if stopped and self._tried(lambda: decoded.append(_rows(sampler.decode(most, threads=DECODE_THREADS)))):
            try:
                events = clock.resolve()
            except RuntimeError as exc:  # CUDA's answer for an event it cannot time
                self.problem = self.problem or f"the step events of region #{number} could not be timed: {exc}"
                return
            self._armed[number] = SampledRegion(decoded[0], (begin, end), events)

    def _marking_replays(self, replay: Callable[[torch.cuda.CUDAGraph], None]) -> Callable[..., None]:
        """``CUDAGraph.replay`` marking each replay as a step (a loop that replays one graph per step), in the region
        being sampled."""

        def marked(graph: torch.cuda.CUDAGraph) -> None:
            if self._clock is None:
                replay(graph)
            else:
                self._clock.replay(replay, graph)

        return marked

    def _tried(self, call: Callable[[], object]) -> bool:
        """Run a sampler call; a CUPTI error becomes :attr:`problem` (the test's timeline is then unreliable)."""
        try:
            call()
        except CuptiError as exc:
            self.problem = self.problem or f"the PM sampler failed: {exc}"
            return False
        return True

    def _enabled(self) -> bool:
        if self._sampler is not None:
            return True
        try:
            self._sampler = _enabled_sampler()
        except CuptiError as exc:
            self.problem = f"the PM sampler could not run: {exc}"
            return False
        return True

    def unavailable(self) -> str | None:
        """Why the sampler cannot run in this process (None: it can), found once by enabling and disabling it: no
        libcupti with the sampler, no CUDA device, counters restricted to admin users, a GPU without it."""
        if self._unavailable is None:
            self._unavailable = _unavailable()
        return self._unavailable or None


def _rows(samples: Samples) -> Samples:
    """A region's samples as the timeline reads them: runs of wholly active or idle samples merged into one row
    each (a region keeps about a fifteenth of its samples' memory; the analysis reads it as fast)."""
    return samples.compacted(ACTIVE_CYCLES, ELAPSED_CYCLES, IDLE_BELOW)


def _enabled_sampler() -> PmSampler:
    """The sampler of the timeline's metrics on the current device, enabled; :class:`CuptiError` says why not."""
    sampler = PmSampler(
        (ACTIVE_CYCLES, ELAPSED_CYCLES),
        interval_ns=INTERVAL_NS,
        device=torch.cuda.current_device(),
        buffer_bytes=BUFFER_BYTES,
    )
    try:
        sampler.enable()
    except CuptiError as exc:
        if exc.status != NOT_INITIALIZED:
            raise
        # A capture that stopped finalized CUPTI (TEARDOWN_CUPTI): an activity call attaches it again.
        cupti.load().cuptiActivityFlushAll(0)
        sampler.enable()
    return sampler


def _unavailable() -> str:
    """Why the PM sampler cannot run here, in words ("" when it can): the library first (so that a machine without
    CUDA says what it lacks for it), then the device, then enabling it once."""
    try:
        cupti.load()
    except CuptiError as exc:
        return exc.message
    except OSError as exc:
        return f"libcupti could not be loaded: {exc}"
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        _enabled_sampler().disable()
    except CuptiError as exc:
        return exc.message
    return ""


SAMPLER = SamplerProbe()
