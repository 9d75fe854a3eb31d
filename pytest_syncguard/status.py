"""The one vocabulary of a judgement: what a metric, a test or an A/B timing came to against what it was judged
against. Every module that decides or reads a status names it from here; a status is its own string in a document
(``Status.REGRESSION == "regression"``), so documents of any version read as they were written. No imports."""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """A judgement's outcome."""

    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    UNCHANGED = "unchanged"
    INCONCLUSIVE = "inconclusive"
    """An A/B timing whose interval is not wholly within or beyond the minimum effect."""
    VARIES = "varies"
    """An A/B count that was not the same in every round of one side."""
    NEW = "new"
    """No baseline value to judge against."""
    MISSING = "missing"
    """A baseline value that this run did not measure."""
    NOT_COMPARED = "not compared"
    """A noisy metric of too few runs, or a test whose numbers are partial."""
    NOT_JUDGED = "not judged"
    """A host timing against a baseline from another runner."""
    NOT_MEASURED = "not measured"
    """A test whose counts the baseline holds were not measured now."""
    UPDATED = "updated"
    NOT_UPDATED = "NOT updated"
    """An update's status for a test whose entry was not written after all."""


#: The statuses that moved, in a direction.
MOVED = frozenset({Status.REGRESSION, Status.IMPROVEMENT})
#: The statuses of a test judged against a baseline entry (an update's or a new test's are no judgement).
JUDGED = frozenset({Status.REGRESSION, Status.IMPROVEMENT, Status.UNCHANGED})
