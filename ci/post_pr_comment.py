"""Post the GPU suite's report as a PR comment: run by .github/workflows/gpu-comment.yml, from the default
branch, on the artifact of a GPU run, which is untrusted data (a fork's code produced it).

The artifact is never executed and none of it reaches a shell: the PR number and device slug must match
strict patterns, the PR's current head must be the commit the GPU run tested, only the ``results-*.json`` files
of bounded size are read (``junit-*.xml`` of runs that wrote none), inside ``syncguard report``, which checks
every value against the results document's types and escapes everything it renders, as is
the A/B report ``ab-<slug>.json`` where there is one (validated by ``syncguard report --ab``), and
the Markdown is rendered here, against the default branch's history of the GPU model (its syncguard-history
branch) where it has one, else against the baselines of the default branch. After posting, the
``gpu-approved`` label is removed from a fork's PR, so that its next push needs a maintainer again.

Environment: ARTIFACT (folder), REPO (owner/name), HEAD_SHA (of the GPU run), GH_TOKEN.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

MAX_FILE_BYTES = 50 * 2**20
LABEL = "gpu-approved"


def fail(message: str) -> None:
    print(f"post_pr_comment: {message}", file=sys.stderr)
    raise SystemExit(1)


def read_field(folder: Path, name: str, pattern: str) -> str:
    path = folder / name
    if not path.is_file() or path.is_symlink() or path.stat().st_size > 200:
        fail(f"artifact has no usable {name}")
    value = path.read_text(encoding="utf-8", errors="replace").strip()
    if not re.fullmatch(pattern, value):
        fail(f"artifact {name} does not match {pattern}")
    return value


def usable_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink() and path.stat().st_size <= MAX_FILE_BYTES


def usable(folder: Path, pattern: str) -> list[Path]:
    return [p for p in sorted(folder.glob(pattern)) if usable_file(p)]


def gh(*args: str) -> str:
    done = subprocess.run(["gh", *args], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        fail(f"gh {' '.join(args[:2])} failed: {done.stderr.strip()[:300]}")
    return done.stdout


def history(folder: Path, slug: str) -> list[str]:
    """``--history DIR`` where the default branch's history of this GPU model can be fetched (the syncguard-history
    branch, written only by gpu-history.yml): what the pull request is judged against; else nothing."""
    fetched = subprocess.run(["syncguard", "history", "fetch", "--into", str(folder)], check=False, timeout=300)
    if fetched.returncode != 0 or not (folder / f"{slug}.jsonl").is_file():
        print(f"post_pr_comment: no history of {slug}: judged against the default branch's baselines/", file=sys.stderr)
        return []
    return ["--history", str(folder)]


def main() -> None:
    folder = Path(os.environ["ARTIFACT"])
    repo, head_sha = os.environ["REPO"], os.environ["HEAD_SHA"]
    if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", repo) or not re.fullmatch(r"[0-9a-f]{40}", head_sha):
        fail("REPO or HEAD_SHA is malformed")
    pr = read_field(folder, "pr-number", r"[1-9][0-9]{0,6}")
    slug = read_field(folder, "device-slug", r"[a-z0-9][a-z0-9-]{0,99}")
    pull = json.loads(gh("api", f"repos/{repo}/pulls/{pr}"))
    if pull["head"]["sha"] != head_sha:
        fail(f"PR {pr} is at {pull['head']['sha']}, the GPU run tested {head_sha}: not posting")
    results = usable(folder, "results-*.json") or usable(folder, "junit-*.xml")
    if not results:
        fail("artifact has no results-*.json or junit-*.xml file")
    ab = folder / f"ab-{slug}.json"
    with_ab = ["--ab", str(ab)] if usable_file(ab) else []
    temp = Path(os.environ.get("RUNNER_TEMP", "/tmp"))
    body = temp / "syncguard-comment.md"
    report = subprocess.run(
        ["syncguard", "report", *map(str, results), "--baselines", "baselines", *history(temp / "history", slug),
         *with_ab, "--markdown", str(body)],
        check=False,
    )  # fmt: skip
    if report.returncode != 0:
        fail("syncguard report failed")
    subprocess.run(
        ["syncguard", "comment", "--pr", pr, "--body-file", str(body), "--repo", repo, "--key", slug], check=True
    )
    fork = pull["head"]["repo"] is None or pull["head"]["repo"]["full_name"] != repo
    if fork and any(label["name"] == LABEL for label in pull.get("labels", [])):
        gh("api", "-X", "DELETE", f"repos/{repo}/issues/{pr}/labels/{LABEL}")


if __name__ == "__main__":
    main()
