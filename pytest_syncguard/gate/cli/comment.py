"""``syncguard comment``: one comment per key on a pull request or merge request."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..forge.base import CommentError
from ..forge.choice import forge_named
from ..forge.comment import post
from ..forge.github import GH_TIMEOUT_S
from . import options


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    comment = commands.add_parser(
        "comment", help="create or update this tool's comment on a pull request (GitHub, through gh) or merge request"
    )
    comment.add_argument(
        "--pr", type=options.positive, required=True, help="pull request number (GitLab: the merge request's IID)"
    )
    comment.add_argument("--body-file", required=True, help="Markdown body (from syncguard report --markdown)")
    comment.add_argument(
        "--repo", help="OWNER/NAME or GROUP/PROJECT (default: gh's repository, or the GitLab job's CI_PROJECT_PATH)"
    )
    comment.add_argument("--key", default="syncguard", help="one comment per key, e.g. the GPU's slug")
    comment.add_argument("--author", help="the account the comment is posted as (default: asked from the forge)")
    options.forge_options(comment)
    comment.add_argument(
        "--timeout",
        "--gh-timeout",
        dest="timeout",
        type=options.seconds,
        default=GH_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up a call to the forge that takes longer (default {GH_TIMEOUT_S:g})",
    )
    comment.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        body = Path(args.body_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"syncguard comment: cannot read --body-file {args.body_file} as UTF-8 text: {exc}", file=sys.stderr)
        return 2
    try:
        forge = forge_named(args.forge, args.server)
        comments = forge.comments(args.timeout)
        posted = post(body, args.pr, key=args.key, forge=forge, comments=comments, repo=args.repo, author=args.author)
    except CommentError as exc:
        print(f"syncguard comment: {exc}", file=sys.stderr)
        return 2
    print(f"syncguard comment: {posted.action} comment {posted.comment_id} {posted.url}".rstrip())
    return 0
