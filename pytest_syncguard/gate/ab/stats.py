"""Head against base of one timing, from paired rounds run on one runner: the head/base ratio with an exact
distribution-free confidence interval, and a verdict against a minimum effect (pure functions, no torch).

Each round gives one value per side (a test's median over its runs); its log ratio ``log(head / base)`` is one
paired difference. The estimate is the Hodges-Lehmann median of the Walsh averages of those differences, and the
interval the one Wilcoxon's signed-rank test gives (exact, from the test's null distribution; it assumes only
that a difference is as likely above as below its median). With ``n`` rounds the most confident interval is the
range of the ``n`` ratios, at confidence ``1 - 2 / 2**n``: 5 rounds cannot give 95%, 6 can.

Rounds may come from more than one pair of processes (a base and a head process each): a process has an offset of its
own (on an H100, two warm processes of the same code ran a test 1.1% apart while each one's rounds agreed within
0.2%), which the rounds of one pair cannot tell from a change. Then each pair gets its own interval (the rounds'
spread within pairs pooled) and the metric's interval is the hull of them: a change is called only where every pair
calls it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from ...document.ab import IMPROVEMENT, INCONCLUSIVE, REGRESSION, UNCHANGED, RatioVerdict


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
        total = sum(
            (1 if i in (0, steps) else 4 if i % 2 else 2) * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2)
            for i in range(steps + 1)
        )
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


def fewest_rounds(confidence: float, pairs: int = 1, early: bool = False) -> int:
    """The fewest rounds that may give an interval: the signed-rank one's, or with ``early`` :data:`T_ROUNDS`; with
    more than one pair of processes, a round of each and two degrees of freedom within them."""
    if pairs > 1:
        return pairs + 2
    return T_ROUNDS if early else rounds_needed(confidence)


@dataclass(frozen=True)
class _Pairs:
    """The hull of the pairs' intervals, each pair's estimate, and the rounds' spread within pairs."""

    hull: Interval
    estimates: tuple[float, ...]
    within: float
    """The half-width the pooled spread within pairs gives one pair's mean over one round."""
    method: str


def _pairs_interval(
    differences: Sequence[float], blocks: Sequence[int], pairs: int, confidence: float
) -> _Pairs | None:
    """Each pair's interval (its signed-rank one where its rounds are enough, else Student's t with the spread
    within pairs pooled) and their hull, around the mean of the pairs' estimates; None where a pair has no round or
    the rounds leave fewer than 2 degrees of freedom within pairs."""
    groups: dict[int, list[float]] = {}
    for difference, block in zip(differences, blocks, strict=True):
        groups.setdefault(block, []).append(difference)
    df = len(differences) - len(groups)
    if len(groups) < pairs or df < 2:
        return None
    means = {block: sum(values) / len(values) for block, values in groups.items()}
    pooled = math.sqrt(sum((d - means[block]) ** 2 for block, values in groups.items() for d in values) / df)
    quantile = t_quantile(1 - (1 - confidence) / 2, df)
    estimates, lows, highs, method = [], [], [], ""
    for block in sorted(groups):
        exact = interval(groups[block], confidence)
        if exact is None:
            half = quantile * pooled / math.sqrt(len(groups[block]))
            exact, method = Interval(means[block], means[block] - half, means[block] + half, confidence), "t"
        estimates.append(exact.estimate)
        lows.append(exact.low)
        highs.append(exact.high)
    hull = Interval(sum(estimates) / len(estimates), min(lows), max(highs), confidence)
    return _Pairs(hull, tuple(estimates), quantile * pooled, method)


def judge(
    pairs: Sequence[tuple[float, float]],
    *,
    higher_is_better: bool,
    min_effect: float,
    confidence: float,
    max_rounds: int | None = None,
    early: bool = False,
    blocks: Sequence[int] | None = None,
    processes: int = 1,
) -> RatioVerdict:
    """The verdict of ``(base, head)`` values of paired rounds: a regression (or improvement) only when the whole
    interval of head/base lies beyond the minimum effect in that direction, unchanged when it lies within it, else
    inconclusive. The interval is the exact signed-rank one; with ``early``, from :data:`T_ROUNDS` rounds to the
    fewest the signed-rank one needs, Student's t (it assumes the rounds' log ratios spread normally). With
    ``processes`` > 1 pairs of processes (``blocks``: each round's pair, numbered from 1), the hull of the pairs'
    intervals (:func:`fewest_rounds` gives the rounds it needs). An inconclusive one that ``max_rounds`` rounds
    could not settle either (its interval, narrowing as one over the square root of the rounds down to the pairs'
    own spread, would still be wider than the minimum effect around an estimate inside it) gets
    :attr:`RatioVerdict.spread`: more rounds are not spent on it."""
    usable = [(b, h) for b, h in pairs if b > 0 and h > 0 and math.isfinite(b) and math.isfinite(h)]
    if len(usable) < len(pairs):
        return RatioVerdict(len(pairs), None, None, None, None, INCONCLUSIVE, "a value of 0 has no ratio", min_effect)
    differences = [math.log(h / b) for b, h in usable]
    split = None
    if processes > 1:
        if blocks is None or len(blocks) != len(differences):
            raise ValueError(f"{processes} pairs of processes need each round's pair")
        split = _pairs_interval(differences, blocks, processes, confidence)
        found, method = (split.hull, split.method) if split is not None else (None, "")
    else:
        found, method = interval(differences, confidence), ""
        if found is None and early and len(usable) >= T_ROUNDS:
            found, method = t_interval(differences, confidence), "t"
    if found is None:
        fewest = fewest_rounds(confidence, processes, early)
        within = f" from {processes} pairs of processes" if processes > 1 else ""
        reason = f"{len(usable)} rounds{within} cannot give a {confidence:.0%} interval: run {fewest} or more"
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
        most = max(max_rounds, len(usable))
        if split is not None:  # the pairs' own spread stays; the within-pair part narrows
            apart = (max(split.estimates) - min(split.estimates)) / 2
            projected = apart + split.within / math.sqrt(most / processes)
        else:
            projected = half * math.sqrt(len(usable) / most)
        if projected > bound and abs(found.estimate) - projected <= bound:
            spread = math.expm1(projected)
    return RatioVerdict(
        len(usable),
        math.exp(found.estimate),
        math.exp(found.low),
        math.exp(found.high),
        found.confidence,
        verdict,
        min_effect=min_effect,
        resolvable=resolvable,
        spread=spread,
        method=method,
        pairs=tuple(math.exp(e) for e in split.estimates) if split is not None else (),
    )
