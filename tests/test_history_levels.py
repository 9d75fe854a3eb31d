"""The history's level against a careless or hostile default branch: an outlier, a pair of glitches, a creep, a
commit recorded again and a test main's last run left out each leave a pull request judged as it should be.

The suite is the real H100 results document of the strategy suite (tests/data/h100_pr); runs are written by the
project's own writer (:func:`.history.record`), hosts and noise as recorded on H100s (±0.1-0.3% within a host)."""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_syncguard.document import file as results_file
from pytest_syncguard.document.measured import MeasuredTest
from pytest_syncguard.judge import history
from pytest_syncguard.judge.comparison import tolerance_of
from pytest_syncguard.judge.history import History
from pytest_syncguard.judge.run import compare_run
from pytest_syncguard.metrics import DEVICE_TIME, Metrics

DATA = Path(__file__).parent / "data" / "h100_pr"
GRAPH = "examples/test_strategies.py::test_speed[cuda_graph]"
SLUG = "nvidia-h100-80gb-hbm3"
HOSTS = ["a9dc0a68", "c3cd64c4", "56c4121f", "8423f385"]


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> list[MeasuredTest]:
    path = tmp_path_factory.mktemp("suite") / "unchanged.json"
    path.write_bytes(gzip.decompress((DATA / "unchanged.json.gz").read_bytes()))
    return [t for t in results_file.read(path) if t.nodeid == GRAPH]


def scaled(tests: list[MeasuredTest], factor: float, host: str, rng: random.Random | None = None,
           syncs: float | None = None) -> list[MeasuredTest]:  # fmt: skip
    """The suite with device time scaled by ``factor`` (and a host's noise of 0.2% with ``rng``), run on ``host``."""
    out = []
    for test in tests:
        values = dict(test.metrics.values)
        values[DEVICE_TIME] *= factor * (1 + (rng.gauss(0, 0.002) if rng is not None else 0.0))
        if syncs is not None:
            values["syncs"] = syncs
        out.append(replace(test, metrics=Metrics(values, dict(test.metrics.runs)), host=host))
    return out


def main_runs(folder: Path, suite: list[MeasuredTest], factors: list[float], seed: int = 1) -> None:
    rng = random.Random(seed)
    for push, factor in enumerate(factors):
        history.record(folder, scaled(suite, factor, HOSTS[push % 4], rng), f"{push:040x}", f"t{push}")


def judged(tmp_path: Path, folder: Path, tests: list[MeasuredTest]) -> str:
    """The comparison status of the PR ``tests`` against the history in ``folder``."""
    path = tmp_path / "pr.json"
    document = {"schema": results_file.SCHEMA, "schema_version": results_file.SCHEMA_VERSION,
                "tests": [results_file.record(t) for t in tests]}  # fmt: skip
    import json

    path.write_text(json.dumps(document))
    (case,) = compare_run([path], None, history=folder).cases
    return case.comparison.status


def tolerance(folder: Path, host: str = HOSTS[0]) -> float:
    found = history.read(folder, SLUG)
    assert found is not None
    _, spreads = history.baseline(found).reference(GRAPH, host)
    return tolerance_of(DEVICE_TIME, None, spreads[DEVICE_TIME])


@pytest.mark.parametrize("outlier", [1.4, 0.6], ids=["far-above", "far-below"])
def test_one_run_far_off_moves_neither_the_level_nor_its_tolerance(
    tmp_path: Path, suite: list[MeasuredTest], outlier: float
) -> None:
    """12 steady runs, one at +40% (or -40%), 5 steady after: the tolerance stays that of the steady runs and a PR
    at +40% is a regression at once and after."""
    steady = tmp_path / "steady"
    main_runs(steady, suite, [1.0] * 12)
    poisoned = tmp_path / "poisoned"
    main_runs(poisoned, suite, [1.0] * 12 + [outlier])
    assert tolerance(poisoned) == pytest.approx(tolerance(steady)) and tolerance(poisoned) < 0.02
    assert judged(tmp_path, poisoned, scaled(suite, 1.4, HOSTS[0])) == "regression"
    assert judged(tmp_path, poisoned, scaled(suite, 1.0, HOSTS[0])) == "unchanged"
    main_runs(poisoned, suite, [1.0] * 5, seed=2)
    assert judged(tmp_path, poisoned, scaled(suite, 1.4, HOSTS[0])) == "regression"
    assert tolerance(poisoned) < 0.02


def test_two_glitches_in_a_row_start_no_level_and_three_runs_do(tmp_path: Path, suite: list[MeasuredTest]) -> None:
    folder = tmp_path / "h"
    main_runs(folder, suite, [1.0] * 12 + [1.3, 1.3])
    assert judged(tmp_path, folder, scaled(suite, 1.0, HOSTS[0])) == "unchanged"
    found = history.read(folder, SLUG)
    assert found is not None and "judged from run 1 (main's last 2 runs lie beyond it, +30" in history.describe(
        found, GRAPH
    )
    moved = tmp_path / "moved"
    main_runs(moved, suite, [1.0] * 12 + [1.03] * 3)  # a change merged on purpose: three runs at its new level
    found = history.read(moved, SLUG)
    assert found is not None and f"{DEVICE_TIME} judged from run 13" in history.describe(found, GRAPH)
    assert judged(tmp_path, moved, scaled(suite, 1.03, HOSTS[3])) == "unchanged"


def test_a_creep_of_small_steps_leaves_the_tolerance_narrow_and_shows_as_levels(
    tmp_path: Path, suite: list[MeasuredTest]
) -> None:
    """40 merges of +0.5% each (+22% in all): the level moves in steps (each said by where it begins), its tolerance
    stays that of the runs' noise, and a PR of +8% over main's last run is a regression."""
    folder = tmp_path / "h"
    main_runs(folder, suite, [1.005**i for i in range(40)])
    assert tolerance(folder) < 0.03
    found = history.read(folder, SLUG)
    assert found is not None
    described = history.describe(found, GRAPH, DEVICE_TIME)
    start = int(described.rsplit("judged from run ", 1)[1])
    assert start > 20, described  # the level began after the creep's start
    assert judged(tmp_path, folder, scaled(suite, 1.005**39 * 1.08, HOSTS[0])) == "regression"


def test_a_commit_recorded_again_replaces_its_run(tmp_path: Path, suite: list[MeasuredTest]) -> None:
    folder = tmp_path / "h"
    main_runs(folder, suite, [1.0] * 12)
    for again in range(10):
        held = history.record(folder, scaled(suite, 1.0, HOSTS[0]), f"{11:040x}", f"again{again}")
    assert held[SLUG].runs == 12 and held[SLUG].replaced == "again8"
    assert "the run of this commit recorded at again8 replaced" in held[SLUG].describe(SLUG)
    found = history.read(folder, SLUG)
    assert found is not None and [r.commit for r in found.runs].count(f"{11:040x}") == 1
    assert judged(tmp_path, folder, scaled(suite, 1.0, HOSTS[0])) == "unchanged"


@pytest.mark.parametrize("outcome", ["failed", "skipped"])
def test_a_test_main_last_left_out_is_judged_against_its_last_good_run(
    tmp_path: Path, suite: list[MeasuredTest], outcome: str
) -> None:
    folder = tmp_path / "h"
    main_runs(folder, suite, [1.0] * 10)
    broken = [replace(t, outcome=outcome) for t in scaled(suite, 1.0, HOSTS[0])]
    held = history.record(folder, broken, "f" * 40, "last")
    assert held[SLUG].left_out == {GRAPH: outcome}
    assert f"1 test left out, judged against their last good run: {outcome}: {GRAPH}" in held[SLUG].describe(SLUG)
    assert judged(tmp_path, folder, scaled(suite, 1.5, HOSTS[0], syncs=1000.0)) == "regression"
    found = history.read(folder, SLUG)
    assert found is not None
    from pytest_syncguard.render.markdown import render

    text, _ = render(compare_run([tmp_path / "pr.json"], None, history=folder))
    assert f"The default branch's last run left out `{GRAPH}` ({outcome}): judged against its last good run" in text
    last_good = f"{9:040x}"[:12]
    assert f"main's last run {outcome}: judged against its last good run ({last_good})" in history.describe(
        found, GRAPH
    )


def test_a_run_without_device_time_keeps_the_level(tmp_path: Path, suite: list[MeasuredTest]) -> None:
    folder = tmp_path / "h"
    main_runs(folder, suite, [1.0] * 10)
    counts_only = []
    for test in scaled(suite, 1.0, HOSTS[0]):
        values = {n: v for n, v in test.metrics.values.items() if n != DEVICE_TIME}
        counts_only.append(replace(test, metrics=Metrics(values, dict(test.metrics.runs))))
    history.record(folder, counts_only, "d" * 40, "last")
    assert judged(tmp_path, folder, scaled(suite, 1.5, HOSTS[0])) == "regression"


def test_a_chart_of_values_of_millions_is_one_mermaid_can_read(tmp_path: Path, suite: list[MeasuredTest]) -> None:
    """Mermaid's xychart reads no exponent form: values of a million and more (transfer bytes, long device times)
    and small fractions are written positionally."""
    import re

    from pytest_syncguard.render.charts import mermaid, plain

    assert [plain(v) for v in (12_800_000.0, 1234.5678, 0.000125, -3.0, 0.0)] == [
        "12800000", "1234.57", "0.000125", "-3", "0"]  # fmt: skip
    folder = tmp_path / "h"
    main_runs(folder, suite, [6400.0] * 3)  # 2000 us x 6400: about 1.28e7 us per token
    found = history.read(folder, SLUG)
    assert found is not None
    chart = "\n".join(mermaid(found, GRAPH, DEVICE_TIME, 1.4e7))
    assert "e+" not in chart and re.search(r"line \[1\d{7}(\.\d+)?, ", chart), chart


def test_a_fixed_level_judges_each_later_run_without_computing_its_band_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A level is fixed by its first runs: replaying a history computes its band once per level and host, so a
    year of runs costs a lookup per run, not the level's statistics (bench/bench_history_scale.py times it)."""
    from pytest_syncguard.judge import baselines

    calls = 0
    real = baselines.reference_of

    def counted(*args: object, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(baselines, "reference_of", counted)
    rng = random.Random(3)

    def replayed(runs: int) -> int:
        nonlocal calls
        calls = 0
        made = tuple(
            history.Run(f"{n:040x}", "2026-01-01T00:00:00Z", "h100-a", {"t::a": {DEVICE_TIME: 100 * (1 + rng.gauss(0, 0.002))}})
            for n in range(runs)
        )  # fmt: skip
        history.levels(history.History("nvidia-h100-80gb-hbm3", made))
        return calls

    assert replayed(400) - replayed(40) < 20


# -- segments: the checkpoint and the open segment judge as a replay of every run does ---------------------------


#: Device time per push: a level, a glitch, a merged +3% step, a creep and a left-out run, over several segments.
FACTORS = [1.0] * 7 + [1.4] + [1.0] * 4 + [1.03] * 6 + [1.03 + 0.002 * i for i in range(6)] + [1.05] * 4


def _segments(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f"{SLUG}.0"))


def test_a_judgement_from_the_checkpoint_is_the_replay_of_every_run(
    tmp_path: Path, suite: list[MeasuredTest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Segments of 5 runs: after 28 pushes, 5 closed segments and 3 runs open; the checkpoint's baseline, levels,
    where each level begins and what the last run left out are those of all 28 runs replayed from the first."""
    monkeypatch.setattr(history, "SEGMENT", 5)
    folder = tmp_path / "h"
    main_runs(folder, suite, FACTORS[:-1])
    rng = random.Random(9)
    left = scaled(suite, FACTORS[-1], HOSTS[0], rng)
    history.record(folder, [replace(t, outcome="failed") for t in left], "f" * 40, "tl")
    assert _segments(folder) == [f"{SLUG}.{n:06d}.jsonl" for n in (0, 5, 10, 15, 20)]
    windowed = history.read(folder, SLUG)
    whole = history.read(folder, SLUG, every_run=True)
    assert windowed is not None and whole is not None
    assert (windowed.first, len(windowed.runs), windowed.count) == (25, 3, 28)
    assert (whole.first, len(whole.runs), whole.count) == (0, 28, 28) and whole.hosts == windowed.hosts
    by_checkpoint, by_replay = history.levels(windowed), history.levels(whole)
    assert by_checkpoint.baseline.tests == by_replay.baseline.tests
    assert by_checkpoint.baseline.history == by_replay.baseline.history
    assert by_checkpoint.since == by_replay.since and by_checkpoint.stale == by_replay.stale
    assert by_checkpoint.stale, "the last run left its test out: judged against its last good run"
    assert any(begins > 1 for begins in by_checkpoint.since.values()), "the merged step started a new level"
    nodeid = next(iter(by_checkpoint.baseline.tests))
    assert history.describe(windowed, nodeid, DEVICE_TIME) == history.describe(whole, nodeid, DEVICE_TIME)


def test_the_latest_state_a_record_advances_is_the_replay_of_every_run(
    tmp_path: Path, suite: list[MeasuredTest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After each push (segments of 4: closing ones, a job run again that replaces a run in the middle, one that
    replaces the last), the latest state the record advanced by one run equals the checkpoint's replay through the
    open segment; one that does not match the open segment (an earlier version's record) is not used."""
    monkeypatch.setattr(history, "SEGMENT", 4)
    folder, rng = tmp_path / "h", random.Random(3)
    pushes = [(n, factor) for n, factor in enumerate(FACTORS[:14])] + [(13, 1.02), (12, 1.0), (14, 1.01), (14, 1.0)]
    for n, factor in pushes:
        history.record(folder, scaled(suite, factor, HOSTS[n % 4], rng), f"{n:040x}", f"t{n}-{factor}")
        found = history.read(folder, SLUG)
        assert found is not None and found.latest is not None, n
        assert found.latest == history.replay_of(found.before, found.runs), n
    assert found.count == 15 and len(found.runs) == 3
    path = folder / f"{SLUG}.latest.json"
    stale = json.loads(path.read_text())
    stale["last_run"] = [f"{13:040x}", "t13-1.02"]  # as if the last run had not been replaced
    path.write_text(json.dumps(stale))
    reread = history.read(folder, SLUG)
    assert reread is not None and reread.latest is None
    assert history.levels(reread).baseline.tests == history.levels(found).baseline.tests


def test_a_closed_segment_is_never_written_again_and_a_record_reads_a_bounded_amount(
    tmp_path: Path, suite: list[MeasuredTest], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(history, "SEGMENT", 4)
    folder = tmp_path / "h"
    main_runs(folder, suite, [1.0] * 8)
    closed = {
        p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir() if p.name.startswith(f"{SLUG}.0")
    }
    assert sorted(closed) == [f"{SLUG}.000000.jsonl", f"{SLUG}.000004.jsonl"]
    open_runs = (folder / f"{SLUG}.jsonl").read_text().splitlines()
    assert len(open_runs) == 1 and json.loads(open_runs[0])["first"] == 8  # the header alone: the segment just closed
    # The job of commit 7, the last closed segment's last run, run again: not recorded twice, and said.
    scaled_suite = scaled(suite, 1.0, HOSTS[0], random.Random(4))
    again = history.record(folder, scaled_suite, f"{7:040x}", "again")
    assert again[SLUG].runs == 8 and again[SLUG].kept == "t7"
    assert f"{SLUG}: 8 runs (this commit's run recorded at t7 is in a closed segment: kept" in again[SLUG].describe(
        SLUG
    )
    assert len((folder / f"{SLUG}.jsonl").read_text().splitlines()) == 1
    # Commits 0..2 again: older than the last closed segment, so appended as the newest runs; the closed files stay
    # as they were.
    main_runs(folder, suite, [1.0] * 3, seed=4)
    for name, (data, mtime) in closed.items():
        assert (folder / name).read_bytes() == data and (folder / name).stat().st_mtime_ns == mtime
    found = history.read(folder, SLUG)
    assert found is not None and found.count == 11 and len(found.runs) == 3


def test_a_segment_closes_at_its_size_in_bytes_before_its_runs(
    tmp_path: Path, suite: list[MeasuredTest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large suite's runs are large (20,000 tests: 200 runs passed the 256 MB a history file may hold, and the
    record refused its own file): a segment closes at SEGMENT_BYTES too, and judges as a replay of every run."""
    monkeypatch.setattr(history, "SEGMENT_BYTES", 1_200)  # the one test of `suite`: about 3 runs
    folder = tmp_path / "h"
    main_runs(folder, suite, FACTORS[:12])
    closed = _segments(folder)
    assert len(closed) >= 2
    assert all((folder / name).stat().st_size < 1_200 + 1_000 for name in closed)  # a run's line past it at most
    windowed, whole = history.read(folder, SLUG), history.read(folder, SLUG, every_run=True)
    assert windowed is not None and whole is not None and whole.count == windowed.count == 12
    assert history.levels(windowed).baseline.tests == history.levels(History(SLUG, whole.runs)).baseline.tests


def test_a_missing_segment_or_a_checkpoint_of_another_record_is_named(
    tmp_path: Path, suite: list[MeasuredTest], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(history, "SEGMENT", 3)
    folder = tmp_path / "h"
    main_runs(folder, suite, [1.0] * 7)
    (folder / f"{SLUG}.000003.jsonl").unlink()
    with pytest.raises(history.HistoryError, match=rf"the closed segments of {SLUG} hold 3 runs, the checkpoint 6"):
        history.read(folder, SLUG, every_run=True)
    assert history.read(folder, SLUG) is not None  # a report needs no closed segment
    state = folder / f"{SLUG}.state.json"
    data = json.loads(state.read_text())
    data["runs"] = 3
    state.write_text(json.dumps(data))
    with pytest.raises(history.HistoryError, match=r"its checkpoint .*state\.json holds 3: the files are of different"):
        history.read(folder, SLUG)


def test_a_version_1_history_is_read_as_its_open_segment_and_closed_by_the_next_record(
    tmp_path: Path, suite: list[MeasuredTest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A history written before segments (one file, version 1, no checkpoint) judges as before; the record that
    fills it closes it whole and writes the checkpoint, and the judgement is the same."""
    folder = tmp_path / "h"
    main_runs(folder, suite, [1.0] * 6 + [1.03] * 4)
    path = folder / f"{SLUG}.jsonl"
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header.pop("first")
    header["schema_version"] = 1
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    before = history.levels(history.read(folder, SLUG))  # type: ignore[arg-type]
    monkeypatch.setattr(history, "SEGMENT", 10)
    main_runs(folder, suite, [1.03], seed=5)  # commit 0 again: its run replaced in place, and the segment full
    assert _segments(folder) == [f"{SLUG}.000000.jsonl"]
    after = history.read(folder, SLUG)
    assert after is not None and after.count == 10 and not after.runs
    assert history.levels(after).baseline.tests.keys() == before.baseline.tests.keys()
