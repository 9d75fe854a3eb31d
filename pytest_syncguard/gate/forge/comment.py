"""One sticky comment per key (GPU model) on a change, on any forge (:class:`.Comments`).

The comment carries a hidden marker with its key as its last line. Posting reads all of the change's comments and
edits the one that ends with the marker *and* was written by the same account; otherwise it creates one. Anyone
else's comment, even one that quotes the marker, is never edited. Two runs for one key that create at once leave
the oldest, with the later body."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .base import CommentError, Comments, Forge, Note

_KEY = re.compile(r"^[A-Za-z0-9._-]{1,100}$")


def marker(key: str) -> str:
    return f"<!-- pytest-syncguard:comment key={key} -->"


@dataclass(frozen=True)
class Posted:
    action: str
    """created or updated"""
    comment_id: int
    url: str


def post(
    body: str,
    number: int,
    *,
    key: str,
    forge: Forge,
    comments: Comments,
    repo: str | None = None,
    author: str | None = None,
) -> Posted:
    """Create or update this tool's comment for ``key`` on change ``number`` of ``repo`` (default: the checkout's)."""
    if not _KEY.match(key):
        raise CommentError(f"--key {key!r}: use letters, digits, '.', '_' or '-' (a device slug), at most 100")
    if repo is not None and (wrong := forge.repository_problem(repo, "--repo")) is not None:
        raise CommentError(wrong)
    if number <= 0:
        raise CommentError(f"--pr {number}: expected a {forge.change}'s number")
    tag = marker(key)
    text = f"{body.rstrip()}\n\n{tag}\n"
    if (size := len(text.encode("utf-8"))) > forge.body_limit:
        raise CommentError(
            f"the comment is {size} bytes, {forge.name}'s limit is {forge.body_limit}: render it with "
            "`syncguard report --markdown`, which truncates"
        )
    comments.check_auth()
    repo = repo or comments.current_repository()
    me = author or comments.me()
    if me is None:
        raise CommentError(f"cannot tell which account posts to {forge.name}: pass --author LOGIN")
    mine = _ours(comments.notes(repo, number), tag, me)
    if mine:
        oldest = min(mine)
        done = comments.update(repo, number, oldest, text)
        return Posted("updated", oldest, done.url)
    created = comments.create(repo, number, text)
    # Another run for the same key may have created one at the same time: the oldest stays, with this body.
    older = [i for i in _ours(comments.notes(repo, number), tag, me) if i < created.id]
    if older:
        comments.delete(repo, number, created.id)
        kept = comments.update(repo, number, min(older), text)
        return Posted("updated", min(older), kept.url)
    return Posted("created", created.id, created.url)


def _ours(notes: list[Note], tag: str, me: str) -> list[int]:
    """The ids of the comments written by ``me`` whose last line is ``tag`` (where :func:`post` puts it: a marker
    quoted elsewhere in a body, a test id's say, marks nothing)."""
    return [n.id for n in notes if n.author == me and n.body.rstrip().rpartition("\n")[2] == tag]
