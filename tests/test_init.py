"""``syncguard init`` as a new user runs it: what it writes follows the workflow rules this repository keeps, a second
run never replaces what it did not write, the vendored action is the repository's own, and a scratch repository goes
from ``syncguard init`` to its first pull-request comment on a CPU (``SYNCGUARD_REQUIRE_GPU=false``): an adoption PR,
push 1 and push 2 recorded into the history, and a PR that plants a host read, failed with its line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from pytest_syncguard.environment import has_cuda_driver
from pytest_syncguard.gate.cli import main
from pytest_syncguard.gate.scaffold import ACTION_DIR, ARTIFACT, FORK_SAFE, SINGLE, TEST, VENDORED, WORKFLOW
from pytest_syncguard.gate.scaffold.owned import MANIFEST
from tests import warm
from tests.test_comment import FakeGitHub

ROOT = Path(__file__).resolve().parents[1]
#: Where each vendored file comes from in this repository.
SOURCES = {"action.yml": ".github/actions/syncguard/action.yml", "run_gpu_suite.sh": "ci/run_gpu_suite.sh",
           "report-requirements.txt": "ci/report-requirements.txt"}  # fmt: skip


def init(repo: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(["init", str(repo), "--package", "pytest-syncguard==0.1.0", *args])
    said = capsys.readouterr()
    return status, said.out + said.err


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def workflow(path: Path) -> dict[Any, Any]:
    data = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return dict(data)


def test_a_second_init_replaces_only_what_it_wrote_and_says_what_it_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mine"\n\n[tool.pytest.ini_options]\naddopts = "-q"\n')
    status, said = init(tmp_path, capsys=capsys)
    assert status == 0, said
    written = json.loads((tmp_path / MANIFEST).read_text())["files"]
    assert set(written) == {*SINGLE, TEST, *(f"{ACTION_DIR}/{name}" for name in VENDORED)}  # no pytest.ini
    assert "pytest's configuration is pyproject.toml: left alone" in said
    test = tmp_path / TEST
    test.write_text(test.read_text() + "# my loop\n")
    (tmp_path / ".github/workflows/syncguard.yml").write_text("name: mine\n")
    mine = tmp_path / ".github/workflows/syncguard-gpu.yml"
    mine.write_text("name: my own GPU workflow\n")  # a file init did not write, where it would write one
    status, said = init(tmp_path, "--fork-safe", capsys=capsys)
    assert status == 0, said
    assert f"left alone  {TEST} (edited since init wrote it)" in said
    assert "left alone  .github/workflows/syncguard-gpu.yml (init did not write it)" in said
    assert "left alone  .github/workflows/syncguard.yml (edited since init wrote it: remove it yourself)" in said
    assert test.read_text().endswith("# my loop\n") and mine.read_text() == "name: my own GPU workflow\n"
    assert "     wrote  .github/workflows/syncguard-comment.yml" in said
    # Back to one job: the fork-safe files init wrote and nobody edited go; the single job is still the user's.
    status, said = init(tmp_path, capsys=capsys)
    assert "   removed  .github/workflows/syncguard-comment.yml" in said
    assert not (tmp_path / ".github/workflows/syncguard-comment.yml").exists() and mine.exists()
    (tmp_path / MANIFEST).write_text("{not json")
    status, said = init(tmp_path, capsys=capsys)
    assert status == 2 and f"{tmp_path / MANIFEST}: not init's record of what it wrote" in said
    assert main(["init", str(tmp_path / "absent")]) == 2
    assert "absent: no such folder" in capsys.readouterr().err
    (tmp_path / MANIFEST).unlink()
    (tmp_path / ".github" / "workflows" / "syncguard.yml").unlink()
    (tmp_path / ".github" / "workflows" / "syncguard.yml").mkdir()  # where a file must go, a folder
    assert main(["init", str(tmp_path), "--package", "p"]) == 0  # left alone: not a regular file, said
    assert "left alone  .github/workflows/syncguard.yml (not a regular file)" in capsys.readouterr().out
    status, said = init(tmp_path, "--action", "acme/pytest-syncguard@v1", capsys=capsys)
    assert status == 2 and "pinned to a full commit" in said  # a tag can move under the workflow


@pytest.mark.parametrize(
    "choice", [(), ("--fork-safe",), ("--fork-safe", "--action", "acme/pytest-syncguard@" + "a" * 40)]
)
def test_what_init_writes_keeps_the_workflow_rules_and_its_names_agree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], choice: tuple[str, ...]
) -> None:
    status, said = init(tmp_path, "--tests", 'tests -k "decode or greedy"', *choice, capsys=capsys)
    assert status == 0, said
    names = FORK_SAFE if "--fork-safe" in choice else SINGLE
    flows = {path: workflow(tmp_path / path) for path in names}
    for path, flow in flows.items():
        text = (tmp_path / path).read_text()
        assert "permissions" in flow and "pull_request_target" not in flow["on"] and "secrets." not in text, path
        for job in flow["jobs"].values():
            for step in job["steps"]:
                uses = step.get("uses", "")
                if uses and not uses.startswith("./"):
                    assert re.fullmatch(r"[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}", uses), uses
                assert "${{" not in step.get("run", ""), step["run"]
                if "actions/checkout" in uses:
                    assert step["with"]["persist-credentials"] is False
    gpu = next(flow for flow in flows.values() if flow["name"] == WORKFLOW)
    (job,) = gpu["jobs"].values()
    (suite,) = [step for step in job["steps"] if ".github/actions/syncguard" in step.get("uses", "")]
    assert suite["with"]["tests"] == 'tests -k "decode or greedy"' and suite["with"]["artifact"] == ARTIFACT
    if "--action" in choice:
        assert suite["uses"] == f"acme/pytest-syncguard/{ACTION_DIR}@{'a' * 40}"
        assert not (tmp_path / ACTION_DIR / "action.yml").exists()
    else:
        assert suite["uses"] == f"./{ACTION_DIR}" and (tmp_path / ACTION_DIR / "action.yml").is_file()
    if "--fork-safe" in choice:
        assert gpu["permissions"] == {"contents": "read"} and "permissions" not in job and "token" not in suite["with"]
        assert "gpu-approved" in job["if"]
        for flow in flows.values():
            if flow is gpu:
                continue
            assert flow["on"]["workflow_run"]["workflows"] == [WORKFLOW]  # they wait for the GPU job by its name
            follower, *published = flow["jobs"].values()  # the history's page job after its record
            downloads = [s for s in follower["steps"] if "download-artifact" in s.get("uses", "")]
            assert [s["with"]["name"] for s in downloads] == [ARTIFACT]  # and find its artifact by its name
            assert all(job["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}
                       for job in published)  # fmt: skip
            installs = [s["run"] for s in follower["steps"] if "pip install" in s.get("run", "")]
            assert installs == [f"python -m pip install --require-hashes --no-deps -r {ACTION_DIR}/report-requirements.txt"
                                ' && python -m pip install --no-deps --no-build-isolation "$PACKAGE"']  # fmt: skip
            assert (tmp_path / ACTION_DIR / "report-requirements.txt").is_file()
    else:  # one job that holds a write token: never a fork's code
        assert (
            job["if"]
            == "github.event_name == 'push' || github.event.pull_request.head.repo.full_name == github.repository"
        )
        assert suite["with"]["comment"] == "true"
    zizmor = shutil.which("zizmor")
    if zizmor is not None:
        done = subprocess.run([zizmor, "--offline", "--persona", "auditor", "--no-progress", str(tmp_path / ".github")],
                              capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0 and "No findings to report" in done.stdout + done.stderr, done.stdout + done.stderr


def test_the_vendored_action_is_the_repositorys_own_in_the_checkout_and_in_the_wheel(tmp_path: Path) -> None:
    from pytest_syncguard.gate.scaffold import template

    for name, source in SOURCES.items():
        assert template(name) == (ROOT / source).read_text(), name
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(ROOT), "-w",
                    str(tmp_path)], check=True, capture_output=True, cwd=tmp_path)  # fmt: skip
    (wheel,) = tmp_path.glob("pytest_syncguard-*.whl")
    with zipfile.ZipFile(wheel) as held:
        for name, source in SOURCES.items():
            assert held.read(f"pytest_syncguard/gate/scaffold/{name}").decode() == (ROOT / source).read_text(), name


DECODE = """import torch


def decode(model, prompt, steps):
    tokens = prompt
    for _ in range(steps):
        logits = model(tokens[:, -1:])
        next_token = logits[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, next_token], dim=1)
    return tokens
"""


def test_device_tells_a_machine_without_the_cuda_driver_without_importing_torch() -> None:
    """`syncguard device` starts every job of init's workflow: where the CUDA driver's library cannot be loaded it
    says "cpu" and torch's version without importing torch (1.1 s of CPU); with a GPU it asks torch."""
    code = "import sys; from pytest_syncguard.gate.cli import main; main(['device', '--json']); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    *printed, imported = done.stdout.strip().splitlines()
    data = json.loads("\n".join(printed))
    assert data["torch"] == str(torch.__version__) and data["python"] == sys.version.split()[0]
    if torch.cuda.is_available():
        assert data["slug"] != "cpu" and data["cuda"] == torch.version.cuda and imported == "True"
    else:
        assert data["slug"] == "cpu" and data["cuda"] is None
        assert imported == str(has_cuda_driver()), "torch is imported only where the driver could be loaded"


def test_from_init_to_the_first_comment(tmp_path: Path) -> None:
    """The tutorial's flow (docs/tutorial-ci.md), run through init's own workflow by devtools/run_action.py: on a CPU
    as its rehearsal, on a GPU machine as the GPU job."""
    origin, repo = tmp_path / "origin.git", tmp_path / "repo"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    for key, value in (("user.email", "ci@example.com"), ("user.name", "ci")):
        git(repo, "config", key, value)
    (repo / "mygen").mkdir()
    (repo / "mygen" / "__init__.py").write_text("")
    (repo / "mygen" / "decode.py").write_text(DECODE)
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "a decode loop")
    git(repo, "remote", "add", "origin", str(origin))
    git(repo, "push", "-q", "origin", "main")
    gh = FakeGitHub(tmp_path, [], login="github-actions[bot]")
    gpu = torch.cuda.is_available()  # on a GPU machine the job runs as on a GPU runner, CUDA budgets required
    env = {**gh.env(), "SYNCGUARD_REQUIRE_GPU": "true" if gpu else "false", "SYNCGUARD_NATIVE": "1" if gpu else "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(repo)]),
           "PATH": os.pathsep.join(filter(None, [str(gh.bin), os.path.dirname(warm.launcher() or ""),
                                                  str(Path(sys.executable).parent), os.environ["PATH"]]))}  # fmt: skip
    if not gpu:
        env.pop("CUDA_VISIBLE_DEVICES", None)

    def job(event: str, out: str, *args: str) -> tuple[int, str]:
        done = subprocess.run([sys.executable, str(ROOT / "devtools" / "run_action.py"),
                               str(repo / ".github/workflows/syncguard.yml"), "--event", event, "--token", "local",
                               "--set", "install=true", "--set", f"output={tmp_path / out}", *args],
                              cwd=repo, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
        return done.returncode, done.stdout + done.stderr

    # The adoption PR: init's files and a test of the project's loop, which the base does not have.
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-qb", "adopt")
    done = subprocess.run([sys.executable, "-m", "pytest_syncguard.gate.cli", "init", "--package", str(ROOT)], cwd=repo,
                          env=env, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    test = repo / TEST
    test.write_text(test.read_text().replace("\ndef decode(", "\nfrom mygen.decode import decode\n\n\ndef _template("))
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "adopt syncguard")
    status, log = job("pull_request", "pr1", "--pr", "7", "--base", base)
    assert status == 0, log[-12000:]
    assert ("SYNCGUARD_REQUIRE_GPU=false: a rehearsal" in log) != gpu
    slug = (tmp_path / "pr1" / "device-slug").read_text().strip()
    assert (slug == "cpu") != gpu
    (comment,) = gh.comments
    assert comment["body"].splitlines()[0].startswith("**✅ syncguard: no regressions: 1 test passed**")
    assert f"the base has none of the tests: {TEST} is new in this change" in comment["body"]

    # Merged: push 1 is the history's run 1, push 2 is judged against it (pytest's summary and the report alike).
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--ff-only", "adopt")
    status, log = job("push", "push1")
    assert status == 0 and f"({slug}: run 1) pushed to origin syncguard-history" in log, log[-4000:]
    git(repo, "commit", "-q", "--allow-empty", "-m", "second")
    status, log = job("push", "push2")
    assert status == 0 and f"({slug}: run 2) pushed to origin syncguard-history" in log, log[-4000:]
    assert (
        "new (no baseline entry)" not in log and f"judged against the default branch's history: 1 run of {slug}" in log
    )
    assert (tmp_path / "push2" / f"report-{slug}.full.md").is_file()

    # A debug log that reads the device every step: the budget fails with the line, the comment is updated.
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-qb", "debug")
    source = repo / "mygen" / "decode.py"
    source.write_text(source.read_text().replace(
        "dim=1)\n", "dim=1)\n        print('token', next_token[0, 0].item())\n"))  # fmt: skip
    git(repo, "commit", "-qam", "debug log")
    status, log = job("pull_request", "pr2", "--pr", "7", "--base", base)
    assert status == 1, log[-4000:]
    (comment,) = gh.comments
    body = comment["body"]
    assert body.splitlines()[0].startswith("**❌ syncguard: 1 of 1 test failed")
    assert "16 syncs at `mygen/decode.py:10` in `decode`: `print('token', next_token[0, 0].item())`" in body
    assert f"judged against the default branch's history: 2 runs of {slug}" in body
