"""Where a site's line is on the forge: a link to the file at the head commit, for the report's sites and the
history page's points. Only a well-formed ``OWNER/NAME`` and commit make one. No torch here."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from .chain import Site

_COMMIT = re.compile(r"[0-9a-f]{7,40}")
_REPO = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")


def is_repository(name: str) -> bool:
    """Whether ``name`` is an ``OWNER/NAME`` of a forge: letters, digits, ``_``, ``.`` and ``-`` on each side of one
    ``/``, no side ``.`` or ``..`` (a link of it would climb), nothing after it (a newline included)."""
    return bool(_REPO.fullmatch(name)) and not {".", ".."} & set(name.split("/"))


@dataclass(frozen=True)
class SiteLinks:
    """Where a site's line is on GitHub: ``repository`` (OWNER/NAME) at ``commit``, for files under ``root``."""

    repository: str
    commit: str
    root: Path

    @classmethod
    def of(cls, repository: str | None, commit: str | None, root: Path) -> SiteLinks | None:
        """Links where both are given and well formed; None otherwise (sites are then plain ``path:line``)."""
        if not repository or not commit or cls.problem(repository, commit):
            return None
        return cls(repository, commit, root)

    @staticmethod
    def problem(repository: str | None, commit: str | None) -> str | None:
        """What is wrong with the two, as options of ``syncguard report`` (None: both well formed, or neither given)."""
        if repository is None and commit is None:
            return None
        if repository is None or commit is None:
            return "--repository and --commit go together: give both, or neither"
        if not is_repository(repository):
            return f"--repository {repository!r}: not OWNER/NAME"
        if not _COMMIT.fullmatch(commit):
            return f"--commit {commit!r}: not a commit's hex id (7 to 40 lowercase hex digits)"
        return None

    def url(self, site: Site) -> str | None:
        """The line's URL, for a relative path to a file of the checkout (a library's file is not in it)."""
        path = Path(site.path)
        try:
            if path.is_absolute() or ".." in path.parts or site.line < 1 or not (self.root / path).is_file():
                return None
        except (OSError, ValueError):  # a name too long for the file system, a NUL: no file of the checkout
            return None
        return f"https://github.com/{self.repository}/blob/{self.commit}/{quote(path.as_posix())}#L{site.line}"
