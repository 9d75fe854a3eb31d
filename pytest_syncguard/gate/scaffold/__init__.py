"""What ``syncguard init`` writes into a repository: its GPU workflow (one job, or with ``fork_safe`` the set of three
whose names, triggers and artifact agree), the composite action vendored beside it (or referenced at a public
address), a first budget test and, where pytest has none, its configuration. The vendored files are this package's
copies of the repository's own action, job script and pinned report requirements: one text, two places."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path

from ...version import __version__

#: The workflow the fork-safe set's comment and history workflows wait for, by name.
WORKFLOW = "GPU suite"
#: The artifact the GPU job uploads and the two others download.
ARTIFACT = "syncguard-gpu"
#: Where the action is vendored in a repository.
ACTION_DIR = ".github/actions/syncguard"
#: The files of the vendored action (this package's copies of the repository's own).
VENDORED = ("action.yml", "run_gpu_suite.sh", "report-requirements.txt")
#: A workflow file per role: the single job, or the fork-safe set.
SINGLE = {".github/workflows/syncguard.yml": "syncguard.yml"}
FORK_SAFE = {
    ".github/workflows/syncguard-gpu.yml": "gpu.yml",
    ".github/workflows/syncguard-comment.yml": "syncguard-comment.yml",
    ".github/workflows/syncguard-history.yml": "syncguard-history.yml",
}
TEST = "tests/test_syncguard_budget.py"
PYTEST_INI = "pytest.ini"
#: A referenced action: OWNER/REPO@COMMIT (pinned to a full commit, as GitHub advises for third-party actions).
ACTION_ADDRESS = re.compile(r"(?P<repo>[\w.-]+/[\w.-]+)@(?P<ref>[0-9a-f]{40})")
_PLACEHOLDER = re.compile(r"@@(\w+)@@")


@dataclass(frozen=True)
class Choices:
    """What the user chose (``syncguard init``'s options)."""

    package: str  # the pip requirement runners install pytest-syncguard from
    tests: str = TEST  # the suite's pytest arguments
    fork_safe: bool = False
    action: str | None = None  # OWNER/REPO@REF to reference; None vendors the action
    runs_on: str = "self-hosted, gpu"
    branch: str = "main"
    install: str = "true"  # what installs the project and its suite's needs on the runner


def template(name: str) -> str:
    """A file of this folder, as text (a vendored file or a template)."""
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


def files(choices: Choices, pytest_configured: bool) -> dict[str, str]:
    """Each file init writes (its path in the repository -> its text)."""
    if choices.action is not None:
        found = ACTION_ADDRESS.fullmatch(choices.action)
        if found is None:
            raise ValueError(
                f"--action {choices.action!r}: give OWNER/REPO@COMMIT, pinned to a full commit of pytest-syncguard "
                "(40 hex digits: a tag or branch can move under the workflow)"
            )
        uses = f"{found['repo']}/{ACTION_DIR}@{found['ref']}"
    else:
        uses = f"./{ACTION_DIR}  # zizmor: ignore[self-repository] -- vendored: the checked-out commit's"
    values = {
        "version": __version__,
        "branch": choices.branch,
        "runs_on": json.dumps([label.strip() for label in choices.runs_on.split(",") if label.strip()]),
        "uses": uses,
        # YAML's double-quoted scalars are JSON's strings.
        "tests": json.dumps(choices.tests),
        "install": json.dumps(choices.install),
        "package": json.dumps(choices.package),
        "artifact": ARTIFACT,
        "requirements": f"{ACTION_DIR}/report-requirements.txt",
        "test_path": TEST,
    }
    workflows = FORK_SAFE if choices.fork_safe else SINGLE
    written = {path: _fill(template(name), values) for path, name in workflows.items()}
    if choices.action is None:
        written.update({f"{ACTION_DIR}/{name}": template(name) for name in VENDORED})
    elif choices.fork_safe:  # the trusted jobs' pinned requirements, beside a referenced action's use
        written[f"{ACTION_DIR}/report-requirements.txt"] = template("report-requirements.txt")
    written[TEST] = _fill(template("test_budget.py.txt"), values)
    if not pytest_configured:
        written[PYTEST_INI] = _fill(template("pytest.ini"), values)
    return written


def _fill(text: str, values: dict[str, str]) -> str:
    missing = sorted(set(_PLACEHOLDER.findall(text)) - set(values))
    if missing:
        raise KeyError(f"the template names {missing}, which init does not fill")
    return _PLACEHOLDER.sub(lambda found: values[found[1]], text)


def pytest_configuration(root: Path) -> Path | None:
    """The file that configures pytest in ``root`` (pytest's own order of looking), or None."""
    for name, section in (("pytest.ini", ""), ("pyproject.toml", "[tool.pytest.ini_options]"), ("tox.ini", "[pytest]"),
                          ("setup.cfg", "[tool:pytest]")):  # fmt: skip
        path = root / name
        if path.is_file() and (not section or section in path.read_text(encoding="utf-8", errors="replace")):
            return path
    return None


def default_package() -> tuple[str, str | None]:
    """The requirement a runner installs this pytest-syncguard from, as pip recorded where it came from (PEP 610),
    and why it may not reach a runner (None where it will)."""
    try:
        distribution = metadata.distribution("pytest-syncguard")
    except metadata.PackageNotFoundError:  # imported from a checkout on the path, never installed
        return f"pytest-syncguard=={__version__}", "pytest-syncguard is not installed here, only importable"
    recorded = distribution.read_text("direct_url.json")
    if not recorded:
        return f"pytest-syncguard=={distribution.version}", None
    origin = json.loads(recorded)
    url = str(origin.get("url", ""))
    vcs = origin.get("vcs_info")
    if vcs:
        return f"pytest-syncguard @ {vcs.get('vcs', 'git')}+{url}@{vcs.get('commit_id', '')}", None
    if url.startswith("file://"):
        folder = url.removeprefix("file://")
        return folder, f"pytest-syncguard was installed from the folder {folder}, which only this machine can reach"
    return f"pytest-syncguard @ {url}", None
