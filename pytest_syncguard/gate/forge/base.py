"""What a forge is to syncguard: how it names a repository, where a repository's pages are, the most characters a
comment may have, and the few calls that keep one comment per key on a change (:class:`Comments`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from ...render.links import RepositoryWeb


class CommentError(Exception):
    """Something ``comment`` cannot do; the message says what to fix."""


@dataclass(frozen=True)
class Note:
    """A comment on a change, as the forge lists it."""

    id: int
    author: str
    body: str
    url: str = ""


class Comments(Protocol):
    """A forge's calls on a change's comments (a GitHub pull request's, a GitLab merge request's)."""

    def check_auth(self) -> None:
        """Raise :class:`CommentError` saying how to authenticate, where the calls would be refused."""

    def me(self) -> str | None:
        """The account the calls are made as (None: it cannot be told)."""

    def current_repository(self) -> str:
        """The repository of this checkout or job, where none is given."""

    def notes(self, repository: str, number: int) -> list[Note]:
        """Every comment of change ``number``, oldest first."""

    def create(self, repository: str, number: int, body: str) -> Note: ...

    def update(self, repository: str, number: int, note: int, body: str) -> Note: ...

    def delete(self, repository: str, number: int, note: int) -> None: ...


_SEGMENT = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Forge:
    """A forge's fixed facts: its name, what it calls a change, the most characters of a comment, how deep a
    repository's name may go (GitHub: ``OWNER/NAME``; GitLab: groups and subgroups before it), and its server."""

    name: str
    change: str
    body_limit: int
    server: str
    blob: str
    commits: str
    nested: bool

    def repository_problem(self, name: str, option: str = "--repository") -> str | None:
        """What is wrong with a repository's name (None: well formed): letters, digits, ``_``, ``.`` and ``-`` in
        each part, no part ``.`` or ``..`` (a link of it would climb), nothing after it (a newline included)."""
        parts = name.split("/")
        deep = len(parts) >= 2 if self.nested else len(parts) == 2
        if deep and all(_SEGMENT.fullmatch(p) and p not in (".", "..") for p in parts):
            return None
        shape = "GROUP/.../PROJECT" if self.nested else "OWNER/NAME"
        return f"{option} {name!r}: not a {self.name} repository's {shape}"

    def web(self, repository: str) -> RepositoryWeb:
        return RepositoryWeb(f"{self.server}/{repository}", self.blob, self.commits)
