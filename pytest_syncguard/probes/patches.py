"""Attributes a probe replaces while it is installed, and puts back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Patches:
    """Replaced attributes, undone last first; an attribute the owner only inherited is deleted again."""

    def __init__(self) -> None:
        self._restore: list[Callable[[], None]] = []

    def patch(self, owner: Any, attribute: str, wrap: Callable[[Any], Any]) -> None:
        """Replace ``owner.attribute`` by ``wrap(original)``."""
        own = owner.__dict__.get(attribute)
        setattr(owner, attribute, wrap(getattr(owner, attribute)))
        if own is None:
            self._restore.append(lambda: delattr(owner, attribute))
        else:
            self._restore.append(lambda: setattr(owner, attribute, own))

    def undo(self) -> None:
        while self._restore:
            self._restore.pop()()

    def __bool__(self) -> bool:
        return bool(self._restore)
