"""Post a GPU run's report as its pull request's comment from the run's artifact, which is untrusted data (a fork's
code produced it): what a ``workflow_run`` job of the default branch runs (``syncguard post-artifact``; this
repository's .github/workflows/gpu-comment.yml, which another repository copies as it is).

The artifact is never executed and none of it reaches a shell: the PR number and device slug must match strict
patterns, the PR's current head must be the commit the GPU run tested, only the ``results-*.json`` files of bounded
size are read (``junit-*.xml`` of runs that wrote none), by ``syncguard report``, which checks every value against
the results document's types and escapes everything it renders, as is the A/B report ``ab-<slug>.json`` where there
is one. The report judges against the default branch's history of the GPU model (its syncguard-history branch)
where it has one, else against the default branch's baselines folder. After posting, the approval label is removed
from a fork's PR, so that its next push needs a maintainer again."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from ..files import small_regular_file

#: The largest artifact file read.
MAX_FILE_BYTES = 50 << 20
REPOSITORY = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
COMMIT = re.compile(r"[0-9a-f]{40}")


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


def _gh(*args: str) -> str:
    done = subprocess.run(["gh", *args], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise ArtifactError(f"gh {' '.join(args[:2])} failed: {done.stderr.strip()[:300]}")
    return done.stdout


def _history(folder: Path, slug: str) -> list[str]:
    """``--history DIR`` where the default branch's history of this GPU model can be fetched (written only by the
    push job): what the pull request is judged against; else nothing."""
    from .cli import main

    if main(["history", "fetch", "--into", str(folder)]) != 0 or not (folder / f"{slug}.jsonl").is_file():
        print(f"syncguard post-artifact: no history of {slug}: judged against the baselines folder", file=sys.stderr)
        return []
    return ["--history", str(folder)]


def post_artifact(folder: Path, repo: str, head_sha: str, *, baselines: Path, work: Path, approval_label: str) -> None:
    """Validate the artifact in ``folder``, render its report into ``work`` and post it on the pull request it
    names in ``repo``, if that pull request is still at ``head_sha``; raises :class:`ArtifactError` saying why not."""
    from .cli import main

    if not REPOSITORY.fullmatch(repo) or not COMMIT.fullmatch(head_sha):
        raise ArtifactError("the repository or the head commit is malformed")
    pr = read_field(folder, "pr-number", r"[1-9][0-9]{0,6}")
    slug = read_field(folder, "device-slug", r"[a-z0-9][a-z0-9-]{0,99}")
    pull = json.loads(_gh("api", f"repos/{repo}/pulls/{pr}"))
    if pull["head"]["sha"] != head_sha:
        raise ArtifactError(f"PR {pr} is at {pull['head']['sha']}, the GPU run tested {head_sha}: not posting")
    results = [p for p in sorted(folder.glob("results-*.json")) if small_regular_file(p, MAX_FILE_BYTES)]
    results = results or [p for p in sorted(folder.glob("junit-*.xml")) if small_regular_file(p, MAX_FILE_BYTES)]
    if not results:
        raise ArtifactError("artifact has no results-*.json or junit-*.xml file")
    ab = folder / f"ab-{slug}.json"
    body = work / "syncguard-comment.md"
    with_ab = ["--ab", str(ab)] if small_regular_file(ab, MAX_FILE_BYTES) else []
    report = [*map(str, results), "--baselines", str(baselines), *_history(work / "history", slug), *with_ab,
              "--markdown", str(body)]  # fmt: skip
    if main(["report", *report]) != 0:
        raise ArtifactError("syncguard report failed")
    if main(["comment", "--pr", pr, "--body-file", str(body), "--repo", repo, "--key", slug]) != 0:
        raise ArtifactError("syncguard comment failed")
    fork = pull["head"]["repo"] is None or pull["head"]["repo"]["full_name"] != repo
    if approval_label and fork and any(label["name"] == approval_label for label in pull.get("labels", [])):
        _gh("api", "-X", "DELETE", f"repos/{repo}/issues/{pr}/labels/{approval_label}")
