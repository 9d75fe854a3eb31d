"""``syncguard comment --forge gitlab`` against a stand-in of GitLab's REST API served over HTTP on localhost
(tests/stand_ins/gitlab.py), run as the command a GitLab job runs; and GitLab's links to lines and commits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_syncguard.gate.forge.comment import marker
from pytest_syncguard.gate.forge.gitlab import gitlab
from pytest_syncguard.render.chain import Site
from pytest_syncguard.render.links import SiteLinks
from tests.stand_ins.gitlab import StandIn

PROJECT = "decoding/team/engine"
KEY = "nvidia-h100-80gb-hbm3"
MARK = marker(KEY)


@pytest.fixture
def api() -> StandIn:
    with StandIn() as stand_in:
        yield stand_in


def comment(api: StandIn, tmp_path: Path, body: str = "**✅ syncguard: no regressions**", *extra: str,
            token: str | None = "glpat-stand-in", job: bool = True) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """The command a GitLab job's script runs: the forge from GITLAB_CI, the server and project from the job."""
    file = tmp_path / "body.md"
    file.write_text(body, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CI_", "GITLAB", "SYNCGUARD_GITLAB"))}
    if job:
        env.update(GITLAB_CI="true", CI_SERVER_URL=api.url, CI_PROJECT_PATH=PROJECT)
    if token is not None:
        env["SYNCGUARD_GITLAB_TOKEN"] = token
    args = ["comment", "--pr", "7", "--body-file", str(file), "--key", KEY, *extra]
    return subprocess.run([sys.executable, "-m", "pytest_syncguard.gate.cli", *args], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_a_merge_request_gets_one_note_per_key_created_then_updated(api: StandIn, tmp_path: Path) -> None:
    api.note(PROJECT, 7, "LGTM", "reviewer")
    api.note(PROJECT, 7, "added 1 commit", "reviewer", system=True)
    first = comment(api, tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("syncguard comment: created comment 1003 ")
    assert f"{api.url}/{PROJECT}/-/merge_requests/7#note_1003" in first.stdout
    second = comment(api, tmp_path, "**❌ syncguard: 1 regression**")
    assert second.returncode == 0 and "updated comment 1003" in second.stdout, second.stderr
    notes = api.notes[(PROJECT, 7)]
    assert [n["body"].splitlines()[0] for n in notes] == ["LGTM", "added 1 commit", "**❌ syncguard: 1 regression**"]
    assert notes[-1]["body"].rstrip().endswith(MARK)
    # Every call named the project by its URL-encoded path and carried the token.
    assert all("/projects/decoding%2Fteam%2Fengine/" in path for method, path, _ in api.calls if "/notes" in path)


def test_anothers_note_that_quotes_the_marker_is_never_edited(api: StandIn, tmp_path: Path) -> None:
    quoted = api.note(PROJECT, 7, f"the bot wrote\n\n{MARK}", "reviewer")
    done = comment(api, tmp_path)
    assert done.returncode == 0 and "created comment" in done.stdout, done.stderr
    assert quoted["body"] == f"the bot wrote\n\n{MARK}"
    assert len(api.notes[(PROJECT, 7)]) == 2


def test_the_notes_are_read_page_by_page_and_a_repeating_server_is_stopped(api: StandIn, tmp_path: Path) -> None:
    for i in range(150):
        api.note(PROJECT, 7, f"note {i}", "reviewer")
    mine = api.note(PROJECT, 7, f"old report\n\n{MARK}", "syncguard-bot")
    done = comment(api, tmp_path)
    assert done.returncode == 0 and f"updated comment {mine['id']}" in done.stdout, done.stderr
    assert sum("/notes?" in path for _, path, _ in api.calls) == 2
    api.repeat_pages = True
    again = comment(api, tmp_path)
    assert again.returncode == 2 and "with page 1's again: stopped rather than page forever" in again.stderr


def test_without_a_token_or_with_a_refused_one_the_command_says_so(api: StandIn, tmp_path: Path) -> None:
    missing = comment(api, tmp_path, token=None)
    assert missing.returncode == 2
    assert "no GitLab token: set SYNCGUARD_GITLAB_TOKEN or GITLAB_TOKEN" in missing.stderr
    refused = comment(api, tmp_path, token="glpat-wrong")
    assert refused.returncode == 2 and "HTTP 401" in refused.stderr and "Traceback" not in refused.stderr
    assert api.notes.get((PROJECT, 7), []) == []


def test_outside_a_job_the_forge_server_and_project_are_options(api: StandIn, tmp_path: Path) -> None:
    no_project = comment(api, tmp_path, "body", "--forge", "gitlab", "--server", api.url, job=False)
    assert no_project.returncode == 2 and "pass --repo GROUP/PROJECT" in no_project.stderr
    done = comment(api, tmp_path, "body", "--forge", "gitlab", "--server", api.url, "--repo", PROJECT, job=False)
    assert done.returncode == 0 and "created comment" in done.stdout, done.stderr
    climbing = comment(api, tmp_path, "body", "--repo", "group/../other")
    assert climbing.returncode == 2 and "not a GitLab repository's GROUP/.../PROJECT" in climbing.stderr


def test_a_body_over_gitlabs_limit_is_refused_before_any_call(api: StandIn, tmp_path: Path) -> None:
    done = comment(api, tmp_path, "x" * 1_000_001)
    assert done.returncode == 2 and "GitLab's limit is 1000000" in done.stderr
    assert api.calls == []


def test_gitlab_links_a_line_and_a_commit_under_the_projects_pages() -> None:
    forge = gitlab("https://gitlab.example.com/")
    web = forge.web(PROJECT)
    commit = "0123456789abcdef0123456789abcdef01234567"
    links = SiteLinks.of(web, commit, Path(__file__).parents[1])
    assert links is not None
    assert links.url(Site("tests/test_gitlab.py", 3)) == (
        f"https://gitlab.example.com/{PROJECT}/-/blob/{commit}/tests/test_gitlab.py#L3"
    )
    assert web.commit(commit) == f"https://gitlab.example.com/{PROJECT}/-/commit/{commit}"
    assert forge.repository_problem("group/sub/project") is None
    assert forge.repository_problem("project") is not None
    assert forge.repository_problem("group/./project") is not None
    with pytest.raises(Exception, match="not an http"):
        gitlab("ftp://gitlab.example.com")
