"""Post a GPU run's report as its pull request's comment from the run's artifact, which is untrusted data (a fork's
code produced it): what a ``workflow_run`` job of the default branch runs (``syncguard post-artifact``; this
repository's .github/workflows/gpu-comment.yml, which another repository copies as it is).

The artifact is never executed and none of it reaches a shell: the PR number and device slug must match strict
patterns, the PR's current head must be the commit the GPU run tested, and every ``results-*.json`` file
(``junit-*.xml`` of runs that wrote none) must be a regular file of bounded size (one that is not is named and
nothing is posted); ``syncguard report`` reads them, checks every value against the results document's types and
escapes everything it renders, as it does the A/B report ``ab-<slug>.json`` where there is one. The device slug the
artifact names must be one its results measured. The report judges each GPU model against the default branch's
history (its syncguard-history branch) where it has one, else against the default branch's baselines folder; a
history that cannot be fetched is said in the comment (⚠️), never passed over.

The verdict is trusted code's: the report is judged here, from the default branch, and set as the commit status
``syncguard/<slug>`` of the PR's head (success or failure), the check a branch protection requires; the PR's own
code produces the data, never the verdict. The approval label is removed from a fork's PR whatever happened, so
that its next push needs a maintainer again."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from ..document.file import ResultsError
from ..files import small_regular_file
from ..judge.junit import JUnitError
from ..judge.run import merge_cases
from .forge.base import CommentError
from .forge.comment import post
from .forge.github import GITHUB, GitHub
from .history_branch import BranchError, fetch
from .report import ReportRequest, report

#: The largest artifact file read.
MAX_FILE_BYTES = 50 << 20
COMMIT = re.compile(r"[0-9a-f]{40}")
#: The commit status this job sets on the PR's head, per GPU model: the check a branch protection requires.
STATUS_CONTEXT = "syncguard/{slug}"


class ArtifactError(Exception):
    """An artifact, or a pull request, that is not posted about; the message says why."""


def read_field(folder: Path, name: str, pattern: str) -> str:
    """A one-line file of the artifact that must match ``pattern`` whole."""
    path = folder / name
    if not small_regular_file(path, 200):
        raise ArtifactError(f"artifact has no usable {name}")
    value = path.read_text(encoding="utf-8", errors="replace").strip()
    if not re.fullmatch(pattern, value):
        raise ArtifactError(f"artifact {name} does not match {pattern}")
    return value


def results_files(folder: Path) -> list[Path]:
    """The artifact's ``results-*.json`` files, else its ``junit-*.xml``; :class:`ArtifactError` naming any that is
    not a regular file of at most :data:`MAX_FILE_BYTES` (a link, a FIFO, a file too large): never left out unsaid,
    which would post a pass without its failed budgets."""
    for pattern in ("results-*.json", "junit-*.xml"):
        found = _usable(sorted(folder.glob(pattern)))
        if found:
            return found
    raise ArtifactError("artifact has no results-*.json or junit-*.xml file")


def _usable(paths: list[Path]) -> list[Path]:
    """``paths``, each a regular file of at most :data:`MAX_FILE_BYTES`; :class:`ArtifactError` naming those that are
    not (a link, a FIFO, a file too large)."""
    bad = [p.name for p in paths if not small_regular_file(p, MAX_FILE_BYTES)]
    if bad:
        raise ArtifactError(
            f"artifact file {', '.join(bad)}: not a regular file of at most {MAX_FILE_BYTES >> 20} MB; nothing posted"
        )
    return paths


def _pull(github: Any, repo: str, pr: str) -> tuple[str, bool, list[str]]:
    """The PR's head commit, whether it comes from a fork, and its labels; :class:`ArtifactError` where GitHub's
    answer is not a pull request's."""

    try:
        pull = github.api(f"repos/{repo}/pulls/{pr}")
    except CommentError as exc:
        raise ArtifactError(str(exc)) from exc
    head = pull.get("head") if isinstance(pull, dict) else None
    sha = head.get("sha") if isinstance(head, dict) else None
    if not isinstance(sha, str) or not COMMIT.fullmatch(sha):
        raise ArtifactError(f"gh api repos/{repo}/pulls/{pr} answered no pull request ({str(pull)[:200]!r})")
    source = head.get("repo") if isinstance(head, dict) else None
    fork = not isinstance(source, dict) or source.get("full_name") != repo
    labels = [str(x.get("name")) for x in (pull.get("labels") or []) if isinstance(x, dict)]
    return sha, fork, labels


def _history(folder: Path) -> tuple[str | None, str | None]:
    """The folder of the default branch's history where its branch could be fetched (written only by the push job;
    each GPU model is judged against its own history where it has one), and why it could not, if so."""

    try:
        found = fetch(Path.cwd(), folder)
    except BranchError as exc:
        return None, str(exc)
    return (str(folder) if found else None), None


def device_slugs(results: list[Path]) -> set[str]:
    """The GPU models the results measured (:class:`ArtifactError` where they cannot be read)."""

    try:
        return {case.device_slug for case in merge_cases(results)}
    except (ResultsError, JUnitError) as exc:
        raise ArtifactError(f"artifact results not readable: {exc}") from exc


#: The label a maintainer puts on a pull request that changes performance on purpose: its regressions are reported
#: as accepted (``report --accept``), and do not fail its commit status.
ACCEPT_LABEL = "syncguard-accept"


def post_artifact(folder: Path, repo: str, head_sha: str, *, baselines: Path, work: Path, approval_label: str) -> None:
    """Validate the artifact in ``folder``, render its report into ``work``, post it on the pull request it names in
    ``repo`` and set its verdict as the head's commit status, if that pull request is still at ``head_sha``; raises
    :class:`ArtifactError` saying why not."""

    if GITHUB.repository_problem(repo) or not COMMIT.fullmatch(head_sha):
        raise ArtifactError("the repository or the head commit is malformed")
    pr = read_field(folder, "pr-number", r"[1-9][0-9]{0,6}")
    slug = read_field(folder, "device-slug", r"[a-z0-9][a-z0-9-]{0,99}")
    try:
        github = GitHub()
    except CommentError as exc:
        raise ArtifactError(str(exc)) from exc
    sha, fork, labels = _pull(github, repo, pr)
    if sha != head_sha:
        raise ArtifactError(f"PR {pr} is at {sha}, the GPU run tested {head_sha}: not posting")
    try:
        accept = f"the pull request is labelled {ACCEPT_LABEL}" if ACCEPT_LABEL in labels else None
        _post(github, folder, repo, pr, slug, head_sha, baselines=baselines, work=work, accept=accept)
    finally:
        if approval_label and fork and approval_label in labels:
            try:
                github.api("-X", "DELETE", f"repos/{repo}/issues/{pr}/labels/{approval_label}")
            except CommentError as exc:
                print(
                    f"syncguard post-artifact: the approval label {approval_label!r} could not be removed: {exc}",
                    file=sys.stderr,
                )


def _post(
    github: Any,
    folder: Path,
    repo: str,
    pr: str,
    slug: str,
    sha: str,
    *,
    baselines: Path,
    work: Path,
    accept: str | None,
) -> None:

    results = results_files(folder)
    measured = device_slugs(results)
    if slug not in measured:
        raise ArtifactError(
            f"artifact device-slug {slug!r} is not a GPU model its results measured "
            f"({', '.join(sorted(measured)) or 'none'})"
        )
    ab = folder / f"ab-{slug}.json"
    body = work / "syncguard-comment.md"
    with_ab = ab.is_symlink() or ab.exists()
    if with_ab:
        _usable([ab])  # one that is there and is no regular file is named, never left out
    history, unread = _history(work / "history")
    request = ReportRequest(
        tuple(map(str, results)),
        baselines=str(baselines),
        markdown=str(body),
        ab=str(ab) if with_ab else None,
        fail_on_regression=True,
        history=history,
        history_unavailable=unread,
        accept=accept,
    )
    verdict = report(request)
    if verdict not in (0, 1):
        raise ArtifactError("syncguard report failed")
    try:
        posted = post(body.read_text(encoding="utf-8"), int(pr), key=slug, forge=GITHUB, comments=github, repo=repo)
    except CommentError as exc:
        raise ArtifactError(f"syncguard comment failed: {exc}") from exc
    print(f"syncguard post-artifact: {posted.action} comment {posted.comment_id} {posted.url}".rstrip())
    state, said = ("failure", "failed: see the PR comment") if verdict else ("success", "passed")
    try:
        github.api(
            "-X",
            "POST",
            f"repos/{repo}/statuses/{sha}",
            "-f",
            f"state={state}",
            "-f",
            f"context={STATUS_CONTEXT.format(slug=slug)}",
            "-f",
            f"description=syncguard {said}",
        )
    except CommentError as exc:
        raise ArtifactError(f"the commit status could not be set: {exc}") from exc
