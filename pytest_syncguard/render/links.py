"""Where a site's line and a commit are on the forge: links to the file at the head commit, for the report's sites,
and to each commit, for the history page's points. Only a well-formed repository and commit make one; which forge
(and so which pages) is :mod:`pytest_syncguard.gate.forge`'s to say. No torch here."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from .chain import Site

_COMMIT = re.compile(r"[0-9a-f]{7,40}")


def commit_problem(commit: str) -> str | None:
    """What is wrong with a commit's id as ``--commit`` (None: 7 to 40 lowercase hex digits)."""
    if _COMMIT.fullmatch(commit):
        return None
    return f"--commit {commit!r}: not a commit's hex id (7 to 40 lowercase hex digits)"


@dataclass(frozen=True)
class RepositoryWeb:
    """A repository's pages on its forge: ``url`` (``https://github.com/OWNER/NAME``), under which ``blob`` leads to
    a file at a commit and ``commits`` to a commit (GitHub's ``blob`` and ``commit``, GitLab's ``-/blob`` and
    ``-/commit``)."""

    url: str
    blob: str = "blob"
    commits: str = "commit"

    def line(self, commit: str, path: Path, line: int) -> str:
        return f"{self.url}/{self.blob}/{commit}/{quote(path.as_posix())}#L{line}"

    def commit(self, commit: str) -> str | None:
        """The commit's page; None for what is no commit's id."""
        return None if commit_problem(commit) else f"{self.url}/{self.commits}/{commit}"


@dataclass(frozen=True)
class SiteLinks:
    """Where a site's line is: the repository's pages (``web``) at ``commit``, for files under ``root``."""

    web: RepositoryWeb
    commit: str
    root: Path

    @classmethod
    def of(cls, web: RepositoryWeb | None, commit: str | None, root: Path) -> SiteLinks | None:
        """Links where both are given and the commit well formed; None otherwise (sites are then plain
        ``path:line``)."""
        if web is None or not commit or commit_problem(commit):
            return None
        return cls(web, commit, root)

    def url(self, site: Site) -> str | None:
        """The line's URL, for a relative path to a file of the checkout (a library's file is not in it)."""
        path = Path(site.path)
        try:
            if path.is_absolute() or ".." in path.parts or site.line < 1 or not (self.root / path).is_file():
                return None
        except (OSError, ValueError):  # a name too long for the file system, a NUL: no file of the checkout
            return None
        return self.web.line(self.commit, path, site.line)
