"""Which forge a command speaks to: ``--forge``, else GitLab inside a GitLab job (``GITLAB_CI``), else GitHub."""

from __future__ import annotations

import os

from .base import Forge
from .github import GITHUB
from .gitlab import gitlab

NAMES = ("github", "gitlab")


def default_name() -> str:
    return "gitlab" if os.environ.get("GITLAB_CI") == "true" else "github"


def forge_named(name: str | None, server: str | None = None) -> Forge:
    """The forge of ``--forge`` (None: :func:`default_name`) at ``--server`` (GitLab's; GitHub's is github.com)."""
    return gitlab(server) if (name or default_name()) == "gitlab" else GITHUB
