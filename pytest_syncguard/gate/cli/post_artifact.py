"""``syncguard post-artifact``: the trusted workflow's post of a GPU run's artifact."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ..artifact import ArtifactError, post_artifact


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    posting = commands.add_parser(
        "post-artifact",
        help="validate a GPU run's artifact (untrusted data) and post its "
        "report on the pull request it names, if still at the commit tested",
    )
    posting.add_argument("artifact", help="the downloaded artifact folder (pr-number, device-slug, results-*.json)")
    posting.add_argument("--repo", required=True, help="OWNER/NAME of the pull request")
    posting.add_argument("--head-sha", required=True, help="the commit the GPU run tested (the workflow_run's)")
    posting.add_argument(
        "--baselines",
        default="baselines",
        help="the default branch's baselines folder, for a GPU model without a history (default: baselines)",
    )
    posting.add_argument(
        "--approval-label",
        default="gpu-approved",
        help="removed from a fork's pull request "
        "after posting, so that its next push needs a maintainer again ('' to keep it)",
    )
    posting.add_argument("--work", help="where the report is rendered (default: a new temporary folder)")
    posting.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        with tempfile.TemporaryDirectory(prefix="syncguard-") as scratch:  # removed after, unless --work names one
            post_artifact(
                Path(args.artifact),
                args.repo,
                args.head_sha,
                baselines=Path(args.baselines),
                work=Path(args.work or scratch),
                approval_label=args.approval_label,
            )
    except ArtifactError as exc:
        print(f"syncguard post-artifact: {exc}", file=sys.stderr)
        return 1
    return 0
