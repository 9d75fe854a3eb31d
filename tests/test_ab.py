"""The regression gate: the A/B statistics against brute force and simulation, count explanations (sync sites,
movers) through baselines, and ``syncguard ab`` end to end on a real git repository."""

from __future__ import annotations

import gzip
import itertools
import json
import math
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import suppress
from pathlib import Path

import pytest

from pytest_syncguard.analysis.explain import Details, SiteCount, explain, site_changes
from pytest_syncguard.document.ab import IMPROVEMENT, INCONCLUSIVE, REGRESSION, UNCHANGED, read_report
from pytest_syncguard.files import IGNORE_ALL
from pytest_syncguard.gate.ab.plan import (
    Plan,
    base_runs_first,
    baselines_changed,
    judged_by_baseline,
    pair_of_round,
    run,
)
from pytest_syncguard.gate.ab.sides import read_results
from pytest_syncguard.gate.ab.stats import _signed_rank_counts, interval, judge, rounds_needed, t_quantile
from pytest_syncguard.judge.baselines import BaselineStore, read, update
from pytest_syncguard.metrics import Metrics
from pytest_syncguard.render.ab import summary_lines, verdict_note
from pytest_syncguard.signals import EXPLAIN

#: The A/Bs and sides these tests start are forked from the suite's warm server (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("warm_executable")


def test_the_signed_rank_distribution_is_the_enumeration_of_sign_patterns() -> None:
    for n in range(1, 9):
        counted = [0] * (n * (n + 1) // 2 + 1)
        for signs in itertools.product((0, 1), repeat=n):
            counted[sum(rank for rank, positive in zip(range(1, n + 1), signs, strict=True) if positive)] += 1
        assert list(_signed_rank_counts(n)) == counted


def _accepted(differences: list[float], shift: float, confidence: float) -> bool:
    """Brute force: the two-sided exact signed-rank test of median ``shift`` does not reject."""
    moved = [d - shift for d in differences]
    ranked = sorted(range(len(moved)), key=lambda i: abs(moved[i]))
    w_plus = sum(rank + 1 for rank, i in enumerate(ranked) if moved[i] > 0)
    counts = _signed_rank_counts(len(moved))
    low_tail = sum(counts[: w_plus + 1]) / 2 ** len(moved)
    high_tail = sum(counts[w_plus:]) / 2 ** len(moved)
    return bool(2 * min(low_tail, high_tail) > 1 - confidence)


def test_the_interval_is_the_set_of_shifts_the_signed_rank_test_accepts() -> None:
    generator = random.Random(7)
    for n, confidence in ((6, 0.95), (8, 0.95), (10, 0.9), (5, 0.9)):
        differences = [generator.gauss(0.05, 0.03) for _ in range(n)]
        found = interval(differences, confidence)
        assert found is not None and found.confidence >= confidence
        grid = [found.low + (found.high - found.low) * k / 50 for k in range(1, 50)]
        assert all(_accepted(differences, shift, confidence) for shift in grid)
        assert not _accepted(differences, found.low - 1e-9, confidence)
        assert not _accepted(differences, found.high + 1e-9, confidence)
    assert rounds_needed(0.95) == 6 and rounds_needed(0.9) == 5
    assert interval([0.1] * 5, 0.95) is None  # 5 rounds cannot give 95%
    assert interval([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], 0.95).low == pytest.approx(0.1)  # type: ignore[union-attr]


def test_verdicts_against_the_minimum_effect_in_simulation() -> None:
    """Six rounds at 95%: no change with 5% noise is almost never called a regression (the whole interval must
    lie beyond +3%); a 20% slowdown with 3% noise almost always is."""
    generator = random.Random(11)

    def verdicts(effect: float, noise: float, trials: int = 400) -> dict[str, int]:
        found: dict[str, int] = {}
        for _ in range(trials):
            pairs = [(1.0, (1 + effect) * math.exp(generator.gauss(0, noise))) for _ in range(6)]
            verdict = judge(pairs, higher_is_better=False, min_effect=0.03, confidence=0.95).verdict
            found[verdict] = found.get(verdict, 0) + 1
        return found

    null = verdicts(0.0, 0.05)
    assert null.get(REGRESSION, 0) + null.get(IMPROVEMENT, 0) <= 4
    slower = verdicts(0.20, 0.03)
    assert slower.get(REGRESSION, 0) >= 390
    steady = verdicts(0.0, 0.002)
    assert steady.get(UNCHANGED, 0) >= 390
    faster = judge([(1.0, 2.0)] * 6, higher_is_better=True, min_effect=0.03, confidence=0.95)
    assert faster.verdict == IMPROVEMENT and faster.ratio == pytest.approx(2.0)
    few = judge([(1.0, 2.0)] * 5, higher_is_better=False, min_effect=0.03, confidence=0.95)
    assert few.verdict == INCONCLUSIVE and "run 6 or more" in few.reason


def test_early_verdicts_take_students_t_from_three_rounds_and_cry_no_wolf_in_simulation() -> None:
    """Below the 6 rounds of a 95% signed-rank interval, ``early`` judges by Student's t over the rounds' log
    ratios (its quantiles those of the tables); with device time's 1% minimum effect, 3 to 5 rounds of an unchanged
    test whose runs spread 0.3% (more than any measured on an H100) and whose two processes sit up to 0.4% apart are
    never a regression, and a 2% slowdown is one in most trials (the others inconclusive: more rounds follow)."""
    assert [round(t_quantile(0.975, df), 3) for df in (2, 3, 4, 9)] == [4.303, 3.182, 2.776, 2.262]
    generator = random.Random(5)

    def verdicts(effect: float, rounds: int, trials: int = 300) -> dict[str, int]:
        found: dict[str, int] = {}
        for _ in range(trials):
            offset = generator.uniform(-0.004, 0.004)
            pairs = [(1.0, (1 + effect + offset) * math.exp(generator.gauss(0, 0.003))) for _ in range(rounds)]
            verdict = judge(pairs, higher_is_better=False, min_effect=0.01, confidence=0.95, early=True)
            assert verdict.method == ("t" if rounds < 6 else "")
            found[verdict.verdict] = found.get(verdict.verdict, 0) + 1
        return found

    for rounds in (3, 4, 5):
        assert REGRESSION not in verdicts(0.0, rounds)
        assert verdicts(0.02, rounds).get(REGRESSION, 0) >= (200 if rounds == 3 else 270)  # else: inconclusive
    two = judge([(1.0, 1.0)] * 2, higher_is_better=False, min_effect=0.01, confidence=0.95, early=True)
    assert two.verdict == INCONCLUSIVE and "run 3 or more" in two.reason  # fewer than 3: no interval


def _offset_trials(effect: float, rounds: int, processes: int, trials: int, seed: int) -> dict[str, int]:
    """Verdicts of ``trials`` simulated held A/Bs: each process off by its own N(0, 0.5%) (two warm processes of
    one code ran a test 1.1% apart on an H100), each run by N(0, 0.3%), the pairs taking the rounds in turn."""
    generator = random.Random(seed)
    found: dict[str, int] = {}
    for _ in range(trials):
        offsets = {(side, pair): generator.gauss(0, 0.005) for side in "bh" for pair in range(1, processes + 1)}
        blocks = [pair_of_round(number, processes) for number in range(1, rounds + 1)]
        pairs = [(math.exp(offsets["b", p] + generator.gauss(0, 0.003)),
                  (1 + effect) * math.exp(offsets["h", p] + generator.gauss(0, 0.003))) for p in blocks]  # fmt: skip
        verdict = judge(pairs, higher_is_better=False, min_effect=0.01, confidence=0.95, early=True, blocks=blocks,
                        processes=processes).verdict  # fmt: skip
        found[verdict] = found.get(verdict, 0) + 1
    return found


def test_two_pairs_of_processes_call_a_change_only_where_both_do_and_a_process_offset_cries_no_wolf() -> None:
    """A process's own offset is no change: one pair's rounds, however tight, cannot tell it from one (a 0.5%
    offset per process calls an unchanged test changed in 2-4% of simulated A/Bs); with two pairs taking the rounds
    in turn, each pair has its interval and the metric's is their hull, so an offset must fool both. A real +3%
    is still called."""
    assert [pair_of_round(n, 2) for n in range(1, 8)] == [1, 1, 2, 1, 2, 1, 2]
    assert [base_runs_first(n, 2) for n in range(2, 8)] == [True, True, False, False, True, True]
    assert [base_runs_first(n, 1) for n in range(2, 6)] == [True, False, True, False]  # one pair: as before
    one = _offset_trials(0.0, 8, 1, 1000, seed=3)
    assert one.get(REGRESSION, 0) + one.get(IMPROVEMENT, 0) >= 40
    two = _offset_trials(0.0, 8, 2, 1000, seed=3)
    assert two.get(REGRESSION, 0) + two.get(IMPROVEMENT, 0) <= 3
    assert _offset_trials(0.03, 8, 2, 300, seed=4).get(REGRESSION, 0) >= 270
    # One pair off, the other not: the hull holds both, so nothing is called.
    blocks = [1, 1, 2, 1, 2, 1]
    split = [(1.0, 1.015 if b == 1 else 1.002) for b in blocks]
    split = [(b, h * (1 + 0.0005 * (i % 2))) for i, (b, h) in enumerate(split)]
    apart = judge(split, higher_is_better=False, min_effect=0.01, confidence=0.95, early=True, blocks=blocks,
                  processes=2)  # fmt: skip
    assert apart.verdict == INCONCLUSIVE and apart.pairs == pytest.approx((1.0152, 1.0022), abs=5e-4)
    both = judge([(1.0, 1.02 + 0.0005 * (i % 2)) for i in range(6)], higher_is_better=False, min_effect=0.01,
                 confidence=0.95, early=True, blocks=blocks, processes=2)  # fmt: skip
    assert both.verdict == REGRESSION and both.method == "t" and len(both.pairs) == 2
    # Each pair needs a round, and the pairs 2 degrees of freedom within them.
    few = judge([(1.0, 1.02)] * 3, higher_is_better=False, min_effect=0.01, confidence=0.95, early=True,
                blocks=[1, 1, 2], processes=2)  # fmt: skip
    assert few.verdict == INCONCLUSIVE and "3 rounds from 2 pairs of processes" in few.reason
    assert "run 4 or more" in few.reason
    lone = judge([(1.0, 1.02)] * 5, higher_is_better=False, min_effect=0.01, confidence=0.95, early=True,
                 blocks=[1] * 5, processes=2)  # fmt: skip
    assert lone.verdict == INCONCLUSIVE and lone.ratio is None  # the second pair ran no round


def _site(line: int, code: str, count: int, function: str = "decode") -> SiteCount:
    return SiteCount("pkg/loop.py", line, function, code, "scalar read", "aten::_local_scalar_dense", count)


def test_a_site_is_matched_by_its_source_text_across_a_line_inserted_above_it() -> None:
    before = [_site(10, "if bool(done.all()):", 100)]
    after = [_site(10, "if token[0].item() < 0:", 100), _site(12, "if bool(done.all()):", 100)]
    (change,) = site_changes(before, after)
    assert (change.status, change.site.where, change.old, change.new) == (
        "appeared",
        "pkg/loop.py:10 in decode",
        0,
        100,
    )
    assert "if token[0].item() < 0:" in change.describe()
    grew = site_changes(before, [_site(11, "if bool(done.all()):", 150)])
    assert [(c.status, c.old, c.new) for c in grew] == [("grew", 100, 150)]
    no_code = site_changes([_site(10, "", 4)], [_site(10, "", 4), _site(20, "", 2)])
    assert [(c.status, c.site.line) for c in no_code] == [("appeared", 20)]


def test_movers_say_when_an_item_was_beyond_a_cut_list() -> None:
    old = Details(top={"ops": (("aten::add", 300), ("aten::mm", 200))}, top_limit=2)
    new = Details(top={"ops": (("aten::add", 400), ("aten::mm", 200))}, top_limit=2)
    explanation = explain(old, new, ["ops_per_token"], EXPLAIN)
    assert [m.describe() for m in explanation.movers] == ["operators of ops: aten::add 300 -> 400 (+100)"]
    cut = explain(old, Details(top={"ops": (("aten::add", 300), ("aten::item", 250))}, top_limit=2), ["ops"], EXPLAIN)
    # aten::item (250) is above the old list's smallest (200): it moved; aten::mm (200) may be just below 250.
    assert {m.item: (m.old, m.new) for m in cut.movers} == {"aten::item": (None, 250)}


def test_a_copy_regression_names_its_copies_even_against_a_baseline_that_kept_none() -> None:
    # A baseline recorded before copies were itemized has no list of them: what the head ran is named in full.
    old = Details(top={"launches": (("gemm", 100),)}, top_limit=2)
    copy = "Memcpy DtoD (Device -> Device), 256 B"
    new = Details(top={"launches": (("gemm", 100),), "copies_d2d": ((copy, 99),)}, top_limit=2)
    (mover,) = explain(old, new, ["copy_bytes_d2d_per_token"], EXPLAIN).movers
    assert (mover.counter, mover.item, mover.old, mover.new) == ("copies_d2d", copy, None, 99)
    assert explain(old, new, ["launches_per_token"], EXPLAIN).movers == ()


def test_baselines_keep_the_details_that_explain_a_count_regression(tmp_path: Path) -> None:
    details = Details((_site(10, "if bool(done.all()):", 4),), {"ops": (("aten::add", 8),)}, 64)
    update(tmp_path / "cpu.json", "cpu", {"t::a": {"syncs": 4, "ops": 8}}, {"torch": "2.13"}, {"t::a": details})
    assert read(tmp_path / "cpu.json").details["t::a"] == details  # type: ignore[union-attr]
    now = Details((_site(10, "if bool(done.all()):", 4), _site(11, "x.item()", 4)), {"ops": (("aten::add", 12),)}, 64)
    store = BaselineStore(tmp_path, None, updating=False)
    comparison = store.compare("t::a", "cpu", Metrics({"syncs": 8, "ops": 12}, {}), details=now)
    assert comparison.status == "regression"
    assert comparison.explanation.lines() == [
        "sync site appeared pkg/loop.py:11 in decode: x.item() (scalar read, aten::_local_scalar_dense): 0 -> 4 "
        "syncs (+4)",
        "moved: operators of ops: aten::add 8 -> 12 (+4)",
    ]
    update(tmp_path / "cpu.json", "cpu", {"t::b": {"syncs": 1}}, {"torch": "2.13"}, {})
    assert set(read(tmp_path / "cpu.json").details) == {"t::a"}  # type: ignore[union-attr]  # others kept


LOOP = """
    import time

    import pytest
    import torch


    def step(x):
        return torch.tanh(x @ x)


    @pytest.mark.max_syncs_per_token(2)
    def test_decode(syncguard):
        x = torch.randn(32, 32) / 8

        def loop():
            y = x
            for _ in range(10):
                y = step(y)
                if bool((y > 10).any()):
                    break

        syncguard.measure(loop, tokens=10, repeat=3)


    def test_steady(syncguard):
        x = torch.randn(32, 32) / 8
        syncguard.measure(lambda: [step(x) for _ in range(10)], tokens=10, repeat=3)
"""


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def _repository(tmp_path: Path, head: str | None = None) -> Path:
    """A git repository whose commit "base" holds LOOP, and a commit "head" over it holding ``head``, if given."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "ci@example.com")
    _git(repo, "config", "user.name", "ci")
    (repo / "test_loop.py").write_text(textwrap.dedent(LOOP))
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "base")
    if head is not None:
        (repo / "test_loop.py").write_text(head)
        _git(repo, "commit", "-qam", "head")
    return repo


def test_ab_runs_base_and_head_of_a_real_repository_in_rounds_and_explains_the_regression(tmp_path: Path) -> None:
    """A base commit, and a head that adds a host read and 2 ms of sleep per step: the count regression names the
    new site with its source line and settles the test at once, the other test's counts hold and its rounds run
    until its interval settles, test by test, and the worktree of the base is removed."""
    slower = textwrap.dedent(LOOP).replace(
        "            y = step(y)\n            if bool",
        "            y = step(y)\n            time.sleep(0.002)\n            _ = y.sum().item()\n            if bool",
    )
    repo = _repository(tmp_path, slower)
    environment = {**os.environ, "SYNCGUARD_NATIVE": "0"}
    command = [sys.executable, "-m", "pytest_syncguard.gate.cli", "ab", "--base", "HEAD~1", "--rounds", "3",
               "--confidence", "0.5", "--json", "ab.json", "--markdown", "ab.md", "--fail-on-regression",
               "--timed-runs", "2", "--", "test_loop.py", "-q"]  # fmt: skip
    done = subprocess.run(command, cwd=repo, env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    report = read_report(repo / "ab.json")
    tests = {t.nodeid: t for t in report.tests}
    decode, steady = tests["test_loop.py::test_decode"], tests["test_loop.py::test_steady"]
    assert decode.verdict == REGRESSION
    assert {(c.metric, c.base, c.head) for c in decode.counts} >= {("syncs", 10, 20), ("syncs_per_token", 1, 2)}
    (site,) = decode.explanation.sites
    assert (site.status, site.site.path, site.site.code) == ("appeared", "test_loop.py", "_ = y.sum().item()")
    # Its count regression settled it after its first round: a count is exact. (Its time, 20 ms of sleep per loop,
    # is judged too where rounds allow; one round gives no interval.)
    seconds = decode.timings["seconds"]
    assert seconds.rounds == 1 and seconds.ratio is None
    assert "tokens_per_second" not in decode.timings  # judged once, as seconds
    assert steady.counts == ()  # its counts did not move
    assert "_ = y.sum().item()" in (repo / "ab.md").read_text()
    assert "worktree" not in subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True,
                                            text=True).stdout.split("\n", 1)[1]  # fmt: skip
    # Test by test: test_decode's one round, then test_steady's rounds (2 to 3: it settles when its interval does),
    # the two pairs of processes in turn (the second pair's processes are base-2 and head-2).
    files = sorted(p.name for p in (repo / "syncguard-ab").glob("t*-round*-*.json"))
    steady_rounds = steady.timings["seconds"].rounds
    assert report.processes == 2
    assert files == sorted(["t1-round1-base.json", "t1-round1-head.json",
                            *(f"t2-round{n}-{side}{'-2' if pair_of_round(n, 2) == 2 else ''}.json"
                              for n in range(1, steady_rounds + 1) for side in ("base", "head"))])  # fmt: skip
    assert report.held and "test by test, its fixtures kept set up across its rounds" in done.stdout
    assert report.costs[steady.nodeid][1] is not None and report.costs[decode.nodeid][1] is None
    # The first round checked the count budgets; the later ones measured timings only (--syncguard-timings-only),
    # with --timed-runs runs after the traced one, and no warm-up: the test's fixtures and state were kept.
    assert (
        report.timed_rounds and "timings only after the first round (2 per test, after the traced one)" in done.stdout
    )
    first, second = (read_results(repo / "syncguard-ab" / f"t2-round{n}-head.json") for n in (1, 2))
    counted, timed = first["test_loop.py::test_steady"], second["test_loop.py::test_steady"]
    # The first round as the suite runs it (the test's own 3 timed runs), then --timed-runs.
    assert (counted.metrics.runs["seconds"], timed.metrics.runs["seconds"]) == (3, 2)
    budgeted = read_results(repo / "syncguard-ab" / "t1-round1-head.json")["test_loop.py::test_decode"]
    assert [(c.budget.marker, c.held) for c in budgeted.checks] == [
        ("max_syncs_per_token", True)
    ]  # 2 per token, at its limit
    assert not decode.unmeasured  # its counts were judged on the round that counted them
    # The report of a run puts the A/B in the PR comment; a malformed A/B file is an error naming it.
    (repo / "bad.json").write_text(json.dumps({"schema": "pytest-syncguard/ab", "schema_version": 1}))
    head_results = repo / "syncguard-ab" / "t1-round1-head.json"
    rendered = subprocess.run([sys.executable, "-m", "pytest_syncguard.gate.cli", "report", str(head_results), "--ab", "ab.json"],
                              cwd=repo, capture_output=True, text=True)  # fmt: skip
    # test_steady's timing may come out a regression too: two rounds at 50% confidence cannot rule out noise.
    regressed = len(report.with_verdict(REGRESSION))
    assert regressed in (1, 2)
    noun = "regression" if regressed == 1 else "regressions"
    assert rendered.returncode == 0 and f"A/B on one runner: {regressed} {noun} in 2 tests" in rendered.stdout
    refused = subprocess.run([sys.executable, "-m", "pytest_syncguard.gate.cli", "report", str(head_results), "--ab", "bad.json"],
                             cwd=repo, capture_output=True, text=True)  # fmt: skip
    assert refused.returncode == 2 and "--ab bad.json: A/B report is malformed" in refused.stderr


def test_a_test_that_fails_on_the_head_is_the_ab_verdict_and_fails_the_run(tmp_path: Path) -> None:
    """The head adds ``assert False`` after a test's measure(): that test read "measured only in the base, not
    compared" and the A/B "0 regressions", exit 0 under --fail-on-regression. It is the first verdict now."""
    failing = textwrap.dedent(LOOP).replace(
        "    syncguard.measure(lambda: [step(x) for _ in range(10)], tokens=10, repeat=3)\n",
        "    syncguard.measure(lambda: [step(x) for _ in range(10)], tokens=10, repeat=3)\n    assert False\n",
    )
    assert failing != textwrap.dedent(LOOP)
    repo = _repository(tmp_path, failing)
    # Host timings are not judged: two rounds of a CPU loop's wall time on a loaded machine may read a regression.
    command = [sys.executable, "-m", "pytest_syncguard.gate.cli", "ab", "--base", "HEAD~1", "--rounds", "2",
               "--confidence", "0.5", "--json", "ab.json", "--markdown", "ab.md", "--fail-on-regression",
               "--no-host-timings", "--processes", "1", "--", "test_loop.py", "-q"]  # fmt: skip
    done = subprocess.run(command, cwd=repo, env={**os.environ, "SYNCGUARD_NATIVE": "0"}, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED       on the head: test_loop.py::test_steady: failed in round" in done.stdout
    assert "1 failed on the head (not compared)" in done.stdout.splitlines()[-1]
    report = read_report(repo / "ab.json")
    assert [t.nodeid for t in report.tests] == ["test_loop.py::test_decode"] and report.regressions == 1
    assert not report.only_in
    markdown = (repo / "ab.md").read_text()
    assert "A/B on one runner: 1 test failed on the head" in markdown.splitlines()[0]
    assert "**failed on the head** (not compared)" in markdown


def test_a_side_that_cannot_start_says_why_and_a_rerun_keeps_no_earlier_rounds(tmp_path: Path) -> None:
    """`syncguard ab -- nosuchfile.py` printed only "the base's pytest exited 4 (the other end closed its pipe)"; a
    rerun into an --out folder kept the earlier run's round files beside the new ones."""
    repo = _repository(tmp_path)
    stale = repo / "syncguard-ab" / "round9-base.json"
    stale.parent.mkdir()
    stale.write_text("{}")
    (stale.parent / ".gitignore").write_text(IGNORE_ALL)  # as the earlier A/B left it
    command = [sys.executable, "-m", "pytest_syncguard.gate.cli", "ab", "--base", "HEAD", "--rounds", "2",
               "--processes", "1", "--", "nosuchfile.py"]  # fmt: skip
    done = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pytest exited 4: ERROR: file or directory not found: nosuchfile.py" in done.stderr
    assert not stale.exists() and (repo / "syncguard-ab" / ".gitignore").is_file()


DATA = Path(__file__).parent / "data"
GATE = DATA / "h100_gate"


def _report(tmp_path: Path, name: str, *extra: str) -> tuple[str, str]:
    import gzip

    junit = tmp_path / f"{name}.xml"
    junit.write_bytes(gzip.decompress((GATE / f"{name}.xml.gz").read_bytes()))
    markdown = tmp_path / f"{name}.md"
    done = subprocess.run([sys.executable, "-m", "pytest_syncguard.gate.cli", "report", str(junit), "--baselines",
                           str(GATE / "baselines"), "--markdown", str(markdown), *extra],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return done.stderr, markdown.read_text()


def test_the_h100_gate_passes_an_unchanged_suite_from_another_host_and_names_each_planted_change(
    tmp_path: Path,
) -> None:
    """Real runs (tests/data/README.md): the unchanged suite on a third H100 host against the baseline a second
    recorded passes (judging its host timings would have failed it), and the planted changes are caught where they
    were planted, with what changed, and nowhere else."""
    summary, _ = _report(tmp_path, "unchanged-host3")
    assert "no regressions: 17 tests passed" in summary
    cried_wolf, _ = _report(tmp_path, "unchanged-host3", "--judge-host-timings")
    assert "no regressions: 17 tests passed" not in cried_wolf
    speed, speed_md = _report(tmp_path, "planted-speed")
    assert (
        "2 of 3 tests failed: 2 regressed against the baseline" in speed
    )  # kv_cache and static_cache; cuda_graph's counts hold
    assert "sync site appeared at `examples/strategies.py:71` in `kv_cache`: `if token[0].item() < 0:" in speed_md
    assert "test_speed[cuda_graph]" not in speed_md.split("### ❌ Regressions")[1].split("<details>")[0]
    timeline, timeline_md = _report(tmp_path, "planted-timeline")
    assert "3 of 3 tests failed: 3 regressed against the baseline" in timeline
    regressions = timeline_md.split("### ❌ Regressions")[1].split("<details>")[0]
    assert "`gpu_us_per_token` 2092 us → 2542 us (+21.5%), judged within 5.0%" in regressions  # the step slower
    assert "`launches` 35663 → 35763" in regressions and "CUDAFunctorOnSelf_add" in regressions
    unchanged = read_report(GATE / "ab-unchanged.json")
    assert unchanged.regressions == 0
    planted = {t.nodeid.split("::")[1]: t for t in read_report(GATE / "ab-planted.json").tests}
    seconds = planted["test_speed[cuda_graph]"].timings["seconds"]
    assert seconds.verdict == REGRESSION and seconds.low is not None and seconds.low > 1.1


SLOW_RUN = """
import os
import time
from pathlib import Path


def test_step(syncguard):
    runs = Path(os.environ["AB_RUNS"])
    with runs.open("a") as log:
        log.write(f"{os.getpid()}\\n")
    syncguard.measure(lambda: None, tokens=1, repeat=1)
    if len(runs.read_text().split()) >= int(os.environ["AB_SLOW_FROM"]):
        time.sleep(300)
"""


def _processes_naming(text: str) -> list[str]:
    """The command lines of this machine's processes that hold ``text`` (Linux's /proc)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with suppress(OSError):
            line = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if text in line:
                found.append(line)
    return found


def _worktrees(repo: Path) -> list[str]:
    listed = subprocess.run(["git", "-C", str(repo), "worktree", "list", "--porcelain"], capture_output=True,
                            text=True, check=True).stdout  # fmt: skip
    return [line.split(" ", 1)[1] for line in listed.splitlines() if line.startswith("worktree ")]


@pytest.mark.parametrize(
    ("signum", "slow_from", "running", "finished"),
    [
        # Ctrl-C in a terminal: SIGINT to the whole foreground process group, in round 2's first run (the base's),
        # after the first round and the second pair's holds.
        (signal.SIGINT, 5, "t1-round2-base", "t1-round1-base, t1-round1-head, t1-hold-base-2, t1-hold-head-2"),
        # A CI system cancelling the job: SIGTERM to the process, in the very first run.
        (signal.SIGTERM, 1, "t1-round1-base", "no run"),
    ],
    ids=["sigint-to-group", "sigterm"],
)
def test_ab_stops_at_once_when_told_and_leaves_no_worktree(
    tmp_path: Path, signum: signal.Signals, slow_from: int, running: str, finished: str
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "ci@example.com")
    _git(repo, "config", "user.name", "ci")
    (repo / "test_slow.py").write_text(SLOW_RUN)
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "base")
    (repo / "test_slow.py").write_text(SLOW_RUN + "\n# head\n")
    _git(repo, "commit", "-qam", "head")
    runs = tmp_path / "runs"
    runs.touch()
    environment = {**os.environ, "SYNCGUARD_NATIVE": "0", "AB_RUNS": str(runs), "AB_SLOW_FROM": str(slow_from)}
    command = [sys.executable, "-m", "pytest_syncguard.gate.cli", "ab", "--base", "HEAD~1", "--rounds", "6", "--",
               "test_slow.py", "-q"]  # fmt: skip
    ab = subprocess.Popen(command, cwd=repo, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while len(runs.read_text().split()) < slow_from:  # the run to stop is inside its test
            assert ab.poll() is None, ab.communicate()
            assert time.monotonic() < deadline, "the slow run never started"
            time.sleep(0.2)
        (base_worktree,) = (w for w in _worktrees(repo) if Path(w) != repo)
        assert Path(base_worktree).is_dir()
        stopped_at = time.monotonic()
        if signum == signal.SIGINT:
            os.killpg(ab.pid, signum)
        else:
            ab.send_signal(signum)
        out, err = ab.communicate(timeout=60)
        took = time.monotonic() - stopped_at
    finally:
        if ab.poll() is None:
            os.killpg(ab.pid, signal.SIGKILL)
            ab.wait()
    assert ab.returncode == 128 + signum, out + err
    assert took < 30, f"took {took:.1f} s to stop"
    assert f"interrupted by {signum.name} during {running}; the base's worktree is removed" in err
    assert f"finished before it: {finished}" in err
    assert ("partial results" in err) == (finished != "no run")
    assert "syncguard ab: test 1 of 1, test_slow.py::test_step: first round" in err
    if slow_from == 5:
        assert sorted(p.name for p in (repo / "syncguard-ab").glob("t1-round*.json")) == [
            "t1-round1-base.json",
            "t1-round1-head.json",
        ]
    assert "syncguard ab: " not in out  # no report of a run that did not finish
    # The stopped run's pytest is gone, and so is the other side's; the worktree is neither listed nor on disk.
    last_pid = int(runs.read_text().split()[-1])
    with pytest.raises(ProcessLookupError):
        os.kill(last_pid, 0)
    assert _processes_naming(str(tmp_path)) == []
    assert _worktrees(repo) == [str(repo)]
    assert not Path(base_worktree).exists() and not Path(base_worktree).parent.exists()


def test_a_result_without_a_baseline_is_filed_under_its_devices_slug_not_cuda(tmp_path: Path) -> None:
    from pytest_syncguard.gate.ab.sides import read_results

    # A results file of schema version 1 (written by the plugin before every result carried its slug), its one
    # record made into a CPU test, a CUDA test compared with no baseline and one compared with an H100's.
    document = json.loads(gzip.decompress((DATA / "results-v1-cpu.json.gz").read_bytes()))
    assert document["schema_version"] == 1
    record = document["tests"][0]
    document["tests"] = [
        {**record, "nodeid": "t::cpu"},
        {**record, "nodeid": "t::cuda", "device": "cuda", "baseline": None},
        {**record, "nodeid": "t::compared", "device": "cuda",
         "baseline": {**record["baseline"], "device": "nvidia-h100-80gb-hbm3"}},
    ]  # fmt: skip
    (tmp_path / "r.json").write_text(json.dumps(document))
    found = read_results(tmp_path / "r.json")
    assert {name: m.device_slug for name, m in found.items()} == {
        "t::cpu": "cpu", "t::cuda": "unknown", "t::compared": "nvidia-h100-80gb-hbm3",
    }  # fmt: skip


def test_syncguard_baselines_old_new_judges_each_change_by_the_gates_one_comparison(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_syncguard.gate.cli import main

    fingerprint = {"torch": "2.11", "device_name": "NVIDIA H100 80GB HBM3"}
    base = {"syncs": 4, "ops": 8, "gpu_us_per_token": 2000.0, "seconds": 0.5, "fragmentation": 0.1}
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    details = Details((_site(10, "if bool(done.all()):", 4),), {"ops": (("aten::add", 8),)}, 64)
    update(old, "nvidia-h100-80gb-hbm3", {"t::a": base, "t::gone": {"syncs": 1}, "t::same": {"syncs": 1}},
           fingerprint, {"t::a": details})  # fmt: skip
    head = {**base, "ops": 12, "gpu_us_per_token": 2060.0, "seconds": 0.8, "fragmentation": 0.1001}
    now = Details((_site(10, "if bool(done.all()):", 4),), {"ops": (("aten::add", 12),)}, 64)
    update(new, "nvidia-h100-80gb-hbm3", {"t::a": head, "t::new": {"syncs": 2}, "t::same": {"syncs": 1}},
           {**fingerprint, "torch": "2.12"}, {"t::a": now})  # fmt: skip
    assert main(["baselines", str(old), str(new)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "environment: torch 2.11 -> 2.12",
        "~ t::a: regression",
        "    unchanged: fragmentation 0.1 -> 0.1001 (+0.0001, +0.1%; tolerance 2.0%: 1 recording, spread unknown)",
        "    unchanged: gpu_us_per_token 2000 us -> 2060 us (+60 us, +3.0%; tolerance 5.0%: 1 recording, spread "
        "unknown)",
        "    regression: ops 8 -> 12 (+4, +50.0%)",
        "    not judged: seconds 0.5 s -> 0.8 s (+0.3 s, +60.0%)",
        "    moved: operators of ops: aten::add 8 -> 12 (+4)",
        "- t::gone",
        "+ t::new",
        "6 differences (tests: 1 regression)",
    ]


def _big_repo(repo: Path, files: int) -> None:
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "ci@example.com")
    _git(repo, "config", "user.name", "ci")
    for i in range(files):
        (repo / f"f{i:05d}.txt").write_text(f"{i}\n" * 200)
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "base")


def test_ctrl_c_during_the_base_checkout_leaves_no_worktree_locked_or_folder(tmp_path: Path) -> None:
    """Ctrl-C while `git worktree add` checks out the base: git leaves a locked worktree with a partial checkout,
    which `git worktree prune` keeps; it was left behind (exit 130, "the worktree is removed")."""
    repo, temp = tmp_path / "repo", tmp_path / "tmp"
    _big_repo(repo, 6000)
    temp.mkdir()
    environment = {**os.environ, "TMPDIR": str(temp), "SYNCGUARD_NATIVE": "0"}
    command = [sys.executable, "-m", "pytest_syncguard.gate.cli", "ab", "--base", "HEAD", "--", "f00000.txt"]
    ab = subprocess.Popen(command, cwd=repo, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not any(temp.glob("syncguard-ab-*/base/f0*")):  # the checkout has begun
            assert ab.poll() is None, ab.communicate()
            assert time.monotonic() < deadline, "the checkout never began"
            time.sleep(0.002)
        os.killpg(ab.pid, signal.SIGINT)  # Ctrl-C: the whole group, git too
        _, err = ab.communicate(timeout=120)
    finally:
        if ab.poll() is None:
            os.killpg(ab.pid, signal.SIGKILL)
            ab.wait()
    assert ab.returncode == 130, err
    assert "Traceback" not in err
    assert _worktrees(repo) == [str(repo)]
    assert list(temp.iterdir()) == []


def test_a_base_that_is_no_commit_or_cannot_be_checked_out_is_named_and_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_syncguard.gate.cli import main

    repo, temp = tmp_path / "repo", tmp_path / "tmp"
    _big_repo(repo, 1)
    temp.mkdir()
    monkeypatch.chdir(repo)
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr("tempfile.tempdir", None)
    assert main(["ab", "--base", "no-such-ref", "--", "x.py"]) == 2
    assert f"syncguard ab: --base no-such-ref: no such commit in {repo}" in capsys.readouterr().err
    # A worktree add that fails (git cannot make its worktree's record: .git/worktrees is a file): no empty
    # temporary folder is left.
    (repo / ".git" / "worktrees").write_text("")
    assert main(["ab", "--base", "HEAD", "--", "x.py"]) == 2
    err = capsys.readouterr().err
    assert "git worktree add --detach" in err and "failed: " in err and not err.rstrip().endswith("failed:")
    assert list(temp.iterdir()) == []


def test_the_ab_leaves_out_what_the_baseline_judged_and_says_so(tmp_path: Path) -> None:
    """The tests whose device time a suite's results judged against a baseline (a real H100 run: its 7 timeline
    tests) are found; an A/B told to skip them runs the others only, and one whose tests were all judged runs no
    round, saying so rather than reading "0 regressions" of nothing."""
    from examples.strategies import STRATEGIES

    results = tmp_path / "results.json"
    results.write_bytes(gzip.decompress((DATA / "h100_results" / "results-nvidia-h100-80gb-hbm3.json.gz").read_bytes()))
    judged = judged_by_baseline(results)
    assert sorted(n.split("::")[1] for n in judged) == [f"test_timeline[{s}]" for s in sorted(STRATEGIES)]
    assert {Path(f).name for f in judged.values()} == {"nvidia-h100-80gb-hbm3.json"}

    repo = _repository(tmp_path)
    plan = Plan(2, None, 0.5, timed_runs=0, host_timings=False, processes=1)  # as the GPU job runs it, one pair
    common = {"base_ref": "HEAD", "base_dir": None, "head": repo, "pytest_args": ["test_loop.py", "-q"], "plan": plan,
              "out": repo / "ab", "progress": lambda line: None}  # fmt: skip
    some = run(**common, judged={"test_loop.py::test_steady": "baselines/x.json", "elsewhere.py::t": "b.json"})
    assert [t.nodeid for t in some.tests] == ["test_loop.py::test_decode"]
    assert not some.tests[0].timings  # a CPU run has no device time, and host timings were not asked for
    assert "host timings not judged" in summary_lines(some)[0]
    assert some.judged_by_baseline == {"test_loop.py::test_steady": "baselines/x.json"}  # what it selects only
    assert "judged against the baseline, not A/B-tested: 1 tests (baselines/x.json)" in "\n".join(summary_lines(some))
    every = run(**common, judged={f"test_loop.py::{n}": "baselines/x.json" for n in ("test_decode", "test_steady")})
    assert every.rounds == 0 and not every.tests and "no round run" in every.stopped
    assert every.regressions == 0 and len(every.judged_by_baseline) == 2


def test_the_suites_results_are_the_heads_first_round_and_the_time_budget_names_what_it_did_not_reach(
    tmp_path: Path,
) -> None:
    """The job's suite measured the head already: with its results the head's side is not measured in full again
    (no first-round file of its own; its hold is its second round, timings only), and the suite's counts judge the
    head. Results of another device are refused naming the option; a time budget too small for the second test
    reports it not A/B-tested, undecided, rather than passing it."""
    slower = textwrap.dedent(LOOP).replace(
        "            y = step(y)\n            if bool",
        "            y = step(y)\n            _ = y.sum().item()\n            if bool",
    )
    repo = _repository(tmp_path, slower)
    environment = {**os.environ, "SYNCGUARD_NATIVE": "0"}
    suite = subprocess.run([sys.executable, "-m", "pytest", "test_loop.py", "-q", "-p", "no:cacheprovider",
                            "--syncguard", "--syncguard-json=suite.json"], cwd=repo, env=environment,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert (repo / "suite.json").is_file(), suite.stdout + suite.stderr
    command = [sys.executable, "-m", "pytest_syncguard.gate.cli", "ab", "--base", "HEAD~1", "--rounds", "2",
               "--confidence", "0.5", "--timed-runs", "1", "--head-results", "suite.json", "--json", "ab.json",
               "--"]  # fmt: skip
    done = subprocess.run([*command, "test_loop.py", "-q"], cwd=repo, env=environment, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = read_report(repo / "ab.json")
    assert report.head_first == "suite.json" and "the head's first round the suite's (suite.json)" in done.stdout
    files = sorted(p.name for p in (repo / "syncguard-ab").glob("t*-round*.json"))
    assert "t1-round1-head.json" not in files and "t1-round1-base.json" in files
    (decode,) = (t for t in report.tests if t.nodeid.endswith("test_decode"))
    assert {(c.metric, c.base, c.head) for c in decode.counts} >= {("syncs", 10, 20)}  # the suite's count
    # test_decode's count settled it at once (the head not even set up); test_steady's time needs 2 rounds: the
    # suite's, then a replay on each side of the first pair after the head's hold and the second pair's, which set it
    # up and are no round.
    assert not any(name.startswith(("t1-round2", "t1-hold")) for name in files)
    held = sorted(p.name for p in (repo / "syncguard-ab").glob("t*-hold-*.json"))
    assert held == ["t2-hold-base-2.json", "t2-hold-head-2.json", "t2-hold-head.json"]
    assert {"t2-round2-head.json", "t2-round2-base.json"} <= set(files)
    assert read_results(repo / "syncguard-ab" / "t2-round2-head.json")["test_loop.py::test_steady"].checks == ()
    # Another device's results are no round of this runner's A/B.
    data = json.loads((repo / "suite.json").read_text())
    for test in data["tests"]:
        test["device_slug"] = "nvidia-h100-80gb-hbm3"
    (repo / "other.json").write_text(json.dumps(data))
    refused = subprocess.run([*command[:-7], "--head-results", "other.json", "--", "test_loop.py"], cwd=repo,
                             env=environment, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert refused.returncode == 2
    assert "syncguard ab: --head-results other.json: measured on nvidia-h100-80gb-hbm3, this runner is cpu" in (
        refused.stderr
    )
    # A budget spent by the first test: the second is not reached, and says so.
    plan = Plan(2, None, 0.5, time_budget=0.001, timed_runs=0, host_timings=False, processes=1)
    short = run(base_ref="HEAD~1", base_dir=None, head=repo, pytest_args=["test_loop.py", "-q"], plan=plan,
                out=repo / "ab-short", progress=lambda line: None)  # fmt: skip
    assert short.unreached == ("test_loop.py::test_steady",) and "left no time for 1 tests" in short.stopped
    assert "NOT A/B-TESTED (undecided: the time budget ran out first): test_loop.py::test_steady" in summary_lines(
        short
    )
    from pytest_syncguard.render.markdown import ab_lines

    assert ab_lines(short)[0].startswith("### ❌")  # test_decode's count regression; test_steady named below it
    assert any("Not A/B-tested, undecided" in line and "test_steady" in line for line in ab_lines(short))


def test_a_change_that_raises_its_own_baseline_is_judged_against_the_bases_and_ab_tested(tmp_path: Path) -> None:
    """The PR adds a host read per step and records the new count into baselines/cpu.json in the same commit. The
    report at --base-ref judges it against the base's file (a regression), says above the fold what the change
    loosened, and the A/B's --skip-judged does not leave the test out as judged."""
    reads = textwrap.dedent(LOOP).replace(
        "            y = step(y)\n", "            y = step(y)\n            _ = y.sum().item()\n"
    )
    repo = _repository(tmp_path)
    pytest_run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--syncguard", "test_loop.py"]
    subprocess.run([*pytest_run, "--syncguard-update-baselines"], cwd=repo, check=True, capture_output=True)
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "baselines")
    (repo / "test_loop.py").write_text(reads)
    subprocess.run([*pytest_run, "--syncguard-update-baselines", "--syncguard-json", "pr.json"], cwd=repo,
                   check=True, capture_output=True)  # fmt: skip
    _git(repo, "commit", "-qam", "more reads, and their baseline")
    report = [sys.executable, "-m", "pytest_syncguard.gate.cli", "report", "pr.json", "--baselines", "baselines"]
    own = subprocess.run(report, cwd=repo, capture_output=True, text=True)
    assert own.stderr == "syncguard report: no regressions: 2 tests passed\n"  # the hole: the head's own file
    judged = subprocess.run([*report, "--base-ref", "HEAD~1", "--fail-on-regression"], cwd=repo, capture_output=True,
                            text=True)  # fmt: skip
    assert judged.returncode == 1, judged.stderr
    assert judged.stderr == ("syncguard report: 1 of 2 tests failed: 1 regressed against the baseline; this change "
                             "loosens 4 baseline values\n")  # syncs and ops, each in total and per token  # fmt: skip
    shown = judged.stdout.split("<details>")[0]
    assert "### ⚠️ This change loosens its own baselines" in shown
    assert "| `test_loop.py::test_decode` | `cpu` | `syncs` | 10 → 20 |" in shown
    assert "test_steady" not in shown.split("### ⚠️")[1].split("### ❌")[0]  # its entry did not move
    # The A/B's --skip-judged: what the head's file loosens against the base's checkout is A/B-tested, the rest left
    # to the baseline that judged it.
    base = tmp_path / "base"
    (base / "baselines").mkdir(parents=True)
    shown = subprocess.run(["git", "-C", str(repo), "show", "HEAD~1:baselines/cpu.json"], capture_output=True,
                           check=True)  # fmt: skip
    (base / "baselines" / "cpu.json").write_bytes(shown.stdout)
    judged_tests = {f"test_loop.py::{n}": "baselines/cpu.json" for n in ("test_decode", "test_steady")}
    assert baselines_changed(judged_tests, base, repo) == {"test_loop.py::test_decode"}


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--confidence", "0", "expected a confidence from 0.5 to below 1"),
        ("--min-effect", "0", "expected a relative change above 0 and below 1"),
        ("--timed-runs", "2147483648", "expected a number of runs from 0 to 1000"),
    ],
)
def test_an_ab_option_no_report_could_hold_is_refused(
    option: str, value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_syncguard.gate.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["ab", "--base", "HEAD", option, value, "--", "x.py"])
    assert exited.value.code == 2 and said in capsys.readouterr().err


def test_outside_a_repository_or_with_a_path_outside_the_head_the_ab_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_syncguard.gate.ab.plan import relative_paths
    from pytest_syncguard.gate.ab.sides import ABError
    from pytest_syncguard.gate.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["ab", "--base", "HEAD", "--", "x.py"]) == 2
    assert "is not in a git repository" in capsys.readouterr().err
    head = tmp_path / "head"
    assert relative_paths([str(head / "tests" / "t.py") + "::test[a]", "-k", "x", "t.py"], head) == [
        "tests/t.py::test[a]", "-k", "x", "t.py"]  # fmt: skip
    with pytest.raises(ABError, match="outside the head's folder"):
        relative_paths([str(tmp_path / "elsewhere.py")], head)


def test_an_ab_run_from_a_subfolder_runs_the_base_from_the_same_subfolder_with_absolute_paths(tmp_path: Path) -> None:
    """The base ran the head's file through an absolute path (0 tests compared) and could not find a file named
    from a subfolder; both now compare the test, and a head that skips it fails the A/B."""
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "ci@example.com")
    _git(repo, "config", "user.name", "ci")
    (repo / "tests" / "test_loop.py").write_text(textwrap.dedent(LOOP))
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "base")
    skipped = textwrap.dedent(LOOP).replace(
        "def test_decode(syncguard):", "def test_decode(syncguard):\n    pytest.skip('x')"
    )
    (repo / "tests" / "test_loop.py").write_text(skipped)
    _git(repo, "commit", "-qam", "head skips its test")
    plan = Plan(1, None, 0.5, timed_runs=0, host_timings=False, processes=1)
    sub = repo / "tests"
    report = run(base_ref="HEAD~1", base_dir=None, head=sub, pytest_args=[str(sub / "test_loop.py"), "-q"], plan=plan,
                 out=tmp_path / "ab", progress=lambda line: None)  # fmt: skip
    assert [t.nodeid for t in report.tests] == ["test_loop.py::test_steady"]
    assert report.failed_in["head"] == {"test_loop.py::test_decode": {"skipped": (1,)}}
    assert report.regressions == 1  # a head that skips its test does not pass


def test_its_terminal_closed_stops_the_ab_as_a_cancelled_job_does() -> None:
    """SIGHUP (an ssh session dropped) left the base's worktree registered: it is one of the signals that stop the A/B
    (the worktree's removal on them is tested above with SIGTERM), and the handler before it comes back."""
    from pytest_syncguard.gate.ab.plan import STOP_SIGNALS, ABInterrupted, stopping_on_signals

    assert signal.SIGHUP in STOP_SIGNALS
    before = signal.getsignal(signal.SIGHUP)
    with pytest.raises(ABInterrupted) as stopped, stopping_on_signals():
        signal.raise_signal(signal.SIGHUP)
    assert stopped.value.exit_status == 129 and signal.getsignal(signal.SIGHUP) == before


AB_PAIRS = Path(__file__).parent / "data" / "ab_pairs"


def _pairs_of(job: str) -> dict[str, list[list[float]]]:
    tests: dict[str, list[list[float]]] = json.loads((AB_PAIRS / f"{job}.json").read_text())["tests"]
    return {nodeid.split("::")[1]: rows for nodeid, rows in tests.items()}


def test_two_pairs_on_real_rounds_see_the_planted_step_and_call_no_unchanged_test_changed() -> None:
    """The GPU job's A/B rounds on an H100 and an H200 (+1.5% planted per cuda_graph step, the other 6 tests
    unchanged code; tests/data/README.md): judged with two pairs, no unchanged test is a regression or an
    improvement, and each pair sees the planted step. On the H100, kv_cache's first pair read the unchanged head
    1% faster in 3 rounds agreeing within 0.2%: one pair's interval excludes no change, while the second pair read
    it 1% slower."""
    for job in ("h100_job_1.5", "h200_job_1.5"):
        for name, rows in _pairs_of(job).items():
            pairs, blocks = [(b, h) for _, _, b, h in rows], [int(p) for _, p, _, _ in rows]
            verdict = judge(pairs, higher_is_better=False, min_effect=0.01, confidence=0.95, early=True,
                            blocks=blocks, processes=2, max_rounds=12)  # fmt: skip
            if name == "test_speed[cuda_graph]":
                assert min(verdict.pairs) > 1.01 and verdict.verdict == INCONCLUSIVE, (job, verdict)
                assert "slower: its interval is clear of no change" in verdict_note(verdict, "gpu_us_per_token")
            else:
                assert verdict.verdict not in (REGRESSION, IMPROVEMENT), (job, name, verdict)
    kv = _pairs_of("h100_job_1.5")["test_speed[kv_cache]"]
    first = [math.log(h / b) for _, p, b, h in kv if p == 1]
    second = [math.log(h / b) for _, p, b, h in kv if p == 2]
    assert max(first) < -0.009 < 0.009 < min(second) and max(first) - min(first) < 0.002
    alone = judge([(b, h) for _, p, b, h in kv if p == 1], higher_is_better=False, min_effect=0.01, confidence=0.95,
                  early=True)  # fmt: skip
    assert alone.high is not None and alone.high < 1.0  # one pair: "faster", on unchanged code


def test_an_adoption_pr_whose_test_file_the_base_lacks_is_compared_where_it_can_and_reported(tmp_path: Path) -> None:
    """The PR that adopts syncguard adds its test file: the base has no such file. The A/B does not stop on the
    base's pytest (exit 4, file not found): a file new in the change is the head's only, and where the base has
    none of the selected tests no round runs and the report says why; the report and its comment go on."""
    repo = _repository(tmp_path)
    (repo / "test_new.py").write_text(textwrap.dedent(LOOP).replace("def test_", "def test_new_"))
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "adopt syncguard")
    environment = {**os.environ, "SYNCGUARD_NATIVE": "0"}
    command = [sys.executable, "-m", "pytest_syncguard.gate.cli", "ab", "--base", "HEAD~1", "--rounds", "2",
               "--confidence", "0.5", "--timed-runs", "1", "--processes", "1"]  # fmt: skip
    alone = subprocess.run([*command, "--json", "alone.json", "--", "test_new.py", "-q"], cwd=repo, env=environment,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert alone.returncode == 0, alone.stdout + alone.stderr
    said = alone.stdout + alone.stderr
    assert "the base has none of the tests it selects (test_new.py is new in this change)" in said
    report = read_report(repo / "alone.json")
    assert report.rounds == 0 and report.tests == () and "test_new.py is new in this change" in report.stopped
    both = subprocess.run([*command, "--json", "both.json", "--", "test_new.py", "test_loop.py", "-q"], cwd=repo,
                          env=environment, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert both.returncode == 0, both.stdout + both.stderr
    both_report = read_report(repo / "both.json")
    assert {t.nodeid.split("::")[0] for t in both_report.tests} == {"test_loop.py"}
    assert set(both_report.only_in.get("head", ())) >= {"test_new.py::test_new_decode"}
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True, text=True, check=True)
    assert len(worktrees.stdout.splitlines()) == 1  # the base's worktree removed
