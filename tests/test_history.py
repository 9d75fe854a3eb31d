"""The default branch's history as the baseline: runs recorded compactly and read back, a pull request judged
against its GPU model's recent runs (a level that a change merged on purpose starts again), the data branch written
by two pushes at once, and the pictures: a chart in the comment, a page with a point per commit.

The runs are the H100 suite's real results (tests/data/h100_pr/unchanged.json.gz), their device time moved by the
spread recorded between H100 hosts; the branch is pushed to a real bare repository."""

from __future__ import annotations

import gzip
import itertools
import random
import shutil
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import cmarkgfm
import pytest

from pytest_syncguard.document import file as results_file
from pytest_syncguard.document.measured import MeasuredTest
from pytest_syncguard.gate import history_branch
from pytest_syncguard.gate.forge.github import GITHUB
from pytest_syncguard.judge import history
from pytest_syncguard.judge.run import compare_run
from pytest_syncguard.metrics import DEVICE_TIME, Metrics
from pytest_syncguard.render.markdown import render
from pytest_syncguard.render.page import model_page

DATA = Path(__file__).parent / "data" / "h100_pr"
GRAPH = "examples/test_strategies.py::test_speed[cuda_graph]"
HOSTS = ["a9dc0a68", "c3cd64c4", "56c4121f", "8423f385"]


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> list[MeasuredTest]:
    path = tmp_path_factory.mktemp("suite") / "unchanged.json"
    path.write_bytes(gzip.decompress((DATA / "unchanged.json.gz").read_bytes()))
    return results_file.read(path)


def moved(tests: list[MeasuredTest], factor: float, rng: random.Random, host: str, noise: float = 0.003,
          ) -> list[MeasuredTest]:  # fmt: skip
    """The suite's results with every device time scaled by ``factor`` and a host's noise, as run on ``host``."""
    out = []
    for test in tests:
        values = dict(test.metrics.values)
        if DEVICE_TIME in values:
            values[DEVICE_TIME] *= factor * (1 + rng.gauss(0, noise))
        out.append(replace(test, metrics=Metrics(values, dict(test.metrics.runs)), host=host))
    return out


def pushes(folder: Path, tests: list[MeasuredTest], count: int, rng: random.Random, step_at: int | None = None,
           noise: float = 0.003) -> None:  # fmt: skip
    for push in range(1, count + 1):
        factor = 1.03 if step_at is not None and push >= step_at else 1.0
        ran = moved(tests, factor, rng, HOSTS[push % len(HOSTS)], noise)
        history.record(folder, ran, f"{push:040x}", f"t{push}")


def write(path: Path, tests: list[MeasuredTest]) -> Path:
    import json

    document = {"schema": results_file.SCHEMA, "schema_version": results_file.SCHEMA_VERSION,
                "tests": [results_file.record(t) for t in tests]}  # fmt: skip
    path.write_text(json.dumps(document))
    return path


def test_runs_are_kept_compact_and_read_back_whole(tmp_path: Path, suite: list[MeasuredTest]) -> None:
    pushes(tmp_path, suite, 3, random.Random(1))
    lines = (tmp_path / "nvidia-h100-80gb-hbm3.jsonl").read_text().splitlines()
    assert len(lines) == 4 and '"syncs"' in lines[1] and '"syncs"' not in lines[2]  # counts once, until they move
    assert '"seconds"' not in lines[1]  # host timings are judged A/B, not kept
    found = history.read(tmp_path, "nvidia-h100-80gb-hbm3")
    assert found is not None and len(found.runs) == 3
    graph = next(t for t in suite if t.nodeid == GRAPH)
    assert found.runs[2].tests[GRAPH]["syncs"] == graph.metrics.values["syncs"]
    assert {r.host for r in found.runs} == {HOSTS[1], HOSTS[2], HOSTS[3]}
    assert all(len(line) < 2500 for line in lines[2:])  # 17 tests: a year of daily runs stays under a megabyte


def test_a_pr_is_judged_against_the_recent_runs_and_the_tolerance_narrows(
    tmp_path: Path, suite: list[MeasuredTest]
) -> None:
    rng = random.Random(2)
    pushes(tmp_path, suite, 3, rng)
    early = history.baseline(history.read(tmp_path, "nvidia-h100-80gb-hbm3"))  # type: ignore[arg-type]
    pushes(tmp_path / "more", suite, 12, rng, noise=0.002)  # the H100s' spread within a host: ±0.14-0.32%
    late = history.baseline(history.read(tmp_path / "more", "nvidia-h100-80gb-hbm3"))  # type: ignore[arg-type]
    from pytest_syncguard.judge.comparison import tolerance_of

    within = [tolerance_of(DEVICE_TIME, None, b.reference(GRAPH, HOSTS[0])[1][DEVICE_TIME]) for b in (early, late)]
    assert within[1] < within[0] and within[1] < 0.015, within  # 12 runs on 4 hosts: below the 1.5% floor
    planted = write(tmp_path / "pr.json", moved(suite, 1.02, rng, HOSTS[0], noise=0.0))
    unchanged = write(tmp_path / "same.json", moved(suite, 1.0, rng, HOSTS[0], noise=0.0))
    regressed = compare_run([planted], None, history=tmp_path / "more")
    assert {c.case.nodeid for c in regressed.with_status("regression")} >= {GRAPH}
    held = compare_run([unchanged], None, history=tmp_path / "more")
    assert not held.with_status("regression")
    text, _ = render(regressed)
    assert "judged against the default branch's history: 12 runs of nvidia-h100-80gb-hbm3 on 4 hosts" in text
    assert "#### Trend" in text and "```mermaid\n%%{init: " in text and "%%\nxychart-beta" in text
    html = cmarkgfm.github_flavored_markdown_to_html(text, options=cmarkgfm.cmark.Options.CMARK_OPT_UNSAFE)
    assert '<pre lang="mermaid"><code>%%{init: ' in html  # GitHub draws this block as a chart
    chart = text.split("```mermaid")[1].split("```")[0]
    assert chart.count('"') >= 2 * 13 and '"this run"' in chart  # 12 commits and this run


def test_a_change_merged_on_purpose_starts_a_new_level(tmp_path: Path, suite: list[MeasuredTest]) -> None:
    """+3% merged at push 8 of 14: the level after it is the new one, so an unchanged PR is unchanged; before the
    merge, the change's own PR was a regression."""
    rng = random.Random(3)
    pushes(tmp_path / "before", suite, 7, rng)
    own = write(tmp_path / "own.json", moved(suite, 1.03, rng, HOSTS[0], noise=0.0))
    assert GRAPH in {
        c.case.nodeid for c in compare_run([own], None, history=tmp_path / "before").with_status("regression")
    }
    pushes(tmp_path / "after", suite, 14, random.Random(3), step_at=8)
    found = history.read(tmp_path / "after", "nvidia-h100-80gb-hbm3")
    assert found is not None
    assert "judged from run 8" in history.describe(found, GRAPH)
    after = write(tmp_path / "after.json", moved(suite, 1.03, rng, HOSTS[0], noise=0.0))
    assert not compare_run([after], None, history=tmp_path / "after").with_status("regression")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _clone(remote: Path, into: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(remote), str(into)], check=True, capture_output=True)
    return into


def test_the_history_branch_takes_two_pushes_at_once_and_a_first_gpu_model(
    tmp_path: Path, suite: list[MeasuredTest], bare_remote: Path
) -> None:
    """A bare repository as the remote, two clones as two runners pushing at the same moment: both runs land (the
    rejected one again on the new tip); the branch is made the first time; a PR job fetches it and is judged."""
    remote = bare_remote
    runners = [_clone(remote, tmp_path / f"runner{i}") for i in range(2)]
    rng = random.Random(4)
    history_branch.push(runners[0], moved(suite, 1.0, rng, HOSTS[0]), "a" * 40, say=lambda line: None)
    said: list[str] = []
    barrier = threading.Barrier(2)

    def push(index: int) -> None:
        barrier.wait()
        history_branch.push(runners[index], moved(suite, 1.0, random.Random(index), HOSTS[index + 1]),
                            f"{index + 1}" * 40, say=said.append)  # fmt: skip

    threads = [threading.Thread(target=push, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    log = _git(remote, "log", "--format=%s", history_branch.BRANCH).splitlines()
    assert len(log) == 3 and all(line.startswith("syncguard history: ") for line in log), log
    assert _git(remote, "ls-tree", "--name-only", history_branch.BRANCH).split() == [
        "nvidia-h100-80gb-hbm3.details.json", "nvidia-h100-80gb-hbm3.jsonl", "nvidia-h100-80gb-hbm3.latest.json"]  # fmt: skip
    assert _git(remote, "rev-parse", "main").strip() == _git(tmp_path / "seed", "rev-parse", "HEAD").strip()
    pr = _clone(remote, tmp_path / "pr")
    assert history_branch.fetch(pr, pr / "history")
    found = history.read(pr / "history", "nvidia-h100-80gb-hbm3")
    assert found is not None and found.runs[0].commit == "a" * 40 and len(found.runs) == 3
    assert not (pr / "history").joinpath("README.md").exists()
    fresh = _clone(remote, tmp_path / "fresh")
    _git(fresh, "push", "-q", "origin", f":{history_branch.BRANCH}")
    assert not history_branch.fetch(fresh, fresh / "none")  # no branch yet: judged as a GPU model seen first


def test_the_cli_records_fetches_and_writes_baselines_and_a_page(tmp_path: Path, suite: list[MeasuredTest]) -> None:
    results = write(tmp_path / "run.json", moved(suite, 1.0, random.Random(5), HOSTS[0]))
    cli = [sys.executable, "-m", "pytest_syncguard.gate.cli", "history"]
    for commit in ("1" * 40, "2" * 40):
        done = subprocess.run([*cli, "record", str(results), "--commit", commit, "--into", "h"], cwd=tmp_path,
                              capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert done.stdout == "syncguard history: nvidia-h100-80gb-hbm3: 2 runs\n"
    done = subprocess.run([*cli, "baselines", "h", "--out", "b"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    from pytest_syncguard.judge.baselines import read

    written = read(tmp_path / "b" / "nvidia-h100-80gb-hbm3.json")
    assert written is not None and GRAPH in written.tests and len(written.history[GRAPH][DEVICE_TIME]) == 2
    done = subprocess.run([*cli, "page", "h", "--out", "page.html", "--repository", "octo/decode"], cwd=tmp_path,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("syncguard history: page.html: 1 GPU model (page.nvidia-h100-80gb-hbm3.html 0.")
    assert '<a href="page.nvidia-h100-80gb-hbm3.html">nvidia-h100-80gb-hbm3</a>' in (tmp_path / "page.html").read_text()
    text = (tmp_path / "page.nvidia-h100-80gb-hbm3.html").read_text()
    assert '"commit_url":"https://github.com/octo/decode/commit/"' in text and f'["{"1" * 12}",' in text
    assert '<a href="page.html">all GPU models</a>' in text


def test_the_page_escapes_what_the_history_says_and_chromium_draws_it(
    tmp_path: Path, suite: list[MeasuredTest]
) -> None:
    hostile = [replace(t, nodeid=t.nodeid + "<img src=x onerror=alert(1)>") for t in suite]
    history.record(tmp_path, moved(hostile, 1.0, random.Random(6), HOSTS[0]), "3" * 40, "t")
    history.record(tmp_path, moved(hostile, 1.0, random.Random(7), HOSTS[1]), "4" * 40, "t")
    found = history.read(tmp_path, "nvidia-h100-80gb-hbm3")
    assert found is not None
    text = model_page(found, GITHUB.web("octo/decode"))
    assert "<img" not in text and "\\u003cimg src=x onerror=alert(1)>" in text  # JSON the script sets as text
    (tmp_path / "page.html").write_text(text)
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no headless Chromium here (.ci/run installs it)")
    shot = tmp_path / "page.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1200,900", (tmp_path / "page.html").as_uri()], capture_output=True, timeout=120,
                   check=False)  # fmt: skip
    assert shot.exists() and shot.stat().st_size > 10_000  # a page with its charts, not a blank one
    # The charts on the first screen are drawn by the vendored uPlot, its scripts run without an error.
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,900",
                          "--virtual-time-budget=3000", "--dump-dom", (tmp_path / "page.html").as_uri()],
                         capture_output=True, text=True, timeout=120, check=False).stdout  # fmt: skip
    assert dom.count('class="uplot') >= 1, dom[-2000:]


def test_a_run_is_judged_against_its_own_hosts_runs_where_the_history_allows(
    tmp_path: Path, suite: list[MeasuredTest]
) -> None:
    """GPUs of one model differ steadily (two H100s 1.1% apart in cuda_graph, each within ±0.2%): with 12 runs on 3
    hosts 1% apart, a PR is judged against its host's mean within the spread inside hosts, so +1.5% on the fast host
    is a regression that the median of all hosts would have hidden; a host the history never saw is judged across
    hosts, within the spread of their means."""
    import statistics

    rng = random.Random(5)
    offsets = {"a9dc0a68": 0.99, "c3cd64c4": 1.0, "56c4121f": 1.01}
    for push in range(12):
        host = list(offsets)[push % 3]
        history.record(tmp_path, moved(suite, offsets[host], rng, host, noise=0.001), f"{push:040x}", f"t{push}")
    found = history.read(tmp_path, "nvidia-h100-80gb-hbm3")
    assert found is not None
    level = history.baseline(found)
    entry, spreads = level.reference(GRAPH, "a9dc0a68")
    assert entry is not None
    spread = spreads[DEVICE_TIME]
    by_host: dict[str, list[float]] = {}
    for run, value in found.series(GRAPH, DEVICE_TIME):
        by_host.setdefault(run.host, []).append(value)
    # The spread within hosts: each host's successive runs' differences (a creep adds its step, not its run).
    squares = sum((b - a) ** 2 for vs in by_host.values() for a, b in itertools.pairwise(vs)) / 2
    middle = statistics.median(v for vs in by_host.values() for v in vs)
    assert spread.on_host == 4 and spread.relative_sd == pytest.approx((squares / 9) ** 0.5 / middle, rel=1e-9)
    assert entry[DEVICE_TIME] == pytest.approx(statistics.fmean(by_host["a9dc0a68"]), abs=0.01)  # rounded
    assert "within 3 hosts over 12 recordings, 4 on this host" in spread.describe()

    fast = write(tmp_path / "fast.json", moved(suite, 0.99 * 1.015, rng, "a9dc0a68", noise=0.0))
    judged = compare_run([fast], None, history=tmp_path)
    assert GRAPH in {c.case.nodeid for c in judged.with_status("regression")}
    anywhere = write(tmp_path / "anywhere.json", moved(suite, 0.99 * 1.015, rng, "", noise=0.0))
    assert GRAPH not in {c.case.nodeid for c in compare_run([anywhere], None, history=tmp_path).with_status(
        "regression")}  # fmt: skip
    same = write(tmp_path / "same.json", moved(suite, 1.01, rng, "56c4121f", noise=0.0))
    assert not compare_run([same], None, history=tmp_path).with_status("regression")

    _, unseen = level.reference(GRAPH, "ffffffff")
    from pytest_syncguard.judge.comparison import tolerance_of

    assert unseen[DEVICE_TIME].new_host and "none on this host" in unseen[DEVICE_TIME].describe()
    assert tolerance_of(DEVICE_TIME, None, unseen[DEVICE_TIME]) > tolerance_of(DEVICE_TIME, None, spread)


def test_the_trend_charts_what_moved_most_a_sync_from_none_before_operators(
    tmp_path: Path, suite: list[MeasuredTest]
) -> None:
    """A host read planted in a loop: its syncs 0 -> 15 and its operators +2% both regress; the chart is of the
    syncs, what broke, not of the operators."""
    rng = random.Random(4)
    pushes(tmp_path, suite, 3, rng)
    target = next(t for t in suite if t.metrics.values.get("syncs") == 0 and "ops" in t.metrics.values)
    values = {**target.metrics.values, "syncs": 15.0, "ops": target.metrics.values["ops"] * 1.02}
    values.pop(DEVICE_TIME, None)
    planted = [replace(t, metrics=Metrics(values, dict(t.metrics.runs))) if t.nodeid == target.nodeid else t
               for t in moved(suite, 1.0, rng, HOSTS[0], noise=0.0)]  # fmt: skip
    run = compare_run([write(tmp_path / "pr.json", planted)], None, history=tmp_path)
    (regressed,) = [c for c in run.with_status("regression") if c.case.nodeid == target.nodeid]
    assert {c.metric for c in regressed.comparison.of("regression")} >= {"syncs", "ops"}
    text, _ = render(run)
    assert f"`{target.nodeid}`: `syncs` over the default branch's last runs" in text


def test_the_page_counts_its_runs_and_hosts_in_words(suite: list[MeasuredTest]) -> None:
    runs = tuple(history.run_of(suite, f"{n:040x}", f"t{n}") for n in range(4))
    runs = tuple(replace(r, host=HOSTS[0]) for r in runs)
    text = model_page(history.History("nvidia-h100-80gb-hbm3", runs))
    assert "<p>4 runs on 1 host, t0 to t3. Each chart" in text
