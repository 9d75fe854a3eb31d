"""What a forge is to syncguard: how it names a repository, where a repository's pages are, the most characters a
comment may have, and the few calls that keep one comment per key on a change (:class:`Comments`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

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


#: Comments a page of a change's comments holds, and the most pages read (a forge that answers every page alike
#: would page forever).
PAGE_SIZE = 100
MAX_PAGES = 300


def every_page(fetch: Callable[[int], Any], asker: str, what: str) -> list[Any]:
    """The items of pages 1, 2, ... as ``fetch(page)`` answers them (:data:`PAGE_SIZE` each), up to a shorter page:
    at most :data:`MAX_PAGES`, and a page that repeats the one before stops it. ``asker`` (who answers) and ``what``
    (what is read) name them in the errors."""
    found: list[Any] = []
    before: list[Any] = []
    for page in range(1, MAX_PAGES + 1):
        batch = fetch(page)
        if not isinstance(batch, list):
            raise CommentError(f"{asker}: unexpected answer for {what}")
        if batch and batch == before:
            raise CommentError(
                f"{asker} answered page {page} of {what} with page {page - 1}'s again: stopped rather than page forever"
            )
        found += batch
        if len(batch) < PAGE_SIZE:
            return found
        before = batch
    raise CommentError(f"{what} ran past {MAX_PAGES} pages of {PAGE_SIZE}: stopped")


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
    connect: Callable[[str, float], Comments]
    """Its calls on a change's comments, at its server, each given up after the seconds given."""

    def repository_problem(self, name: str, option: str = "--repository") -> str | None:
        """What is wrong with a repository's name (None: well formed): letters, digits, ``_``, ``.`` and ``-`` in
        each part, no part ``.`` or ``..`` (a link of it would climb), nothing after it (a newline included)."""
        parts = name.split("/")
        deep = len(parts) >= 2 if self.nested else len(parts) == 2
        if deep and all(_SEGMENT.fullmatch(p) and p not in (".", "..") for p in parts):
            return None
        shape = "GROUP/.../PROJECT" if self.nested else "OWNER/NAME"
        return f"{option} {name!r}: not a {self.name} repository's {shape}"

    def comments(self, timeout: float) -> Comments:
        """The calls on this forge's comments (:class:`Comments`)."""
        return self.connect(self.server, timeout)

    def web(self, repository: str) -> RepositoryWeb:
        return RepositoryWeb(f"{self.server}/{repository}", self.blob, self.commits)
