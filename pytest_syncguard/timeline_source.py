"""Which source records a run's GPU timelines, and why: the PM sampler where this process can read the GPU's
counters (it adds nothing to a launch), the trace elsewhere (CUPTI's kernel records, which slow each launch), or
the one ``--syncguard-timeline`` forces. Both give one timeline by one definition (:mod:`.analysis.gaps`); what
differs is the program they see. No torch here: the plugin passes in the sampler's own answer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

AUTO, TRACE, SAMPLED = "auto", "trace", "sampled"
#: What ``--syncguard-timeline`` (ini ``syncguard_timeline``) takes; ``auto`` is the default.
REQUESTS = (AUTO, TRACE, SAMPLED)
#: Where a runner's administrator learns how to give the runner's user the GPU's counters.
RUNNER_HOWTO = "docs/howto/ci-gpu-runner.md"
_WHAT = {
    SAMPLED: "CUPTI's PM sampler over each timed run, which adds nothing to a launch",
    TRACE: "CUPTI's kernel records of each test's call, which slow each launch: an eager loop's gaps and busy "
    "fraction are those of a slower program",
}


@dataclass(frozen=True)
class TimelineSource:
    """The source of a test's GPU timelines (:data:`SAMPLED` or :data:`TRACE`) and why it ran."""

    name: str
    why: str

    @property
    def sampled(self) -> bool:
        return self.name == SAMPLED

    @property
    def fallback(self) -> bool:
        """The trace ran in place of the sampler, which could not run."""
        return self.name == TRACE and self.why.startswith(_FALLBACK)

    def describe(self) -> str:
        """One line for the summary and a failure text: the source, why, and what it measures."""
        title = "sampled" if self.sampled else "from the trace"
        return f"GPU timelines {title} ({self.why}): {_WHAT[self.name]} (docs/explanation/timeline.md)"


_FALLBACK = "the trace stands in: the PM sampler cannot run here"


class SamplerUnavailable(Exception):
    """``--syncguard-timeline=sampled`` where the sampler cannot run: a usage error."""


def choose(requested: str, unavailable: Callable[[], str | None]) -> TimelineSource:
    """The source for ``requested`` (:data:`REQUESTS`); ``unavailable`` says why the sampler cannot run here (None:
    it can), asked only when the answer matters. Forcing the sampler where it cannot run raises
    :class:`SamplerUnavailable`, never a silent fallback."""
    if requested == TRACE:
        return TimelineSource(TRACE, "--syncguard-timeline=trace")
    why = unavailable()
    if requested == SAMPLED:
        if why is not None:
            raise SamplerUnavailable(
                f"--syncguard-timeline=sampled: the PM sampler cannot run here: {why} ({RUNNER_HOWTO} says what a "
                "runner needs; --syncguard-timeline=auto falls back to the trace)"
            )
        return TimelineSource(SAMPLED, "--syncguard-timeline=sampled")
    if why is None:
        return TimelineSource(SAMPLED, "the default where the GPU's counters can be read")
    return TimelineSource(TRACE, f"{_FALLBACK}: {why}; {RUNNER_HOWTO} says what a runner needs")
