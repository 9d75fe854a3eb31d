"""Head against base of one timing, from paired rounds run on one runner: the head/base ratio with an exact
distribution-free confidence interval, and a verdict against a minimum effect (pure functions, no torch).

Each round gives one value per side (a test's median over its runs); its log ratio ``log(head / base)`` is one
paired difference. The estimate is the Hodges-Lehmann median of the Walsh averages of those differences, and the
interval the one Wilcoxon's signed-rank test gives (exact, from the test's null distribution; it assumes only
that a difference is as likely above as below its median). With ``n`` rounds the most confident interval is the
range of the ``n`` ratios, at confidence ``1 - 2 / 2**n``: 5 rounds cannot give 95%, 6 can.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

#: Verdicts of a timing A/B.
REGRESSION, IMPROVEMENT, UNCHANGED, INCONCLUSIVE = "regression", "improvement", "unchanged", "inconclusive"


@cache
def _signed_rank_counts(n: int) -> tuple[int, ...]:
    """How many of the 2**n sign patterns give each value of the signed-rank statistic W+ (0 .. n(n+1)/2)."""
    counts = [1]
    for rank in range(1, n + 1):
        longer = counts + [0] * rank
        for value, ways in enumerate(counts):
            longer[value + rank] += ways
        counts = longer
    return tuple(counts)


def rounds_needed(confidence: float) -> int:
    """The fewest rounds whose signed-rank interval reaches ``confidence``."""
    n = 1
    while 2 / 2**n > 1 - confidence:
        n += 1
    return n


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    confidence: float
    """The interval's exact coverage (at least the confidence asked for)."""


def interval(differences: Sequence[float], confidence: float) -> Interval | None:
    """Hodges-Lehmann estimate of the median difference and its signed-rank interval at ``confidence`` or
    more; None when ``len(differences)`` rounds cannot reach it."""
    n = len(differences)
    if n == 0:
        return None
    counts = _signed_rank_counts(n)
    total = 2**n
    # The interval between the k-th smallest and k-th largest Walsh average covers with 1 - 2 P(W+ <= k - 1).
    k, below = 0, 0
    while k < len(counts) and 2 * (below + counts[k]) / total <= 1 - confidence:
        below += counts[k]
        k += 1
    if k == 0:
        return None
    walsh = sorted((differences[i] + differences[j]) / 2 for i in range(n) for j in range(i, n))
    middle = len(walsh) // 2
    estimate = walsh[middle] if len(walsh) % 2 else (walsh[middle - 1] + walsh[middle]) / 2
    return Interval(estimate, walsh[k - 1], walsh[-k], 1 - 2 * below / total)


#: The fewest rounds a Student t interval is taken from, where they are too few for the signed-rank one.
T_ROUNDS = 3


@cache
def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (p > 0.5) of Student's t distribution with ``df`` degrees of freedom: its density
    integrated by Simpson's rule, the quantile found by bisection (no scipy here)."""
    scale = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(t: float, steps: int = 2000) -> float:
        h = t / steps
        total = sum((1 if i in (0, steps) else 4 if i % 2 else 2) * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2)
                    for i in range(steps + 1))  # fmt: skip
        return 0.5 + float(scale * total * h / 3)

    low, high = 0.0, 1.0
    while cdf(high) < p:
        high *= 2
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) < p else (low, middle)
    return (low + high) / 2


def t_interval(differences: Sequence[float], confidence: float) -> Interval | None:
    """The mean difference and its Student t interval at ``confidence``; None with fewer than 2."""
    n = len(differences)
    if n < 2:
        return None
    mean = sum(differences) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1))
    half = t_quantile(1 - (1 - confidence) / 2, n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, confidence)


@dataclass(frozen=True)
class RatioVerdict:
    """Head/base of one metric: ratio estimate, interval, verdict and why."""

    rounds: int
    ratio: float | None
    low: float | None
    high: float | None
    confidence: float | None
    verdict: str
    reason: str = ""
    min_effect: float | None = None
    """The smallest relative change this metric was judged against."""
    resolvable: float | None = None
    """The smallest relative change an interval as wide as this one lies wholly beyond the minimum effect for: what
    these rounds could have called a regression or improvement (None: no interval)."""
    spread: float | None = None
    """Of an inconclusive metric that more rounds cannot settle: the relative half-width its interval would still
    have after the most rounds, wider than the minimum effect (None: more rounds may settle it)."""
    method: str = ""
    """The interval's: "" the exact signed-rank one, "t" Student's t over the rounds' log ratios (fewer rounds than
    the signed-rank one needs; ``early``)."""

    @property
    def undecided(self) -> bool:
        """More rounds may still change it: inconclusive, and not past settling (:attr:`spread`)."""
        return self.verdict == INCONCLUSIVE and self.spread is None


def judge(
    pairs: Sequence[tuple[float, float]],
    *,
    higher_is_better: bool,
    min_effect: float,
    confidence: float,
    max_rounds: int | None = None,
    early: bool = False,
) -> RatioVerdict:
    """The verdict of ``(base, head)`` values of paired rounds: a regression (or improvement) only when the whole
    interval of head/base lies beyond the minimum effect in that direction, unchanged when it lies within it, else
    inconclusive. The interval is the exact signed-rank one; with ``early``, from :data:`T_ROUNDS` rounds to the
    fewest the signed-rank one needs, Student's t (it assumes the rounds' log ratios spread normally). An
    inconclusive one that ``max_rounds`` rounds could not settle either (its interval, narrowing as one over the
    square root of the rounds, would still be wider than the minimum effect around an estimate inside it) gets
    :attr:`RatioVerdict.spread`: more rounds are not spent on it."""
    usable = [(b, h) for b, h in pairs if b > 0 and h > 0 and math.isfinite(b) and math.isfinite(h)]
    if len(usable) < len(pairs):
        return RatioVerdict(len(pairs), None, None, None, None, INCONCLUSIVE, "a value of 0 has no ratio", min_effect)
    differences = [math.log(h / b) for b, h in usable]
    found, method = interval(differences, confidence), ""
    if found is None and early and len(usable) >= T_ROUNDS:
        found, method = t_interval(differences, confidence), "t"
    if found is None:
        reason = (
            f"{len(usable)} rounds cannot give a {confidence:.0%} interval: run {rounds_needed(confidence)} or more"
        )
        return RatioVerdict(len(usable), None, None, None, None, INCONCLUSIVE, reason, min_effect)
    bound = math.log1p(min_effect)
    worse_low, worse_high = (-found.high, -found.low) if higher_is_better else (found.low, found.high)
    if worse_low > bound:
        verdict = REGRESSION
    elif worse_high < -bound:
        verdict = IMPROVEMENT
    elif -bound <= worse_low and worse_high <= bound:
        verdict = UNCHANGED
    else:
        verdict = INCONCLUSIVE
    half = (found.high - found.low) / 2
    resolvable = math.expm1(bound + half)
    spread = None
    # Two rounds past the fewest that give an interval, so that its width is not that of the widest one possible.
    if verdict == INCONCLUSIVE and max_rounds is not None and len(usable) >= rounds_needed(confidence) + 2:
        projected = half * math.sqrt(len(usable) / max(max_rounds, len(usable)))
        if projected > bound and abs(found.estimate) - projected <= bound:
            spread = math.expm1(projected)
    return RatioVerdict(
        len(usable), math.exp(found.estimate), math.exp(found.low), math.exp(found.high), found.confidence, verdict,
        min_effect=min_effect, resolvable=resolvable, spread=spread, method=method,
    )  # fmt: skip


def settled(counts: Sequence[str], timings: Sequence[RatioVerdict]) -> bool:
    """Whether more rounds could not change a test's verdict (``counts``: its counts' statuses): one of its metrics
    is a conclusive regression, or no timing is still undecided."""
    regression = REGRESSION in counts or any(t.verdict == REGRESSION for t in timings)
    return regression or not any(t.undecided for t in timings)
