"""What explains a change of a test's counts: the sync sites that appeared, grew, shrank or went away, and the
operators, kernels or compile reasons whose counts moved (pure data, no torch).

A test's :class:`Details` (its sync sites and the largest contributors to its itemized counters) are kept in
its results and in the baseline files. A site is named by its module-relative path, line and
function, and matched by its source text where both sides have it, so that it matches across machines and
installs, and across a line inserted above it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .counts import Items

#: How many site changes and movers per counter an explanation lists.
LISTED = 5


@dataclass(frozen=True)
class SiteCount:
    """The counted syncs of one kind made from one call site."""

    path: str
    """Relative to the ``sys.path`` entry its module was imported from (``examples/strategies.py``,
    ``transformers/generation/utils.py``), or as recorded when outside all of them."""
    line: int
    function: str
    code: str
    """The source line, stripped ("" when it could not be read)."""
    kind: str
    op: str
    count: int

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line} in {self.function}"

    def key(self, by_code: bool) -> tuple[str, str, str, str, str]:
        return (self.path, self.function, self.code if by_code else str(self.line), self.kind, self.op)


@dataclass(frozen=True)
class Details:
    """What a test's count changes are explained with."""

    sites: tuple[SiteCount, ...] = ()
    top: Mapping[str, Items] = field(default_factory=dict)
    """Per itemized counter (:data:`..signals.ITEMIZED`), its largest contributors, largest first."""
    top_limit: int = 0
    """How many contributors each list kept at most: an item missing from a full list may still have some."""


@dataclass(frozen=True)
class SiteChange:
    site: SiteCount
    """The site as this run saw it (as the baseline did, when it went away)."""
    old: int
    new: int

    @property
    def status(self) -> str:
        if self.old == 0:
            return "appeared"
        if self.new == 0:
            return "gone"
        return "grew" if self.new > self.old else "shrank"

    def describe(self) -> str:
        code = f": {self.site.code}" if self.site.code else ""
        return (
            f"{self.status} {self.site.where}{code} ({self.site.kind}, {self.site.op}): {self.old} -> {self.new} "
            f"syncs ({self.new - self.old:+d})"
        )


@dataclass(frozen=True)
class Mover:
    counter: str
    item: str
    old: int | None
    """None: not among the baseline's listed contributors (it had at most the smallest listed count)."""
    new: int | None
    """None: not among this run's listed contributors."""
    items: str = ""
    """What the counter's contributors are (``operators``), as its signal says; "" in a record written before it was
    kept: said as contributors."""

    def describe(self) -> str:
        old = "-" if self.old is None else str(self.old)
        new = "-" if self.new is None else str(self.new)
        delta = "" if self.old is None or self.new is None else f" ({self.new - self.old:+d})"
        return f"{self.items or 'contributors'} of {self.counter}: {self.item} {old} -> {new}{delta}"


@dataclass(frozen=True)
class ExplainRules:
    """What explaining a change needs of the signal catalogue, handed in (:data:`..signals.EXPLAIN`)."""

    itemized: Mapping[str, str]
    """The counters whose largest contributors a region keeps, and what those are."""
    explained_by: Mapping[str, str] = field(default_factory=dict)
    """A counter whose change another counter's contributors explain (``copy_bytes_d2d`` by ``copies_d2d``)."""


@dataclass(frozen=True)
class Explanation:
    sites: tuple[SiteChange, ...] = ()
    movers: tuple[Mover, ...] = ()

    def lines(self) -> list[str]:
        return [f"sync site {c.describe()}" for c in self.sites] + [f"moved: {m.describe()}" for m in self.movers]

    def __bool__(self) -> bool:
        return bool(self.sites or self.movers)


def _match(old: Iterable[SiteCount], new: Iterable[SiteCount]) -> list[tuple[SiteCount | None, SiteCount | None]]:
    """Pairs (baseline's site, this run's site) of the same site: by source text where both have it, else by
    line; a site on one side only is paired with None."""
    left, right = list(old), list(new)
    pairs: list[tuple[SiteCount | None, SiteCount | None]] = []
    for by_code in (True, False):
        index = {s.key(by_code): s for s in right if s.code or not by_code}
        kept = []
        for site in left:
            partner = index.pop(site.key(by_code), None) if (site.code or not by_code) else None
            if partner is None:
                kept.append(site)
            else:
                pairs.append((site, partner))
                right.remove(partner)
        left = kept
    return pairs + [(s, None) for s in left] + [(None, s) for s in right]


def site_changes(old: Iterable[SiteCount], new: Iterable[SiteCount]) -> list[SiteChange]:
    """The sites whose count changed, largest increase first."""
    changes = []
    for before, after in _match(old, new):
        was, now = (before.count if before else 0), (after.count if after else 0)
        if was != now:
            site = after or before
            assert site is not None
            changes.append(SiteChange(site, was, now))
    return sorted(changes, key=lambda c: (-(c.new - c.old), c.site.where))


def movers(counter: str, old: Items, new: Items, old_limit: int, new_limit: int, items: str = "") -> list[Mover]:
    """The contributors to ``counter`` whose count changed, largest change first. An item missing from a list
    that was cut at its limit has at most the list's smallest count there: it is listed only where its count on
    the other side is larger than that (so it surely moved), as unknown on the cut side."""
    before, after = dict(old), dict(new)
    cut_before = min(before.values()) if 0 < old_limit <= len(old) else None
    cut_after = min(after.values()) if 0 < new_limit <= len(new) else None
    found = []
    for item in sorted(set(before) | set(after)):
        was, now = before.get(item), after.get(item)
        if was is None and cut_before is not None:
            if now is None or now <= cut_before:
                continue
        elif now is None and cut_after is not None:
            if was is None or was <= cut_after:
                continue
        else:
            was, now = was or 0, now or 0
        if was != now:
            found.append(Mover(counter, item, was, now, items))
    return sorted(found, key=lambda m: (-abs((m.new or 0) - (m.old or 0)), m.item))


def explain(old: Details | None, new: Details | None, counters: Iterable[str], rules: ExplainRules) -> Explanation:
    """Why the counted metrics ``counters`` (e.g. ``syncs``, ``ops_per_token``) changed between a baseline's
    details and this run's."""
    if old is None or new is None:
        return Explanation()
    names = {c.removesuffix("_per_token") for c in counters}
    names |= {rules.explained_by[n] for n in names if n in rules.explained_by}
    sites = site_changes(old.sites, new.sites)[:LISTED] if "syncs" in names else []
    moved: list[Mover] = []
    for name, items in rules.itemized.items():
        if name not in names:
            continue
        if name not in old.top and name in new.top:  # the baseline kept none of them (none, or not itemized then)
            moved += [Mover(name, item, None, n, items) for item, n in new.top[name][:LISTED]]
            continue
        found = movers(name, old.top.get(name, ()), new.top.get(name, ()), old.top_limit, new.top_limit, items)
        moved += found[:LISTED]
    return Explanation(tuple(sites), tuple(moved))
