"""``syncguard report`` on real results and JUnit files written by pytester runs of the plugin: verdict sections,
merging, escaping of hostile test ids, truncation to GitHub's comment limit."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import cmarkgfm
import pytest

from pytest_syncguard.gate.forge.github import GITHUB
from pytest_syncguard.judge.run import compare_run
from pytest_syncguard.render.links import SiteLinks
from pytest_syncguard.render.markdown import MARKER_ROOM, code, render
from tests import warm

COMMENT_LIMIT = GITHUB.body_limit - MARKER_ROOM

# Each test's reads per step come from an environment variable, so that one file regresses, improves and
# stays put between the baseline run and the PR run.
SUITE = """
import os
import pytest
import torch

def loop(steps, name):
    x = torch.ones(4)
    for _ in range(steps):
        x = x * 1.0
        for _ in range(int(os.environ.get(name, "1"))):
            x.sum().item()

def test_regresses(syncguard):
    with syncguard.generation(tokens=4):
        loop(4, "READS_A")

def test_improves(syncguard):
    with syncguard.generation(tokens=4):
        loop(4, "READS_B")

def test_steady(syncguard):
    with syncguard.generation(tokens=4):
        loop(4, "READS_C")

@pytest.mark.skipif(os.environ.get("WITH_OLD") != "1", reason="removed in the PR")
def test_removed(syncguard):
    with syncguard.generation(tokens=1):
        loop(1, "READS_C")

HOSTILE = ["@octocat", "<img src=x onerror=alert(1)>", "a|b", "**bold** [x](http://e.vil)", "#1 `code`"]

@pytest.mark.skipif(os.environ.get("WITH_NEW") != "1", reason="added in the PR")
@pytest.mark.parametrize("name", HOSTILE, ids=HOSTILE)
def test_new(syncguard, name):
    with syncguard.generation(tokens=1):
        loop(1, "READS_C")
"""


def run(cwd: Path, *args: str, **env: str) -> None:
    """A pytest run of the plugin in ``cwd`` (a subprocess, as CI runs it)."""
    variables = {name: "1" if name.startswith("READS") else "0" for name in ("READS_A", "READS_B", "READS_C")}
    variables.update({"WITH_OLD": "0", "WITH_NEW": "0", **env})
    warm.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--syncguard", *args], cwd=cwd,
             env={**os.environ, **variables})  # fmt: skip


@pytest.fixture(scope="module")
def pr_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Baselines from main (READS_B=2, with test_removed), then the PR's JUnit and results files, written by xdist
    workers."""
    root = tmp_path_factory.mktemp("pr")
    (root / "test_suite.py").write_text(SUITE)
    run(root, "--syncguard-update-baselines", READS_B="2", WITH_OLD="1")
    run(root, "--junitxml=pr.xml", "--syncguard-json=pr.json", "-p", "xdist", "-n", "2", READS_A="3", WITH_NEW="1")
    assert (root / "pr.xml").exists() and (root / "pr.json").exists() and (root / "baselines" / "cpu.json").exists()
    return root


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_syncguard.gate.cli", "report", *args], cwd=cwd, capture_output=True, text=True
    )


def html(markdown: str) -> str:
    """The comment as GitHub renders it: GitHub's own Markdown (cmark-gfm, its tables and tag filter), with raw
    HTML let through so that any tag a test id opened would show."""
    return cmarkgfm.github_flavored_markdown_to_html(markdown, options=cmarkgfm.cmark.Options.CMARK_OPT_UNSAFE)


def visible(markdown: str) -> list[str]:
    """The lines a reader sees before opening any collapsed section."""
    shown, depth = [], 0
    for line in markdown.splitlines():
        depth += line.startswith("<details>")
        if depth == 0:
            shown.append(line)
        depth -= line == "</details>"
    return shown


def test_the_verdict_comes_first_with_each_regressions_chain_and_the_rest_collapsed(pr_run: Path) -> None:
    done = cli(pr_run, "pr.json", "--baselines", "baselines", "--markdown", "out/comment.md", "--json", "out/r.json")
    assert done.returncode == 0, done.stderr
    text = (pr_run / "out" / "comment.md").read_text()
    lines = text.splitlines()
    assert lines[0] == "**❌ syncguard: 1 of 8 tests failed: 1 regressed against the baseline**"
    assert lines[2] == (
        "8 tests on `cpu`, judged against `cpu.json`: 1 regressed, 1 improved, 1 unchanged, 5 new, 1 missing; host "
        "timings not judged."
    )
    shown = visible(text)
    assert "### ❌ Regressions (1 test)" in shown and "- **`test_suite.py::test_regresses`** on `cpu`" in shown
    entry = shown[shown.index("- **`test_suite.py::test_regresses`** on `cpu`") :]
    assert entry[1].startswith("  - **regressed:** `ops` ")  # the reads' operators, then the syncs
    assert entry[1].endswith("; `syncs` 4 → 12 (+200.0%); `syncs_per_token` 1 → 3 (+200.0%)")
    assert entry[2].startswith("  - **what changed:** sync site grew at `test_suite.py:")
    assert "`x.sum().item()` (scalar read): 4 → 12 syncs" in entry[2]
    # Improvements, new and missing tests are counted above and listed only in the collapsed details.
    assert not any("test_improves" in line or "test_removed" in line or "test_new" in line for line in shown)
    rendered = html(text)
    assert "<code>test_suite.py::test_improves</code></td>" in rendered
    assert "<li><code>test_suite.py::test_removed</code> on <code>cpu</code></li>" in rendered
    data = json.loads((pr_run / "out" / "r.json").read_text())
    assert {t["nodeid"]: t["comparison"]["status"] for t in data["tests"]}["test_suite.py::test_steady"] == "unchanged"
    assert data["missing"] == [{"device": "cpu", "nodeid": "test_suite.py::test_removed"}]
    failing = cli(pr_run, "pr.xml", "--baselines", "baselines", "--fail-on-regression")
    assert failing.returncode == 1 and failing.stdout.startswith(
        "**❌ syncguard: 1 of 8 tests failed: 1 regressed against the baseline**"
    )


def test_the_results_file_gives_the_junit_files_verdicts_and_what_explains_them(pr_run: Path) -> None:
    """The results document (sent by the xdist workers, written by the controller) judges as the JUnit file does,
    and carries what a JUnit file does not: the sync site whose count grew."""
    from_results, from_junit = (compare_run([pr_run / name], pr_run / "baselines") for name in ("pr.json", "pr.xml"))
    verdicts = [{(c.case.nodeid, c.case.device_slug, c.comparison.status) for c in r.cases} for r in (from_results,
                from_junit)]  # fmt: skip
    assert verdicts[0] == verdicts[1] and len(verdicts[0]) == 8
    assert from_results.missing == from_junit.missing == [("cpu", "test_suite.py::test_removed")]
    (regressed,) = from_results.with_status("regression")
    lines = regressed.comparison.explanation.lines()
    assert any(line.startswith("sync site grew test_suite.py:") and "x.sum().item()" in line for line in lines)
    (without,) = from_junit.with_status("regression")
    assert not without.comparison.explanation  # a JUnit file carries no details
    done = cli(pr_run, "pr.json", "--baselines", "baselines")
    assert done.returncode == 0 and "`x.sum().item()`" in done.stdout, done.stderr


def test_without_a_baselines_folder_the_runs_own_comparison_is_reported_with_its_sites(pr_run: Path) -> None:
    """``report results.json`` without ``--baselines`` keeps what changed in the counts: the results document holds
    the sites (file, line, source text) that the run compared."""
    junit = cli(pr_run, "pr.xml", "--json", "r.json")
    assert junit.returncode == 0, junit.stderr
    assert junit.stdout.startswith("**❌ syncguard: 1 of 8 tests failed: 1 regressed against the baseline**")
    results = cli(pr_run, "pr.json")
    assert results.returncode == 0, results.stderr
    assert "**what changed:** sync site grew at `test_suite.py:" in results.stdout
    assert "`x.sum().item()`" in results.stdout


def test_hostile_test_ids_cannot_inject_markdown_html_or_mentions(pr_run: Path) -> None:
    """Test ids holding a tag, a mention, an issue reference, a link, a table's pipe and backticks, rendered by
    GitHub's Markdown: each stays text in a code span, every table keeps its columns, and nothing is backslash-
    escaped."""
    text = cli(pr_run, "pr.xml", "--baselines", "baselines", "--repository", "o/r", "--commit", "a" * 40).stdout
    rendered = html(text)
    assert "<img" not in rendered
    assert 'href="http://e.vil' not in rendered and "<strong>bold</strong>" not in rendered
    for hostile in ("@octocat", "#1 ", "**bold**", "a|b", "&lt;img src=x onerror=alert(1)&gt;"):
        at = rendered.index(hostile)
        assert rendered.rfind("<code>", 0, at) > rendered.rfind("</code>", 0, at), hostile  # inside a code span
    assert (
        "<code>test_suite.py::test_new[#1 `code`]</code>" in rendered
    )  # a backtick in an id: a longer fence, still one span
    for table in re.findall(r"<table>.*?</table>", rendered, flags=re.S):
        header = len(re.findall(r"<th[ >]", table.split("</thead>")[0]))
        for row in re.findall(r"<tr>(.*?)</tr>", table.split("</thead>")[1], flags=re.S):
            assert len(re.findall(r"<td[ >]", row)) == header, row
    assert "\\_" not in text and "\\(" not in text and "\u200b" not in text
    assert code("a\nb\x1b[31m\u202e") == "`a b [31m `"
    assert code("``x`") == "``` ``x` ```" and code("a|b", cell=True) == "`a\\|b`"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--repository", "o/r"], "--repository and --commit go together"),
        (["--repository", "o/r/x", "--commit", "a" * 40], "--repository 'o/r/x': not a GitHub repository's OWNER/NAME"),
        (["--repository", "o/r", "--commit", "HEAD"], "--commit 'HEAD': not a commit's hex id"),
    ],
)
def test_a_malformed_repository_or_commit_is_refused_not_dropped(
    pr_run: Path, options: list[str], message: str
) -> None:
    done = cli(pr_run, "pr.json", *options)
    assert done.returncode == 2 and message in done.stderr and not done.stdout


def test_files_from_several_jobs_are_merged_and_deduplicated(pr_run: Path) -> None:
    run(pr_run, "--junitxml=again.xml", "-k", "steady or improves")
    merged = compare_run([pr_run / "pr.xml", pr_run / "again.xml"], pr_run / "baselines")
    assert len(merged.cases) == 8
    assert len([c for c in merged.cases if c.case.nodeid == "test_suite.py::test_steady"]) == 1


def test_a_long_report_is_cut_to_githubs_limit_with_the_full_one_as_a_file(pr_run: Path) -> None:
    run_ = compare_run([pr_run / "pr.xml"], pr_run / "baselines")
    text, cut = render(run_, limit=1200, full_report="comment.full.md")
    assert cut and len(text) <= 1200
    assert text.startswith("**❌ syncguard: 1 of 8 tests failed: 1 regressed") and "### ❌ Regressions" in text
    assert text.rstrip().endswith("more lines left out to fit a comment. The full report is `comment.full.md`._")
    full, cut_full = render(run_)
    assert not cut_full and len(full) < COMMENT_LIMIT


MANY = """
import pytest
import torch

@pytest.mark.parametrize("case", range(700))
def test_case_with_a_long_descriptive_name_for_the_generation_strategy_under_test(syncguard, case):
    with syncguard.generation(tokens=1):
        torch.ones(1).sum().item()
"""


def test_a_change_accepted_as_intended_reports_its_regressions_and_passes(pr_run: Path) -> None:
    """``--accept WHY`` (the job sets it from the pull request's ``syncguard-accept`` label): the regression is in
    the comment, under a ⚠️ heading that says why, the headline reads ⚠️ and ``--fail-on-regression`` exits 0; the
    same run without it exits 1."""
    why = "the pull request is labelled syncguard-accept"
    options = ("--baselines", "baselines", "--fail-on-regression", "--markdown")
    refused = cli(pr_run, "pr.json", *options, "out/refused.md")
    assert refused.returncode == 1, refused.stderr
    done = cli(pr_run, "pr.json", *options, "out/accepted.md", "--accept", why)
    assert done.returncode == 0, done.stderr
    text = (pr_run / "out" / "accepted.md").read_text()
    assert text.splitlines()[0] == f"**⚠️ syncguard: 8 tests passed, 1 with regressions accepted ({why})**"
    assert f"### ⚠️ Regressions accepted as intended, {why} (1 test)" in text and "### ❌" not in text
    assert "- **`test_suite.py::test_regresses`** on `cpu`" in text
    assert done.stderr.strip().endswith(f"syncguard report: 8 tests passed, 1 with regressions accepted ({why})")


def test_cli_truncates_a_report_over_65536_characters(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_many=MANY)
    pytester.runpytest_subprocess("--syncguard", "--junitxml=many.xml", "-q")
    done = cli(pytester.path, "many.xml", "--markdown", "comment.md")
    assert done.returncode == 0, done.stderr
    comment = (pytester.path / "comment.md").read_text()
    full = (pytester.path / "comment.full.md").read_text()
    assert len(comment) <= COMMENT_LIMIT < len(full)
    assert "Report truncated" in comment and "`comment.full.md`" in comment
    assert comment.count("<details>") == comment.count("</details>")
    assert "full report in comment.full.md" in done.stderr
    # Printed (`syncguard report many.xml > out.md`), the report was cut as a comment is, and its stderr said
    # "full report in None": the full text was written nowhere. Printed, it is whole.
    printed = cli(pytester.path, "many.xml")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.strip() == full.strip() and "truncated" not in printed.stderr
    # A reader that goes away (`| head -1`) ends the command quietly, as a shell's pipeline expects.
    head = subprocess.run(f"{sys.executable} -m pytest_syncguard.gate.cli report many.xml | head -1", shell=True,
                          cwd=pytester.path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert head.stdout.count("\n") == 1 and "Traceback" not in head.stderr and "BrokenPipe" not in head.stderr


def test_bad_input_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "bad.xml").write_text("<testsuite><testcase")
    done = cli(tmp_path, "bad.xml")
    assert done.returncode == 2 and "bad.xml: not a" in done.stderr
    (tmp_path / "plain.xml").write_text('<testsuite name="x" tests="1"><testcase name="t" classname="c"/></testsuite>')
    done = cli(tmp_path, "plain.xml")
    assert done.returncode == 2 and "no measured test in plain.xml" in done.stderr


def test_report_of_a_real_h100_run(tmp_path: Path) -> None:
    """The JUnit file of the strategy suite on an H100 (tests/data/h100_suite), against the baseline it was
    compared with. That run judged host timings against a baseline from another host and failed 6 tests on them,
    every count unchanged; judged the same way the report agrees, and by default it finds no regression."""
    data = Path(__file__).parent / "data" / "h100_suite"
    junit = tmp_path / "junit-nvidia-h100-80gb-hbm3.xml"
    junit.write_bytes(gzip.decompress((data / "junit-nvidia-h100-80gb-hbm3.xml.gz").read_bytes()))
    judged = compare_run([junit], data / "baselines", host_timings=True)
    assert judged.devices == ["nvidia-h100-80gb-hbm3"] and len(judged.cases) == 17 and not judged.missing
    own = {c.case.nodeid: c.case.baseline_status for c in judged.cases}
    assert {c.case.nodeid: c.comparison.status for c in judged.cases} == own  # same verdicts as the run's
    text, _ = render(judged)
    assert text.splitlines()[0] == "**❌ syncguard: 6 of 17 tests failed: 6 regressed against the baseline**"
    assert text.splitlines()[2].startswith("17 tests on `nvidia-h100-80gb-hbm3`")
    run_ = compare_run([junit], data / "baselines")
    assert not run_.with_status("regression")
    speed = next(c for c in run_.cases if c.case.nodeid.endswith("test_speed[cuda_graph]"))
    assert speed.case.metrics["syncs"] == 1 and speed.comparison.status == "unchanged"
    # Judged again without host timings, the run's six regressions are none; the summary says the run failed them.
    lines = render(run_)[0].splitlines()
    assert lines[0] == "**✅ syncguard: no regressions: 17 tests passed**"
    assert "6 tests the run failed against its own baseline and this one finds not regressed" in lines[2]
    assert "`seconds` 0.664 s → 0.9515 s (+43.3%), judged within" in text


def test_every_case_names_its_device_slug_and_an_older_cuda_case_without_one_is_not_filed_as_cuda(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    from pytest_syncguard.judge.junit import read_cases

    # A test kept out of baselines has no comparison: its case still names the baseline file of its device.
    pytester.makepyfile(
        test_off="import pytest\n\n@pytest.mark.syncguard(baseline=False)\n@pytest.mark.max_syncs(5)\n"
        "def test_off(syncguard):\n    with syncguard.generation(tokens=1):\n        pass\n"
    )
    pytester.runpytest("--syncguard", "--junitxml=off.xml", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    (case,) = read_cases(pytester.path / "off.xml")
    assert case.baseline_status is None and case.device_slug == "cpu"
    assert '<property name="syncguard.device_slug" value="cpu"' in (pytester.path / "off.xml").read_text()
    # Files written before every case carried a slug: a CUDA case's GPU model is unknown, not "cuda".
    older = (
        '<testsuite name="s" tests="2"><testcase classname="t" name="{name}"><properties>'
        '<property name="syncguard.verdict" value="pass"/><property name="syncguard.device" value="{device}"/>'
        "</properties></testcase></testsuite>"
    )
    for device, slug in (("cuda", "unknown"), ("cpu", "cpu")):
        (tmp_path / f"{device}.xml").write_text(older.format(name=f"test_{device}", device=device))
        assert [c.device_slug for c in read_cases(tmp_path / f"{device}.xml")] == [slug]


H100_PR = Path(__file__).parent / "data" / "h100_pr"


def _h100(tmp_path: Path, name: str) -> Path:
    results = tmp_path / f"{name}.json"
    results.write_bytes(gzip.decompress((H100_PR / f"{name}.json.gz").read_bytes()))
    return results


def test_a_real_unchanged_h100_job_reads_in_a_dozen_lines(tmp_path: Path) -> None:
    """The GPU job's comment on an H100 where nothing regressed and the A/B had nothing left to judge: the verdict,
    one line of summary, the rest collapsed; no unchanged test listed where it shows."""
    from pytest_syncguard.document.ab import read_report

    run_ = compare_run([_h100(tmp_path, "unchanged")], Path(__file__).parents[1] / "baselines")
    text, _ = render(run_, ab=read_report(H100_PR / "ab-all-judged.json"))
    shown = [line for line in visible(text) if line.strip()]
    assert shown[0] == "**✅ syncguard: no regressions: 17 tests passed**"
    assert shown[1] == (
        "17 tests on `nvidia-h100-80gb-hbm3`, judged against `nvidia-h100-80gb-hbm3.json`: 17 unchanged; host timings "
        "not judged."
    )
    assert len(visible(text)) <= 12 and not any("::" in line for line in shown)
    assert "A/B on one runner: every test it selects (7) was judged against the baseline: no round run" in text
    assert "`: no round run." in text and "intervals" not in text  # no rounds: nothing said of how they would be judged
    rendered = html(text)
    assert rendered.count("<details>") == rendered.count("</details>") == 2
    assert "<td><code>examples/test_strategies.py::test_timeline[no_cache]</code></td>" in rendered


def test_a_real_planted_host_read_reads_as_its_line_the_idle_time_it_opened_and_what_it_cost(tmp_path: Path) -> None:
    """kv_cache with a host read planted after each decode step, on an H100 against the baseline: the failed budget
    first with the planted line; then each regressed test's chain: the site that appeared (a link to its line at
    the head commit), the idle time it added per token on the GPU, and the tokens per second it cost, said not
    judged (a host timing, judged A/B on one runner)."""
    run_ = compare_run([_h100(tmp_path, "planted-item")], Path(__file__).parents[1] / "baselines")
    links = SiteLinks.of(
        GITHUB.web("octo/decode"), "0123456789abcdef0123456789abcdef01234567", Path(__file__).parents[1]
    )
    text, _ = render(run_, links=links)
    shown = visible(text)
    assert shown[0] == "**❌ syncguard: 2 of 2 tests failed: 1 with failed budgets, 2 regressed against the baseline**"
    line = "[`examples/strategies.py:74`](https://github.com/octo/decode/blob/0123456789abcdef0123456789abcdef01234567/" \
        "examples/strategies.py#L74)"  # fmt: skip
    budgets = shown[shown.index("### ❌ Failed budgets (1 test)") : shown.index("### ❌ Regressions (2 tests)")]
    assert "  - **budget:** `max_syncs_per_token: limit 1.00 per token, measured 2.00: 200 syncs over 100 tokens`" in (
        budgets
    )
    assert any(f"100 syncs at {line} in `kv_cache`: `_ = int(token[0].item())" in b for b in budgets)
    timeline = shown[shown.index("- **`examples/test_strategies.py::test_timeline[kv_cache]`** on "
                                 "`nvidia-h100-80gb-hbm3`"):]  # fmt: skip
    # The speed test, first, names the site that appeared; the timeline test, regressed by the same, points to it.
    assert any(entry.startswith(f"  - **what changed:** sync site appeared at {line} in `kv_cache`") for entry in shown)
    assert timeline[2] == "  - **what changed:** the same as in `examples/test_strategies.py::test_speed[kv_cache]`"
    gpu = next(i for i, entry in enumerate(timeline) if entry.startswith("  - **on the GPU:**"))
    assert timeline[gpu] == "  - **on the GPU:** idle +1520 µs per token (3152 → 4672 µs)"
    assert "device time per token 2044 → 2045 µs (+0.0%): unchanged within 1.5%" in timeline[gpu + 3]
    cost = next(entry for entry in timeline if entry.startswith("  - **what it cost:**"))
    assert (
        cost
        == "  - **what it cost:** tokens/s not judged: a host timing, judged A/B on one runner (`syncguard ab`); this run "
        "alone resolves no cost"
    )
    assert f'<a href="https://github.com/octo/decode/blob/{"0123456789abcdef" * 2}01234567/examples/strategies.py#L74">' \
        in html(text)  # fmt: skip
    unlinked, _ = render(run_, links=SiteLinks.of(GITHUB.web("octo/decode"), "not-a-commit", Path(__file__).parents[1]))
    assert "](https://" not in unlinked and "`examples/strategies.py:74`" in unlinked


def test_a_real_ab_puts_its_regression_in_view_and_counts_the_rest(tmp_path: Path) -> None:
    from pytest_syncguard.document.ab import read_report

    run_ = compare_run([_h100(tmp_path, "unchanged")], Path(__file__).parents[1] / "baselines")
    text, _ = render(run_, ab=read_report(H100_PR / "ab-planted-cuda-graph.json"))
    shown = visible(text)
    assert "### ❌ A/B on one runner: 1 regression in 7 tests" in shown
    row = "| `examples/test_strategies.py::test_speed[cuda_graph]` | `gpu_us_per_token` | x1.029 [1.019, 1.032] |"
    assert any(line.startswith(row) for line in shown)
    assert any(line.startswith("6 tests unchanged: ") for line in shown)


def test_tests_that_share_one_cause_say_it_once_and_their_ab_is_in_their_entries(tmp_path: Path) -> None:
    """The H100 job's planted host read regressed two tests of one loop: the second entry points to the first for what
    changed. The A/B's finding of a regressed test is a line of its entry, and the A/B's table leaves it out."""
    from pytest_syncguard.document.ab import CountChange, HeadAgainstBase, read_report

    run_ = compare_run([_h100(tmp_path, "planted-item")], Path(__file__).parents[1] / "baselines")
    planted = read_report(H100_PR / "ab-planted-cuda-graph.json")
    speed, timeline = (
        "examples/test_strategies.py::test_speed[kv_cache]",
        "examples/test_strategies.py::test_timeline[kv_cache]",
    )
    found = HeadAgainstBase(speed, (CountChange("syncs", 0, 100, "regression"),), {})
    text, _ = render(run_, ab=replace(planted, tests=(found, *(t for t in planted.tests if t.nodeid != speed))))
    shown = visible(text)
    changed = [line for line in shown if line.startswith("  - **what changed:**")]
    assert changed[0].startswith("  - **what changed:** sync site appeared at `examples/strategies.py:74`")
    assert f"  - **what changed:** the same as in `{speed}`" in changed[1:]
    assert sum("examples/strategies.py:74" in line for line in changed) == 1
    assert "  - **in the A/B:** regression on this runner, head against base: `counts syncs 0 → 100`" in shown
    assert f'In the entries above ("in the A/B"): `{speed}`' in shown
    assert not [line for line in shown if line.startswith(f"| `{speed}` |")]  # not a third time in the table
    assert any(line.startswith("| `examples/test_strategies.py::test_speed[cuda_graph]`") for line in shown)
    assert timeline in text


def test_a_failing_tests_terminal_text_carries_the_same_chain(tmp_path: Path) -> None:
    """What a failing test prints in pytest's report: after what regressed and what changed, the GPU and cost links
    the PR comment shows."""
    from pytest_syncguard.document import file as results_file
    from pytest_syncguard.render.terminal import failure_text

    tests = {t.nodeid.split("::")[1]: t for t in results_file.read(_h100(tmp_path, "planted-item"))}
    text = failure_text(tests["test_timeline[kv_cache]"]).splitlines()
    changed = text.index(
        next(line for line in text if line.startswith("  sync site appeared examples/strategies.py:74"))
    )
    assert text[changed + 6 : changed + 11] == [
        "syncguard: on the GPU: idle +1520 µs per token (3152 → 4672 µs)",
        text[changed + 7],  # the widest gap and its cause, as the run found it
        "  busy fraction 0.393 → 0.304 (not judged: a host timing, judged A/B on one runner)",
        "  device time per token 2044 → 2045 µs (+0.0%): unchanged within 1.5%",
        "syncguard: what it cost: tokens/s not judged: a host timing, judged A/B on one runner (`syncguard ab`); this "
        "run alone resolves no cost",
    ]
    assert text[changed + 7].startswith("  widest gap 426 µs: host sync scalar read at ")


def test_the_gpu_link_shares_the_idle_time_out_by_cause(tmp_path: Path) -> None:
    """Every gap of the timed run the results keep, by cause: after a counted sync returned (the planted read), or
    not; the shares add up to the whole."""
    run_ = compare_run([_h100(tmp_path, "planted-item-timeline")], Path(__file__).parents[1] / "baselines")
    text, _ = render(run_)
    (line,) = [entry for entry in text.splitlines() if entry.startswith("    - idle now by cause: ")]
    shares = [int(share) for share in re.findall(r"(\d+)%", line)]
    assert line.startswith("    - idle now by cause: host sync ") and ", other " in line
    assert len(shares) == 2 and 99 <= sum(shares) <= 101 and shares[0] > 0


def test_the_headline_the_exit_status_and_every_count_are_one_verdict_with_the_ab(tmp_path: Path) -> None:
    """The H200 PR job's contradiction: a suite that regressed nowhere against its baseline, and an A/B whose head
    regressed. The headline, the command's last line and its exit status say the A/B's regression, and the A/B
    table's count rows show their verdict in the verdict column (4 cells under 4 headers)."""
    from pytest_syncguard.document.ab import CountChange, document, read_report

    results = _h100(tmp_path, "unchanged")
    planted = read_report(H100_PR / "ab-planted-cuda-graph.json")  # as the H200 job found it: the kernel counted too
    counted = replace(planted.tests[0], counts=(CountChange("launches", 627, 726, "regression"),))
    ab = tmp_path / "ab.json"
    ab.write_text(json.dumps(document(replace(planted, tests=(counted, *planted.tests[1:])))))
    done = cli(tmp_path, str(results), "--baselines", str(Path(__file__).parents[1] / "baselines"), "--ab", str(ab),
               "--markdown", "comment.md", "--fail-on-regression")  # fmt: skip
    text = (tmp_path / "comment.md").read_text()
    sentence = "1 of 17 tests failed: 1 regressed in the A/B"
    assert text.splitlines()[0] == f"**❌ syncguard: {sentence}**"
    assert done.returncode == 1 and done.stderr == f"syncguard report: {sentence}\n"
    assert "### ❌ A/B on one runner: 1 regression in 7 tests" in text
    rows = [r for r in re.findall(r"<tr>(.*?)</tr>", html(text), flags=re.S) if "<code>launches</code>" in r]
    assert rows and all(re.findall(r"<td>(.*?)</td>", r, flags=re.S)[-1] == "regression" for r in rows), rows
    assert all("627 → 726 (exact)" in r for r in rows)
    # The same change accepted as intended: said, marked ⚠️ in the headline and the A/B's title, and exit 0.
    why = "the pull request is labelled syncguard-accept"
    accepted = cli(tmp_path, str(results), "--baselines", str(Path(__file__).parents[1] / "baselines"), "--ab",
                   str(ab), "--markdown", "accepted.md", "--fail-on-regression", "--accept", why)  # fmt: skip
    text = (tmp_path / "accepted.md").read_text()
    assert (
        accepted.returncode == 0
        and text.splitlines()[0] == f"**⚠️ syncguard: 17 tests passed, 1 with regressions accepted ({why})**"
    )
    assert "### ⚠️ A/B on one runner: 1 regression in 7 tests" in text and "❌" not in text


def test_a_failure_in_any_document_stays_whatever_their_order(tmp_path: Path) -> None:
    """Two ranks' documents of one test: rank 0's failed its budget, rank 1's passed. Either order, the report keeps
    the failure."""
    from pytest_syncguard.document import file as results_file

    tests = {t.nodeid: t for t in results_file.read(_h100(tmp_path, "planted-item"))}
    failed = next(t for t in tests.values() if any(c.held is False for c in t.checks))
    passed = replace(failed, checks=tuple(replace(c, held=True) for c in failed.checks), comparison=None)
    for name, test in (("rank0.json", failed), ("rank1.json", passed)):
        document = {"schema": results_file.SCHEMA, "schema_version": results_file.SCHEMA_VERSION,
                    "tests": [results_file.record(test)]}  # fmt: skip
        (tmp_path / name).write_text(json.dumps(document))
    for order in (("rank0.json", "rank1.json"), ("rank1.json", "rank0.json")):
        done = cli(tmp_path, *order, "--fail-on-regression")
        assert done.returncode == 1 and "1 of 1 test failed: 1 with failed budgets" in done.stderr, (order, done.stderr)


def test_a_real_widest_gap_names_its_site_relative_to_the_checkout(tmp_path: Path) -> None:
    """The H200 run of the planted host read: the widest gap's cause names `examples/strategies.py:75`, not the
    checkout's absolute path."""
    results = tmp_path / "planted.json"
    results.write_bytes(
        gzip.decompress((Path(__file__).parent / "data" / "h200_pr" / "planted-item.json.gz").read_bytes())
    )
    from pytest_syncguard.document import file as results_file

    tests = {t.nodeid: t for t in results_file.read(results)}
    timeline = tests["examples/test_strategies.py::test_timeline[kv_cache]"].timeline
    assert timeline is not None
    assert timeline.top_gaps[0].detail.startswith("scalar read at examples/strategies.py:75 in kv_cache; ")


def test_a_tests_results_file_case_is_kept_over_its_junit_case_whatever_their_order(pytester: pytest.Pytester) -> None:
    """One run's results file and JUnit file name the same passed test: the case kept is the results file's, which
    carries the details that explain a change, in either order of the files."""
    from pytest_syncguard.judge.run import merge_cases

    pytester.makepyfile(
        test_one="""
import pytest
import torch

@pytest.mark.max_syncs_per_token(1)
def test_loop(syncguard):
    with syncguard.generation(tokens=2):
        for _ in range(2):
            torch.ones(2).sum().item()
"""
    )
    done = pytester.runpytest_subprocess("--syncguard", "--syncguard-json", "r.json", "--junitxml", "j.xml")
    assert done.ret == 0, done.stdout.str()
    results, junit = pytester.path / "r.json", pytester.path / "j.xml"
    for order in ([results, junit], [junit, results]):
        (case,) = merge_cases(order)
        assert case.details is not None and case.sites, order
