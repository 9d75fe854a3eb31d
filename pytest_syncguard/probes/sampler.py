"""The sampled timeline probe (``--syncguard-timeline=sampled``): CUPTI's PM sampler over each timed region of a
test's call, which adds nothing to a kernel launch (bench/bench_pm_sampling.py).

The sampler reads, every :data:`INTERVAL_NS` of device time, how many cycles of the graphics engine the compute
work kept active (``gr__compute_cycles_active``). Against the kernels, copies and memsets that CUPTI's activity
records put on the same run's clock, this gave busy time 2.2-7.3% above theirs and the widest gap within 6 µs on an
H100 (README). Its timestamps are the GPU's timer, which the driver keeps on the host's wall clock, so a region
is found by ``time.time_ns()`` stamps taken after device syncs at its ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .pm_sampling import NOT_INITIALIZED, PmSampler, PmSamplingError, Samples, load_cupti
from .syncs import PROBE

#: What the sampler reads: the active and the elapsed cycles of the engine that runs kernels (its PM counters).
ACTIVE_CYCLES, ELAPSED_CYCLES = "gr__compute_cycles_active.sum", "gr__cycles_elapsed.max"
INTERVAL_NS = 1000
#: The device buffer the sampler writes into (a 1 s region sampled every microsecond fitted in 512 MiB on an H100).
BUFFER_BYTES = 1 << 30
#: The most samples decoded per region: 2 s at :data:`INTERVAL_NS`. A longer region's timeline is unreliable.
MAX_SAMPLES = 2_000_000


@dataclass(frozen=True)
class SampledRegion:
    """A region's samples and its window (ns, the host's wall clock, between device syncs)."""

    samples: Samples
    window: tuple[int, int]


class SamplerProbe:
    """Process-wide: armed over a test's call, it samples each region asked for (not nested ones)."""

    def __init__(self) -> None:
        self._armed: dict[int, SampledRegion] | None = None
        self._sampler: PmSampler | None = None
        self._sampling = False
        self.problem: str | None = None
        """Why the sampler could not run in the armed call, if it could not."""

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

    @contextmanager
    def region(self, number: int) -> Iterator[None]:
        """Sample the block as region ``number`` when armed (and not inside another sampled region)."""
        if self._armed is None or self._sampling or self.problem is not None or not self._enabled():
            yield
            return
        sampler = self._sampler
        assert sampler is not None
        if not self._tried(sampler.start):
            yield
            return
        self._sampling = True
        try:
            with PROBE.unobserved():  # the sampler's own waits are no sync of the test's (nor stamped as one)
                torch.cuda.synchronize()
            begin = time.time_ns()
            yield
            with PROBE.unobserved():
                torch.cuda.synchronize()
            end = time.time_ns()
        finally:
            self._sampling = False
            stopped = self._tried(sampler.stop)
        decoded: list[Samples] = []
        if stopped and self._tried(lambda: decoded.append(sampler.decode(MAX_SAMPLES))):
            self._armed[number] = SampledRegion(decoded[0], (begin, end))

    def _tried(self, call: Callable[[], object]) -> bool:
        """Run a sampler call; a CUPTI error becomes :attr:`problem` (the test's timeline is then unreliable)."""
        try:
            call()
        except PmSamplingError as exc:
            self.problem = self.problem or f"the PM sampler failed: {exc}"
            return False
        return True

    def _enabled(self) -> bool:
        if self._sampler is not None:
            return True
        sampler = PmSampler((ACTIVE_CYCLES, ELAPSED_CYCLES), interval_ns=INTERVAL_NS,
                            device=torch.cuda.current_device(), buffer_bytes=BUFFER_BYTES)  # fmt: skip
        try:
            try:
                sampler.enable()
            except PmSamplingError as exc:
                if exc.status != NOT_INITIALIZED:
                    raise
                # A capture that stopped finalized CUPTI (TEARDOWN_CUPTI): an activity call attaches it again.
                load_cupti().cuptiActivityFlushAll(0)
                sampler.enable()
        except PmSamplingError as exc:
            self.problem = f"the PM sampler could not run: {exc}"
            return False
        self._sampler = sampler
        return True


SAMPLER = SamplerProbe()
