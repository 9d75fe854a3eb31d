"""``syncguard history``: the default branch's runs per GPU model: record, fetch, baselines and page."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ...document.file import ResultsError, read_all
from ...files import write_atomically
from ...judge import history
from ...judge.baselines import document
from ...render.page import page_names, pages
from ...words import plural
from .. import history_branch, history_postgres
from ..forge.base import CommentError
from ..forge.choice import forge_named
from ..history_branch import BRANCH
from ..outputs import clobbers
from . import options

if TYPE_CHECKING:
    from ...judge.history import History


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    history = commands.add_parser(
        "history",
        help="the default branch's runs per GPU model: record a run, fetch "
        "them for a pull request's report, write baselines or a page from them",
    )
    actions = history.add_subparsers(dest="action", required=True)
    record = actions.add_parser("record", help="append a default-branch run's results to the history")
    record.add_argument("results", nargs="+", metavar="RESULTS", help="results files (pytest --syncguard-json)")
    record.add_argument("--commit", required=True, help="the commit the run measured")
    where = record.add_mutually_exclusive_group(required=True)
    where.add_argument("--into", metavar="DIR", help="a folder of history files")
    where.add_argument(
        "--push",
        metavar="REMOTE",
        help="the history branch of this git remote (e.g. origin): "
        "fetched, appended and pushed, again on a new tip while another push rejects it",
    )
    where.add_argument(
        "--store",
        metavar="URL",
        help="a PostgreSQL database (postgresql://USER@HOST/DB): appended in one transaction under its lock",
    )
    record.add_argument(
        "--branch",
        default=BRANCH,
        help=f"the history branch (default {BRANCH}), or a ref under refs/syncguard/ that git clone does not fetch",
    )
    fetch = actions.add_parser("fetch", help="copy the history branch's files into a folder (for report --history)")
    fetch.add_argument("--into", metavar="DIR", required=True, help="the folder the history files are copied into")
    fetch.add_argument(
        "--remote", default="origin", help="the git remote whose history branch is read (default origin)"
    )
    fetch.add_argument(
        "--branch",
        default=BRANCH,
        help=f"the history branch (default {BRANCH}), or a ref under refs/syncguard/ that git clone does not fetch",
    )
    fetch.add_argument("--store", metavar="URL", help="read a PostgreSQL store (postgresql://...) instead of a branch")
    fetch.add_argument(
        "--every-run",
        action="store_true",
        help="also the closed segments (the history page's runs); without it, only what a record or a report reads",
    )
    baselines = actions.add_parser("baselines", help="write baseline files (baselines/<slug>.json) from a history")
    baselines.add_argument("folder", metavar="DIR", help="a folder of history files")
    baselines.add_argument("--out", metavar="DIR", required=True, help="the baselines folder to write into")
    page = actions.add_parser("page", help="a static HTML page of every test's metrics per GPU model")
    page.add_argument("folder", metavar="DIR", help="a folder of history files")
    page.add_argument(
        "--out",
        metavar="FILE",
        required=True,
        help="the index page to write (NAME.html); each GPU model's page is written beside it (NAME.<slug>.html)",
    )
    page.add_argument("--repository", metavar="OWNER/NAME", help="each point links to its commit on the forge")
    options.forge_options(page)
    history.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """``syncguard history record|fetch|baselines|page``."""

    try:
        if args.action == "record":
            results = read_all(Path(path) for path in args.results)
            if args.into:
                held = history.record(Path(args.into), results, args.commit, history.now())
                for slug, recorded in held.items():
                    print(f"syncguard history: {recorded.describe(slug)}")
            elif args.store:
                history_postgres.record(_store(args.store), results, args.commit)
            else:
                history_branch.push(Path.cwd(), results, args.commit, remote=args.push, branch=args.branch)
            return 0
        if args.action == "fetch":
            if args.store:
                found = history_postgres.fetch(_store(args.store), Path(args.into), every_run=args.every_run)
            else:
                found = history_branch.fetch(
                    Path.cwd(), Path(args.into), remote=args.remote, branch=args.branch, every_run=args.every_run
                )
            source = history_postgres.shown(args.store) if args.store else f"{args.remote} {args.branch}"
            print(
                f"syncguard history: {source} "
                + (
                    "fetched into " + args.into
                    if found
                    else "does not exist yet: every GPU model is judged as seen for the first time"
                )
            )
            return 0
        histories = _histories(Path(args.folder))
        if args.action == "baselines":
            for kept in histories:
                reference = history.baseline(kept)
                target = Path(args.out) / f"{kept.device}.json"
                write_atomically(
                    target, document(kept.device, {}, reference.tests, reference.details, reference.history)
                )
                print(f"syncguard history: {target}: {len(reference.tests)} tests from {kept.count} runs")
            return 0

        out = Path(args.out)
        forge = forge_named(args.forge, args.server)
        if args.repository and (wrong := forge.repository_problem(args.repository)) is not None:
            print(f"syncguard history: {wrong}", file=sys.stderr)
            return 2
        streamed = [(kept, history.every_run(Path(args.folder), kept, filled=False)) for kept in histories]
        files = pages(streamed, out.name, forge.web(args.repository) if args.repository else None)
        inputs = [("DIR", str(p)) for p in Path(args.folder).iterdir() if p.name.endswith((".jsonl", ".json"))]
        names = page_names(out.name, [kept.device for kept in histories])
        outputs = [("--out", str(out.with_name(name)), "file") for name in names]
        if (problem := clobbers("history page", outputs, inputs)) is not None:
            print(problem, file=sys.stderr)
            return 2
        sizes = []
        for made in files:  # a model's page made, written and let go before the next; the index last
            write_atomically(out.with_name(made.name), made.text)
            sizes.append(f"{made.name} {len(made.text.encode()) / 1e6:.1f} MB")
        print(f"syncguard history: {args.out}: {plural(len(histories), 'GPU model')} ({', '.join(sizes[:-1])})")
        return 0
    except (history.HistoryError, ResultsError, CommentError, OSError) as exc:
        print(f"syncguard history: {exc}", file=sys.stderr)
        return 2


def _store(url: str) -> str:
    """A PostgreSQL connection string, or a usage error naming the option."""
    if not url.startswith(("postgresql://", "postgres://")):
        raise history.HistoryError(f"--store {history_postgres.shown(url)!r}: give a postgresql:// connection string")
    return url


def _histories(folder: Path) -> list[History]:
    """Every GPU model's history in ``folder``: its checkpoint and open segment."""

    names = sorted(folder.glob(f"*{history.RUNS_SUFFIX}"))
    files = [path for path in names if history.judging_file(path.name) or history.slug_of(path.name) is None]
    for other in (path for path in files if history.slug_of(path.name) is None):
        print(
            f"syncguard history: {other}: not a GPU model's history (its name is no device slug): left out",
            file=sys.stderr,
        )
    slugs = [slug for path in files if (slug := history.slug_of(path.name)) is not None]
    return [found for slug in slugs if (found := history.read(folder, slug)) is not None]
