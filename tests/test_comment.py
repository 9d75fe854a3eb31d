"""``syncguard comment`` against a stand-in ``gh`` first on PATH (tests/stand_ins/gh.py): it records every call
and answers with canned API pages, since nothing here can reach GitHub."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_syncguard.gate.forge.comment import marker

STAND_IN = Path(__file__).parent / "stand_ins" / "gh.py"
MARK = marker("nvidia-h100-80gb-hbm3")


class FakeGitHub:
    def __init__(self, root: Path, comments: list[Any], login: str | None = "syncguard-bot", **state: Any) -> None:
        self.bin = root / "bin"
        self.bin.mkdir()
        gh = self.bin / "gh"
        gh.write_text(f"#!{sys.executable}\nimport runpy\nrunpy.run_path({str(STAND_IN)!r}, run_name='__main__')\n")
        gh.chmod(0o755)
        self.state = root / "state.json"
        self.log = root / "calls.jsonl"
        self.state.write_text(json.dumps({"repo": "acme/decoder", "login": login, "comments": comments, **state}))
        self.body = root / "body.md"
        self.body.write_text("**✅ syncguard: no regressions** (3 tests)\n")

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_ACTIONS", "GH_TOKEN", "GITHUB_TOKEN")}
        env.update(PATH=f"{self.bin}{os.pathsep}{env.get('PATH', '')}", FAKE_GH_STATE=str(self.state))
        env["FAKE_GH_LOG"] = str(self.log)
        return env

    def comment(self, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        args = ["--pr", "7", "--body-file", str(self.body), "--key", "nvidia-h100-80gb-hbm3", *extra]
        return subprocess.run(
            [sys.executable, "-m", "pytest_syncguard.gate.cli", "comment", *args],
            env=env or self.env(),
            capture_output=True,
            text=True,
        )

    @property
    def comments(self) -> list[dict[str, Any]]:
        return list(json.loads(self.state.read_text())["comments"])

    @property
    def calls(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []


def others(count: int, start: int = 1) -> list[dict[str, Any]]:
    return [{"id": start + i, "user": {"login": "reviewer"}, "body": f"comment {i}"} for i in range(count)]


def test_creates_a_comment_with_the_hidden_marker(tmp_path: Path) -> None:
    gh = FakeGitHub(tmp_path, others(3))
    done = gh.comment()
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("syncguard comment: created comment 4 ")
    created = gh.comments[-1]
    assert created["body"].startswith("**✅ syncguard: no regressions**") and created["body"].rstrip().endswith(MARK)
    posts = [c for c in gh.calls if "POST" in c["argv"]]
    assert len(posts) == 1 and posts[0]["argv"][3] == "repos/acme/decoder/issues/7/comments"


def test_pages_through_all_comments_and_updates_its_own(tmp_path: Path) -> None:
    mine = {"id": 180, "user": {"login": "syncguard-bot"}, "body": f"old report\n\n{MARK}\n"}
    gh = FakeGitHub(tmp_path, [*others(179), mine, *others(30, start=181)])
    done = gh.comment("--repo", "acme/decoder")
    assert done.returncode == 0, done.stderr
    assert "updated comment 180" in done.stdout
    pages = [c["argv"][1] for c in gh.calls if c["argv"][0] == "api" and c["argv"][1].startswith("repos/")]
    assert pages == [f"repos/acme/decoder/issues/7/comments?per_page=100&page={p}" for p in (1, 2, 3)]
    bodies = {c["id"]: c["body"] for c in gh.comments}
    assert bodies[180].startswith("**✅ syncguard") and len(gh.comments) == 210
    assert not [c for c in gh.calls if "POST" in c["argv"]]


def test_never_edits_someone_elses_comment_even_with_the_marker(tmp_path: Path) -> None:
    quoted = {"id": 5, "user": {"login": "mallory"}, "body": f"look: {MARK}"}
    other_key = {"id": 6, "user": {"login": "syncguard-bot"}, "body": marker("cpu")}
    gh = FakeGitHub(tmp_path, [*others(4), quoted, other_key])
    done = gh.comment()
    assert done.returncode == 0, done.stderr
    assert "created comment 7" in done.stdout
    bodies = {c["id"]: c["body"] for c in gh.comments}
    assert bodies[5] == f"look: {MARK}" and bodies[6] == marker("cpu")
    assert not [c for c in gh.calls if "PATCH" in c["argv"]]


def test_a_marker_quoted_inside_another_keys_comment_marks_nothing(tmp_path: Path) -> None:
    """The other GPU model's comment holds a test id that quotes this key's marker in a code span: it stays that
    model's comment; this key's job creates its own."""
    hostile = f"- `tests/test_x.py::test[{MARK}]` on `cpu`"
    other_model = {"id": 5, "user": {"login": "syncguard-bot"}, "body": f"report\n{hostile}\n\n{marker('cpu')}\n"}
    gh = FakeGitHub(tmp_path, [*others(4), other_model])
    done = gh.comment()
    assert done.returncode == 0, done.stderr
    assert "created comment 6" in done.stdout
    assert {c["id"]: c["body"] for c in gh.comments}[5] == other_model["body"]
    assert not [c for c in gh.calls if "PATCH" in c["argv"]]


def test_a_workflow_token_posts_as_github_actions(tmp_path: Path) -> None:
    mine = {"id": 2, "user": {"login": "github-actions[bot]"}, "body": MARK}
    gh = FakeGitHub(tmp_path, [*others(1), mine], login=None)
    assert "cannot tell which account" in gh.comment().stderr  # outside a workflow: refuses to guess
    done = gh.comment(env={**gh.env(), "GITHUB_ACTIONS": "true"})
    assert done.returncode == 0 and "updated comment 2" in done.stdout


def test_missing_or_unauthenticated_gh_is_a_clear_error(tmp_path: Path) -> None:
    gh = FakeGitHub(tmp_path, [])
    state = json.loads(gh.state.read_text())
    gh.state.write_text(json.dumps({**state, "authenticated": False}))
    done = gh.comment()
    assert done.returncode == 2 and "gh is not authenticated: run `gh auth login`" in done.stderr
    no_gh = {**gh.env(), "PATH": str(tmp_path / "empty")}
    done = gh.comment(env=no_gh)
    assert done.returncode == 2 and "`gh` is not on PATH" in done.stderr


def test_a_gh_that_cannot_start_hangs_or_a_body_that_is_not_utf8_is_a_clear_error(tmp_path: Path) -> None:
    gh = FakeGitHub(tmp_path, [])
    real = (gh.bin / "gh").read_text()
    (gh.bin / "gh").write_text("#!/nonexistent/interpreter\n")  # on PATH, but exec fails
    done = gh.comment()
    assert done.returncode == 2 and "gh auth status could not run" in done.stderr and "Traceback" not in done.stderr
    (gh.bin / "gh").write_text(f"#!{sys.executable}\nimport time\ntime.sleep(30)\n")  # a hung keyring, say
    done = gh.comment("--gh-timeout", "0.5")
    assert done.returncode == 2 and "gh auth status did not finish within 0.5 s (--gh-timeout)" in done.stderr
    (gh.bin / "gh").write_text(real)
    gh.body.write_bytes(b"\xff\xfe not UTF-8")
    done = gh.comment()
    assert done.returncode == 2 and f"cannot read --body-file {gh.body} as UTF-8 text" in done.stderr
    assert gh.comments == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--key", "a b"], "--key 'a b'"),
        (["--repo", "not a repo"], "--repo 'not a repo'"),
    ],
)
def test_bad_arguments_name_the_option(tmp_path: Path, args: list[str], message: str) -> None:
    gh = FakeGitHub(tmp_path, [])
    done = gh.comment(*args)
    assert done.returncode == 2 and message in done.stderr
    assert not gh.calls  # nothing was sent


def test_a_body_over_githubs_limit_is_refused(tmp_path: Path) -> None:
    gh = FakeGitHub(tmp_path, [])
    gh.body.write_text("x" * 70_000)
    done = gh.comment()
    assert done.returncode == 2 and "GitHub's limit is 65536" in done.stderr


# -- syncguard post-artifact: the workflow_run job's handling of an untrusted artifact ---------------------
SHA = "a" * 40
JUNIT = """<testsuites><testsuite name="pytest" tests="1"><testcase classname="t" name="test_x">
<properties><property name="syncguard.nodeid" value="t.py::test_x"/><property name="syncguard.verdict" value="pass"/>
<property name="syncguard.device" value="cuda"/><property name="syncguard.device_slug" value="nvidia-h100-80gb-hbm3"/>
<property name="syncguard.syncs" value="0"/><property name="syncguard.baseline" value="new"/></properties>
</testcase></testsuite></testsuites>"""


def poster(tmp_path: Path, pr: str, *, head: str = SHA, fork: bool = True, slug: str = "nvidia-h100-80gb-hbm3",
           results: dict[str, str] | None = None, origin: bool = True, plant: Any = None, **answers: Any,
           ) -> tuple[FakeGitHub, Any]:  # fmt: skip
    """The comment job run on an artifact (its JUnit file, or ``results`` files by name), in a checkout of the default
    branch whose origin has no history branch yet (``origin`` False: a folder that is no git repository)."""
    gh = FakeGitHub(tmp_path, [], login=None, **answers)
    if origin:
        subprocess.run(["git", "init", "-q", "--bare", str(tmp_path / "origin.git")], check=True)
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
        subprocess.run(
            ["git", "-C", str(tmp_path), "remote", "add", "origin", str(tmp_path / "origin.git")], check=True
        )
    state = json.loads(gh.state.read_text())
    state["pulls"] = {
        "12": {
            "head": {"sha": head, "repo": {"full_name": "mallory/decoder" if fork else "acme/decoder"}},
            "labels": [{"name": "gpu-approved"}, {"name": "perf"}],
        }
    }
    gh.state.write_text(json.dumps(state))
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    (artifact / "pr-number").write_text(pr)
    (artifact / "device-slug").write_text(f"{slug}\n")
    for name, text in (results or {"junit-nvidia-h100-80gb-hbm3.xml": JUNIT}).items():
        (artifact / name).write_text(text)
    if plant is not None:
        plant(artifact)
    env = {**gh.env(), "GITHUB_ACTIONS": "true"}
    command = [sys.executable, "-m", "pytest_syncguard.gate.cli", "post-artifact", str(artifact), "--repo",
               "acme/decoder", "--head-sha", SHA, "--work", str(tmp_path)]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True)
    return gh, done


def test_the_poster_comments_and_removes_the_forks_approval(tmp_path: Path) -> None:
    gh, done = poster(tmp_path, "12\n")
    assert done.returncode == 0, done.stderr
    (created,) = gh.comments
    assert created["body"].startswith(
        "**✅ syncguard: no regressions: 1 test passed**\n\n1 test on `nvidia-h100-80gb-hbm3`"
    )
    assert created["body"].rstrip().endswith(MARK)
    labels = json.loads(gh.state.read_text())["pulls"]["12"]["labels"]
    assert labels == [{"name": "perf"}]
    assert json.loads(gh.state.read_text())["statuses"] == [{"sha": SHA, "state": "success", "context":
        "syncguard/nvidia-h100-80gb-hbm3", "description": "syncguard passed"}]  # fmt: skip


def test_a_pull_request_labelled_syncguard_accept_posts_its_regression_as_accepted_and_passes(tmp_path: Path) -> None:
    """The fork-safe job reads the PR's labels through GitHub's API (the fork cannot set them): with
    ``syncguard-accept``, a regression against the baseline (syncs 0 -> 3) is posted under ⚠️ as accepted and the
    commit status passes; without it, the same artifact fails."""
    from pytest_syncguard.judge.baselines import document

    regressed = JUNIT.replace('name="syncguard.syncs" value="0"', 'name="syncguard.syncs" value="3"')
    results = {"junit-nvidia-h100-80gb-hbm3.xml": regressed}

    def with_baseline(folder: Path) -> None:
        (folder / "baselines").mkdir()
        baseline = document("nvidia-h100-80gb-hbm3", {}, {"t.py::test_x": {"syncs": 0.0}})
        (folder / "baselines" / "nvidia-h100-80gb-hbm3.json").write_text(baseline)

    for accept in (False, True):
        folder = tmp_path / str(accept)
        folder.mkdir()
        with_baseline(folder)
        gh = FakeGitHub(folder, [], login=None)
        state = json.loads(gh.state.read_text())
        state["pulls"] = {"12": {"head": {"sha": SHA, "repo": {"full_name": "mallory/decoder"}},
                                 "labels": [{"name": "syncguard-accept"}] if accept else []}}  # fmt: skip
        gh.state.write_text(json.dumps(state))
        artifact = folder / "artifact"
        artifact.mkdir()
        (artifact / "pr-number").write_text("12")
        (artifact / "device-slug").write_text("nvidia-h100-80gb-hbm3\n")
        for name, text in results.items():
            (artifact / name).write_text(text)
        command = [sys.executable, "-m", "pytest_syncguard.gate.cli", "post-artifact", str(artifact), "--repo",
                   "acme/decoder", "--head-sha", SHA, "--work", str(folder / "work")]  # fmt: skip
        done = subprocess.run(command, env={**gh.env(), "GITHUB_ACTIONS": "true"}, cwd=folder, capture_output=True,
                              text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr
        (created,) = gh.comments
        status = _state(gh)["statuses"][0]["state"]
        if accept:
            assert created["body"].startswith("**⚠️ syncguard: 1 test passed, 1 with regressions accepted (the pull")
            assert (
                "### ⚠️ Regressions accepted as intended, the pull request is labelled syncguard-accept"
                in (created["body"])
            )
            assert status == "success"
        else:
            assert created["body"].startswith("**❌ syncguard: 1 of 1 test failed: 1 regressed") and status == "failure"


def _state(gh: FakeGitHub) -> dict[str, Any]:
    return dict(json.loads(gh.state.read_text()))


def test_a_failed_budget_is_a_failed_status_the_prs_code_does_not_set(tmp_path: Path) -> None:
    failing = JUNIT.replace('value="pass"', 'value="fail"').replace("</properties>", "</properties><failure/>")
    gh, done = poster(tmp_path, "12", results={"junit-nvidia-h100-80gb-hbm3.xml": failing})
    assert done.returncode == 0, done.stderr
    (created,) = gh.comments
    assert created["body"].startswith("**❌ syncguard:")
    assert _state(gh)["statuses"][0]["state"] == "failure"


@pytest.mark.parametrize("name", ["results-nvidia-h100-80gb-hbm3.json", "ab-nvidia-h100-80gb-hbm3.json"])
@pytest.mark.parametrize("kind", ["symlink", "oversize"])
def test_a_results_file_left_out_is_named_and_nothing_passes(tmp_path: Path, kind: str, name: str) -> None:
    """A results file that is a symbolic link, or over the size read, is named and nothing is posted (it was dropped
    with its failed budget, and the rest posted as a pass); the fork's approval goes all the same."""
    outside = tmp_path / "outside.json"
    outside.write_text("{}")

    def plant(artifact: Path) -> None:
        target = artifact / name
        if kind == "symlink":
            target.symlink_to(outside)
        else:
            with target.open("wb") as sparse:
                sparse.truncate((50 << 20) + 1)

    gh, done = poster(tmp_path, "12", plant=plant)
    assert done.returncode == 1 and f"{name}: not a regular file" in done.stderr
    assert not gh.comments and "statuses" not in _state(gh)
    assert _state(gh)["pulls"]["12"]["labels"] == [{"name": "perf"}]


def test_an_artifacts_slug_that_its_results_did_not_measure_is_refused(tmp_path: Path) -> None:
    gh, done = poster(tmp_path, "12", slug="nvidia-a100-sxm4-80gb")
    assert done.returncode == 1 and "device-slug 'nvidia-a100-sxm4-80gb' is not a GPU model its results" in done.stderr
    assert not gh.comments


def test_a_history_that_cannot_be_fetched_is_said_never_a_pass(tmp_path: Path) -> None:
    gh, done = poster(tmp_path, "12", origin=False)
    assert done.returncode == 0, done.stderr
    (created,) = gh.comments
    assert created["body"].startswith("**⚠️ syncguard: no regressions: 1 test passed; the default branch's history "
                                      "could not be read**")  # fmt: skip
    assert "⚠️ The default branch's history could not be read (`git ls-remote" in created["body"]


@pytest.mark.parametrize("answer", ["<html><body>502 Bad Gateway</body></html>", '{"message": "Not Found"}', "[]"])
def test_a_gh_that_answers_no_pull_request_is_an_error_not_a_traceback(tmp_path: Path, answer: str) -> None:
    gh, done = poster(tmp_path, "12", pull_answer=answer)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "did not answer JSON" in done.stderr or "answered no pull request" in done.stderr
    assert not gh.comments


def test_a_missing_gh_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    (artifact / "pr-number").write_text("12")
    (artifact / "device-slug").write_text("nvidia-h100-80gb-hbm3")
    env = {**os.environ, "PATH": str(tmp_path / "empty")}
    done = subprocess.run([sys.executable, "-m", "pytest_syncguard.gate.cli", "post-artifact", str(artifact),
                           "--repo", "acme/decoder", "--head-sha", SHA], env=env, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 1 and "`gh` is not on PATH" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("pr", ["12; rm -rf /", "$(id)", "0", "", "12\n13"])
def test_the_poster_refuses_a_malformed_pr_number(tmp_path: Path, pr: str) -> None:
    gh, done = poster(tmp_path, pr)
    assert done.returncode == 1 and "pr-number" in done.stderr
    assert not gh.calls


def test_the_poster_refuses_when_the_pr_moved_on(tmp_path: Path) -> None:
    gh, done = poster(tmp_path, "12", head="b" * 40)
    assert done.returncode == 1 and "not posting" in done.stderr
    assert not gh.comments


def test_a_gh_that_answers_every_page_alike_is_stopped_not_paged_forever(tmp_path: Path) -> None:
    """895 pages in 30 s and 560 MB, before."""
    gh = FakeGitHub(tmp_path, others(100), repeat_pages=True)
    done = gh.comment()
    assert done.returncode == 2
    assert "answered page 2 of the comments of acme/decoder#7 with page 1's again" in done.stderr
    assert len([c for c in gh.calls if c["argv"][0] == "api" and "comments?" in c["argv"][1]]) == 2


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"repo_view": {}}, "gh repo view named no repository ('{}'): pass --repo OWNER/NAME"),  # was a KeyError
        ({"post_answer": ""}, "gh api -X POST (create) answered no comment ('None')"),  # was a TypeError
        ({"post_answer": "[]"}, "gh api -X POST (create) answered no comment ('[]')"),  # was 'created comment 0'
    ],
)
def test_an_answer_gh_should_not_give_is_an_error_that_says_so(
    tmp_path: Path, state: dict[str, Any], message: str
) -> None:
    gh = FakeGitHub(tmp_path, others(2), **state)
    done = gh.comment()
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_odd_comments_in_a_listing_are_no_traceback(tmp_path: Path) -> None:
    """A string entry raised an AttributeError; a comment of this tool's with id "abc" a ValueError."""
    gh = FakeGitHub(tmp_path, ["just text", *others(2)])
    done = gh.comment()
    assert done.returncode == 0 and "created comment" in done.stdout, done.stderr
    (tmp_path / "again").mkdir()
    gh = FakeGitHub(tmp_path / "again", [{"id": "abc", "user": {"login": "syncguard-bot"}, "body": MARK}])
    done = gh.comment()
    assert done.returncode == 2 and "listed this tool's comment with id 'abc': not a number" in done.stderr


def test_two_runs_that_post_at_once_leave_one_comment(tmp_path: Path) -> None:
    """Two runs with the same key at once each created a comment. The one that finds an older one of its own
    after creating deletes its new comment and updates the older."""
    gh = FakeGitHub(tmp_path, others(2), race=True)
    done = gh.comment()
    assert done.returncode == 0, done.stderr
    marked = [c for c in gh.comments if MARK in c["body"]]
    assert len(marked) == 1 and marked[0]["id"] == 3
    assert "updated comment 3" in done.stdout
    assert any("DELETE" in c["argv"] for c in gh.calls)
