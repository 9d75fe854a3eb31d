"""How the reports say a count: the one rule, for the pytest side and the CI side alike. No torch here."""

from __future__ import annotations


def plural(count: int, noun: str) -> str:
    """``1 test``, ``2 tests``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
