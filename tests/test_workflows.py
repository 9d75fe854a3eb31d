"""The CI workflows follow GitHub's guidance for self-hosted runners: checked with zizmor (a workflow linter
from PyPI) and by reading the YAML for the rules this project relies on."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
ACTION = ROOT / ".github" / "actions" / "syncguard" / "action.yml"


def load(name: str) -> dict[Any, Any]:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def steps(workflow: dict[Any, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


@pytest.mark.parametrize("name", ["cpu.yml", "gpu.yml", "gpu-comment.yml", "gpu-history.yml"])
def test_pinned_actions_least_privilege_and_no_injection(name: str) -> None:
    workflow = load(name)
    text = (WORKFLOWS / name).read_text()
    assert "pull_request_target" not in workflow["on"]
    assert "permissions" in workflow, "every workflow sets its token's permissions"
    for step in steps(workflow):
        if "uses" in step and not step["uses"].startswith("./"):  # a local action comes with the checked-out commit
            assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", step["uses"]), step["uses"]
        if "actions/checkout" in step.get("uses", ""):
            assert step.get("with", {}).get("persist-credentials") is False
        # Event data reaches scripts through env, never spliced into the script text.
        assert "${{" not in step.get("run", ""), step["run"]
    assert "secrets." not in text


def test_gpu_suite_runs_forks_only_on_a_maintainers_label() -> None:
    workflow = load("gpu.yml")
    assert workflow["permissions"] == {"contents": "read"}
    assert set(workflow["on"]) == {"push", "pull_request"}
    assert "labeled" in workflow["on"]["pull_request"]["types"]
    (job,) = workflow["jobs"].values()
    assert job["runs-on"] == ["self-hosted", "gpu"]
    condition = " ".join(job["if"].split())
    fork = "github.event.pull_request.head.repo.full_name != github.repository"
    assert f"({fork} && github.event.action == 'labeled' && github.event.label.name == 'gpu-approved')" in condition
    same = "github.event.pull_request.head.repo.full_name == github.repository"
    assert f"({same} && github.event.action != 'labeled')" in condition
    checkout = next(s for s in job["steps"] if "actions/checkout" in s.get("uses", ""))
    assert checkout["with"]["ref"] == "${{ github.event.pull_request.head.sha || github.sha }}"
    assert "permissions" not in job  # nothing beyond the workflow's read-only token


def test_the_comment_job_has_only_comment_rights_and_checks_out_no_pr_code() -> None:
    workflow = load("gpu-comment.yml")
    assert set(workflow["on"]) == {"workflow_run"}
    assert workflow["on"]["workflow_run"]["workflows"] == ["GPU suite"] == [load("gpu.yml")["name"]]
    assert workflow["permissions"] == {}
    (job,) = workflow["jobs"].values()
    assert job["permissions"] == {"actions": "read", "contents": "read", "pull-requests": "write", "statuses": "write"}
    assert not str(job["runs-on"]).startswith("self-hosted")
    checkout = next(s for s in job["steps"] if "actions/checkout" in s.get("uses", ""))
    assert "ref" not in checkout.get("with", {}) and "repository" not in checkout.get("with", {})
    post = job["steps"][-1]
    assert post["run"].rstrip().endswith('syncguard post-artifact "$ARTIFACT" --repo "$REPO" --head-sha "$HEAD_SHA"')
    assert post["env"]["HEAD_SHA"] == "${{ github.event.workflow_run.head_sha }}"


def test_only_the_history_job_writes_and_only_for_the_default_branchs_own_runs() -> None:
    """The history a pull request is judged against is written by one job: after a push to the default branch, from
    the default branch, with contents write and nothing else; no other job of the repository may write."""
    workflow = load("gpu-history.yml")
    assert set(workflow["on"]) == {"workflow_run"} and workflow["permissions"] == {}
    job, page = workflow["jobs"]["record"], workflow["jobs"]["page"]
    assert set(workflow["jobs"]) == {"record", "page"}
    assert job["permissions"] == {"actions": "read", "contents": "write"}
    # The page, published only where the repository asks for it, after the record, with Pages' rights alone.
    assert page["needs"] == "record" and page["if"] == "vars.SYNCGUARD_PAGES == 'true'"
    assert page["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}
    assert page["environment"]["name"] == "github-pages"
    drawn = " ".join(step.get("run", "") for step in page["steps"])
    assert "syncguard history fetch" in drawn and "--every-run" in drawn and "syncguard history page" in drawn
    condition = " ".join(job["if"].split())
    assert "github.event.workflow_run.event == 'push'" in condition
    assert "github.event.workflow_run.head_branch == github.event.repository.default_branch" in condition
    assert not str(job["runs-on"]).startswith("self-hosted")
    assert "--push origin" in job["steps"][-1]["run"] and '--commit "$HEAD_SHA"' in job["steps"][-1]["run"]
    for name in ("cpu.yml", "gpu.yml", "gpu-comment.yml"):
        jobs = load(name)["jobs"].values()
        # The comment job writes comments and the commit status it judges, nothing of the repository's contents.
        kept = ("pull-requests': 'write", "statuses': 'write")
        assert all("write" not in _without(str(j.get("permissions", {})), kept) for j in jobs)


def _without(text: str, parts: tuple[str, ...]) -> str:
    for part in parts:
        text = text.replace(part, "")
    return text


def test_the_action_takes_its_inputs_through_the_environment_and_the_gpu_workflow_runs_it() -> None:
    """Other repositories adopt the plugin with one step (.github/actions/syncguard); this repository's GPU job runs
    that step on its own suite, so it cannot rot."""
    action = yaml.safe_load(ACTION.read_text())
    assert action["runs"]["using"] == "composite"
    assert {"tests", "baselines", "ab-tests", "comment", "token"} <= set(action["inputs"])
    for step in action["runs"]["steps"]:
        assert "${{" not in step.get("run", ""), step["run"]  # inputs and event data reach the scripts through env
    poster = next(step for step in action["runs"]["steps"] if "syncguard comment" in step.get("run", ""))
    recorder = next(step for step in action["runs"]["steps"] if "syncguard history record" in step.get("run", ""))
    condition = " ".join(recorder["if"].split())  # only a push to the default branch, only with a token given
    assert "github.event_name == 'push'" in condition and "inputs.token != ''" in condition
    assert "github.ref_name == github.event.repository.default_branch" in condition
    assert "inputs.comment == 'true'" in poster["if"]  # posting is asked for, never a default
    assert action["inputs"]["comment"]["default"] == "false"
    (job,) = load("gpu.yml")["jobs"].values()
    (used,) = [step for step in job["steps"] if step.get("uses") == "./.github/actions/syncguard"]
    assert used["with"]["tests"] == "examples" and "comment" not in used["with"]  # gpu-comment.yml posts
    assert "token" not in used["with"]  # and gpu-history.yml records: this job's token only reads


def test_the_readme_shows_the_step_a_user_copies() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("```yaml") + len("```yaml") : readme.index("```", readme.index("```yaml") + 7)]
    workflow = yaml.safe_load(block)
    steps_ = [step for job in workflow["jobs"].values() for step in job["steps"]]
    assert any(str(step.get("uses", "")).endswith("/.github/actions/syncguard@" + "0" * 40) for step in steps_)
    assert len(block.strip().splitlines()) <= 12


def test_zizmor_finds_nothing() -> None:
    zizmor = shutil.which("zizmor")
    if zizmor is None:
        pytest.skip("zizmor is not installed (pip install zizmor)")
    done = subprocess.run(
        [zizmor, "--offline", "--persona", "auditor", "--no-progress", str(WORKFLOWS), str(ACTION.parent)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No findings to report" in done.stdout + done.stderr


def _run_action() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_action", ROOT / "devtools" / "run_action.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("event", "inputs", "expected"),
    [
        (
            "push",
            {"token": "t"},
            ["suite", "Record a default-branch run into the history", "Keep the results, report and traces"],
        ),
        ("push", {"token": ""}, ["suite", "Keep the results, report and traces"]),
        (
            "pull_request",
            {"token": "t", "comment": "true"},
            ["suite", "Post the report on the pull request", "Keep the results, report and traces"],
        ),
        ("pull_request", {"token": "t", "artifact": ""}, ["suite"]),
    ],
)
def test_the_action_runs_the_steps_its_event_and_inputs_call_for(
    event: str, inputs: dict[str, str], expected: list[str]
) -> None:
    """The action's own ``if:`` conditions, read by devtools/run_action.py (which proved the action in a scratch
    repository on a GPU): the history only on a push with a token, the comment only on a pull request that asks."""
    run_action = _run_action()
    action = yaml.safe_load(ACTION.read_text())
    given = {**{name: str(spec.get("default", "")) for name, spec in action["inputs"].items()}, **inputs}
    pull = {"pull_request": {"number": "7", "base": {"sha": "0" * 40}}} if event == "pull_request" else {}
    context = {"inputs": given, "github": {"event_name": event, "ref_name": "main",
                                           "event": {"repository": {"default_branch": "main"}, **pull}}}  # fmt: skip
    ran = [step.get("id", step.get("name")) for step in action["runs"]["steps"]
           if "if" not in step or run_action.evaluate(step["if"], context)]  # fmt: skip
    assert ran == expected


def test_the_readmes_snippet_runs_through_the_action_in_a_scratch_repository(tmp_path: Path) -> None:
    """devtools/adoption.sh's first push, on this CPU machine: the README's snippet as a repository's workflow, run by
    devtools/run_action.py; the suite says it needs a GPU, the history step says what it lacks, nothing is pushed."""
    repo = tmp_path / "scratch"
    (repo / ".github" / "workflows").mkdir(parents=True)
    snippet = ROOT.joinpath("README.md").read_text().split("## In another repository's CI", 1)[1]
    workflow = re.search(r"```yaml\n(.*?)```", snippet, re.S)
    assert workflow is not None
    (repo / ".github" / "workflows" / "gpu.yml").write_text(workflow.group(1))
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.email=s@e", "-c", "user.name=s", "commit", "-q", "--allow-empty", "-m", "a"],
                   cwd=repo, check=True)  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(ROOT / "devtools" / "run_action.py"), str(repo / ".github/workflows/gpu.yml"),
         "--event", "push", "--token", "local", "--set", "install=true", "--set", f"output={tmp_path / 'out'}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    log = done.stdout + done.stderr
    assert done.returncode == 1, log
    assert "run_action: step: The suite under --syncguard, against the baselines" in log
    assert "no CUDA device visible on this runner" in log
    assert "run_action: skipped: Post the report on the pull request" in log
    assert "results-*.json: not a readable syncguard results file" in log  # the history step ran, and said why not
    assert "skipped: Keep the results, report and traces (uses actions/upload-artifact" in log


@pytest.mark.parametrize("name", ["gpu-comment.yml", "gpu-history.yml"])
def test_a_job_that_holds_a_write_token_installs_nothing_unpinned(name: str) -> None:
    """Every package those jobs install is pinned to a version and its hash; syncguard itself is built from the
    default branch's checkout with the pinned build backend (no build isolation, which would fetch one unpinned)."""
    for job in load(name)["jobs"].values():  # the history's page job too (Pages' token)
        installs = [s["run"] for s in job["steps"] if "pip install" in s.get("run", "")]
        assert installs == ["python -m pip install --require-hashes --no-deps -r ci/report-requirements.txt && "
                            "python -m pip install --no-deps --no-build-isolation ."]  # fmt: skip
    requirements = (ROOT / "ci" / "report-requirements.txt").read_text()
    pinned = re.findall(r"^([A-Za-z0-9_.-]+)==[0-9][^ ]* \\\n    --hash=sha256:[0-9a-f]{64}$", requirements, re.M)
    assert sorted(pinned) == ["filelock", "junitparser", "setuptools"]
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # What the report and history commands import (test_the_cli_commands_run_without_torch): not torch's side.
    torch_side = {"torch", "pytest", "ninja", "orjson", "numpy"}
    needed = {re.split(r"[<>=]", d)[0] for d in project["project"]["dependencies"]} - torch_side
    assert needed <= set(pinned)


def test_the_history_branchs_ruleset_lets_only_github_actions_write_it() -> None:
    """The ruleset docs/howto/history.md applies (``gh api -X POST repos/OWNER/NAME/rulesets --input
    ci/history-ruleset.json``): the history branch by its exact name, creation, update, deletion and force-push
    restricted, and the GitHub Actions app (the history workflow's token) the one actor that bypasses it."""
    from pytest_syncguard.gate.history_branch import BRANCH

    ruleset = json.loads((ROOT / "ci" / "history-ruleset.json").read_text())
    assert ruleset["target"] == "branch" and ruleset["enforcement"] == "active"
    assert ruleset["conditions"]["ref_name"] == {"include": [f"refs/heads/{BRANCH}"], "exclude": []}
    assert {r["type"] for r in ruleset["rules"]} == {"creation", "update", "deletion", "non_fast_forward"}
    assert ruleset["bypass_actors"] == [{"actor_id": 15368, "actor_type": "Integration", "bypass_mode": "always"}]
    assert "ci/history-ruleset.json" in (ROOT / "docs" / "howto" / "history.md").read_text()


def test_the_gitlab_template_runs_gpu_jobs_only_for_merge_requests_and_the_default_branch() -> None:
    """ci/gitlab/syncguard.gitlab-ci.yml: the GPU job on a `gpu` runner for a merge request's pipeline (a fork's only
    when a maintainer runs it in this project) and the default branch's pushes; the note and the history on any
    runner, after it, whatever its outcome; every syncguard command in it one the CLI accepts."""
    import shlex

    from pytest_syncguard.gate.cli import build_parser

    template = yaml.safe_load((ROOT / "ci" / "gitlab" / "syncguard.gitlab-ci.yml").read_text())
    gpu, note, history = (template[f"syncguard:{name}"] for name in ("gpu", "comment", "history"))
    assert gpu["tags"] == ["gpu"] and "ci/run_gpu_suite.sh" in " ".join(gpu["script"])
    conditions = [rule["if"] for rule in gpu["rules"]]
    assert conditions == [
        '$CI_PIPELINE_SOURCE == "merge_request_event"',
        '$CI_COMMIT_BRANCH == $CI_DEFAULT_BRANCH && $CI_PIPELINE_SOURCE == "push"',
    ]
    for job in (note, history):
        assert "tags" not in job and job["needs"] == ["syncguard:gpu"]
        assert all(rule.get("when") == "always" for rule in job["rules"])
        assert any("--require-hashes" in line for line in job["script"])  # the pinned report tools only
    assert [rule["if"] for rule in note["rules"]] == ['$CI_PIPELINE_SOURCE == "merge_request_event"']
    assert history["rules"][0]["if"].startswith("$CI_COMMIT_BRANCH == $CI_DEFAULT_BRANCH")
    assert history["resource_group"] == "syncguard-history"
    commands = [
        line.strip()
        for job in (gpu, note, history)
        for block in job["script"]
        for line in block.splitlines()
        if line.strip().startswith("syncguard ")
    ]
    assert len(commands) == 2
    values = {"CI_MERGE_REQUEST_IID": "7", "body": "out/report-h100.md", "slug": "h100", "SYNCGUARD_OUT": "out",
              "CI_COMMIT_SHA": "a" * 40}  # fmt: skip
    parser = build_parser()
    for command in commands:
        args = parser.parse_args(shlex.split(re.sub(r"\$(\w+)", lambda m: values[m.group(1)], command))[1:])
        assert args.command in ("comment", "history")


def test_the_readmes_step_is_what_the_fork_safe_set_waits_for() -> None:
    """Copied as they are, the comment and history workflows run after the README's workflow (by its name) and find
    its artifact (by the action's default name)."""
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("```yaml") + len("```yaml") : readme.index("```", readme.index("```yaml") + 7)]
    workflow = yaml.safe_load(block)
    action = yaml.safe_load(ACTION.read_text())
    for name in ("gpu-comment.yml", "gpu-history.yml"):
        follower = load(name)
        trigger = follower.get("on", follower.get(True))
        assert trigger["workflow_run"]["workflows"] == [workflow["name"]]
        downloads = [
            s for job in follower["jobs"].values() for s in job["steps"] if "download-artifact" in str(s.get("uses"))
        ]
        assert downloads and all(s["with"]["name"] == action["inputs"]["artifact"]["default"] for s in downloads)
