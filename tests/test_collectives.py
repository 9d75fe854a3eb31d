"""Collective waits across the ranks of a launch, on the documents of a real tensor-parallel run: the example
(examples/test_tensor_parallel.py) under torchrun on two H200s (NCCL 2.28, torch 2.11), made by
devtools/tp_evidence.sh: unchanged, with rank 1 spinning GPU work before its second layer in each step (a nominal
200 us, calibrated then on an idle GPU: about 250 us under the matmuls' load, which lowers the clock the spin
counts), and with rank 1 killed mid-test. The rank documents are the plugin's own output, gzipped (each test's collectives then a field of
their own, moved under ``records`` since, as a signal's record is kept); the baseline is the recorded run's."""

from __future__ import annotations

import gzip
import shutil
import statistics
from pathlib import Path

import pytest

from pytest_syncguard.analysis.collectives import DURATIONS, STARTS, Collectives, CollectiveWaits, match
from pytest_syncguard.document import file as results_file
from pytest_syncguard.document.measured import MeasuredTest
from pytest_syncguard.gate.cli import main

DATA = Path(__file__).parent / "data" / "h200x2_tp"
PLANTED_US = 200.0
SITE = "all_reduce at /work/main/examples/test_tensor_parallel.py:73 in ShardedMLP.forward"


def _documents(tmp_path: Path, run: str) -> list[Path]:
    paths = []
    for rank in (0, 1):
        path = tmp_path / run / f"r.rank{rank}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(gzip.decompress((DATA / f"{run}.rank{rank}.json.gz").read_bytes()))
        paths.append(path)
    return paths


def _joined(tmp_path: Path, run: str) -> MeasuredTest:
    (test,) = results_file.read_all(_documents(tmp_path, run))
    return test


def _waits(test: MeasuredTest) -> CollectiveWaits:
    waits = test.joined["collectives"]
    assert isinstance(waits, CollectiveWaits), waits
    return waits


def test_each_ranks_collectives_are_its_calls_and_kernels_paired_one_to_one(tmp_path: Path) -> None:
    """4 layers x 32 steps: each rank called 128 all-reduces at the layer's line and launched 128 NCCL kernels."""
    for path in _documents(tmp_path, "unchanged"):
        (test,) = results_file.read(path)
        assert test.metrics.values["collectives"] == 128 and test.metrics.values["collectives_per_token"] == 4
        collectives = test.records["collectives"]
        assert isinstance(collectives, Collectives) and collectives.tokens == 32
        assert len(collectives.kernels) == 128 and collectives.calls == (SITE,) * 128
        assert all(start < end for start, end in collectives.kernels)


def _gaps(test: MeasuredTest) -> list[float]:
    """Per collective of a step, the median gap on the rank's own clock from the previous collective's end to its
    start (its own compute before it)."""
    kernels = test.records["collectives"].kernels
    gaps = [[start - kernels[i - 1][1] for i, (start, _) in enumerate(kernels) if i and i % 4 == p] for p in range(4)]
    return [statistics.median(g) for g in gaps]


def test_the_planted_straggler_is_named_and_the_other_ranks_wait_is_the_spins_length(tmp_path: Path) -> None:
    """The spin's length on rank 1's own clock (its compute before the second collective of a step, less that before
    the third) is the ground truth; rank 0's wait there, from the start skew across the two traces, agrees within
    10%."""
    waits = _waits(_joined(tmp_path, "straggler"))
    assert waits.straggler == 1
    assert waits.matched == 128 and waits.per_step == 4 and waits.clock == STARTS
    assert waits.worst == 1 and waits.worst_last == 1 and waits.worst_site == SITE  # each step's second all-reduce
    assert waits.worst_times >= 30 and waits.wait_us[1] == 0
    rank1 = results_file.read(_documents(tmp_path, "straggler")[1])[0]
    gaps = _gaps(rank1)
    spin = gaps[1] - gaps[2]
    assert 220 <= spin <= 280  # a nominal 200 us, counted in cycles of a clock lowered by the load
    assert waits.worst_wait_us == pytest.approx(spin, rel=0.1)


def test_the_waits_from_the_kernels_starts_agree_with_those_from_their_durations(tmp_path: Path) -> None:
    """Two ways to the same split: the start skew on the shared clock, and the durations alone (the last rank's
    kernel is the transfer). They agree on the straggler, and on each wait within 10% or 20 us: the ranks' kernels of
    one all-reduce end up to some 15 us apart, which the durations count as wait and the starts do not."""
    for run in ("straggler", "unchanged"):
        tests = [results_file.read(path)[0] for path in _documents(tmp_path, run)]
        ranks = {rank: test.records["collectives"] for rank, test in enumerate(tests)}
        by_starts, by_durations = match(ranks, STARTS), match(ranks, DURATIONS)
        assert isinstance(by_starts, CollectiveWaits) and isinstance(by_durations, CollectiveWaits)
        assert by_starts.straggler == by_durations.straggler
        for started, lasted in zip(by_starts.wait_us, by_durations.wait_us, strict=True):
            assert abs(lasted - started) <= max(0.1 * started, 20.0), (run, by_starts, by_durations)


def test_the_straggler_run_regresses_against_the_x2_baseline_and_its_chain_names_the_straggler(tmp_path: Path) -> None:
    baselines = tmp_path / "baselines"
    baselines.mkdir()
    shutil.copy(DATA / "baseline.json", baselines / "nvidia-h200-x2.json")
    comment = tmp_path / "c.md"
    status = main(["report", *map(str, _documents(tmp_path, "straggler")), "--baselines", str(baselines),
                   "--markdown", str(comment), "--fail-on-regression"])  # fmt: skip
    text = comment.read_text()
    assert status == 1 and "1 of 1 test failed: 1 regressed against the baseline" in text
    assert "`launches` 864 → 896" in text  # rank 1's spin kernel, one a step: named from rank 1's kernels
    assert "**what changed:** kernels: `at::cuda::(anonymous namespace)::spin_kernel(long)` 0 → 32" in text
    assert "**collective waits:** rank 1 is the straggler: the other ranks waited 368 µs per token for it" in text
    assert f"longest wait at collective 2 of 4 in a step `{SITE}`: 265 µs (median), rank 1 arriving last in 31" in text
    assert "longest wait of a rank 202 → 368 µs per token against the baseline (+166 µs, not judged" in text
    assert main(["report", *map(str, _documents(tmp_path, "unchanged")), "--baselines", str(baselines),
                 "--fail-on-regression"]) == 0  # fmt: skip


def test_a_rank_killed_mid_test_fails_it_named_and_the_stopped_rank_says_where_it_waited(tmp_path: Path) -> None:
    paths = _documents(tmp_path, "killed")
    stopped = gzip.decompress((DATA / "killed.rank0.stopped.txt.gz").read_bytes())
    (paths[0].parent / "r.rank0.stopped.txt").write_bytes(stopped)
    (test,) = results_file.read_all(paths)
    assert test.verdict == "error"
    rank0, rank1 = test.ranks
    assert rank1.verdict == "missing" and rank1.said[0].startswith("rank 1 of 2 died during this test (no stop")
    assert rank0.said[0].startswith("rank 0 of 2 was stopped during this test by its launcher (SIGTERM")
    assert rank0.said[0].endswith("at /work/main/examples/test_tensor_parallel.py:96 in decode")


@pytest.mark.parametrize("damage", ["tokens", "kernel", "joined-wait"])
def test_collective_values_no_run_can_have_are_refused_naming_the_file(tmp_path: Path, damage: str) -> None:
    """A negative token count, a kernel that ends before it starts, a joined wait below zero: the file is refused
    by name (never a traceback, never rendered as measured)."""
    import json

    path, other = _documents(tmp_path, "unchanged")
    data = json.loads(path.read_text())
    record = data["tests"][0]
    if damage == "tokens":
        record["records"]["collectives"]["tokens"] = -32
    elif damage == "kernel":
        record["records"]["collectives"]["kernels"][0] = [10.0, 5.0]
    else:
        record["joined"] = {"collectives": {"matched": 4, "clock": STARTS, "wait_us": [-3435.0, 0.0],
                                            "transfer_us": [1.0, 1.0], "ranks": [0, 1]}}  # fmt: skip
    path.write_text(json.dumps(data))
    with pytest.raises(results_file.ResultsError, match=f"{path}: tests\\[0\\]\\.(records|joined)\\.collectives: "):
        results_file.read_all([path, other])
    assert main(["report", str(path), str(other)]) == 2


def _timed_ranks(steps: int, per_step: int, late: dict[int, float], host_late: dict[int, float]) -> dict[int, object]:
    """Two ranks' timed regions as the flight recorder gives them: each collective lasts ``TRANSFER`` us on the rank
    that arrives last and that plus the wait on the other; ``late`` says how late rank 1's GPU is at a collective
    of a step (by position), ``host_late`` how late its host enqueues it."""
    from pytest_syncguard.analysis.collectives import TimedCollective, TimedRegion

    transfer = 12.0
    ranks = {}
    for rank in (0, 1):
        found = []
        for step in range(steps):
            for position in range(per_step):
                seq = step * per_step + position + 1
                wait = late.get(position, 0.0) if rank == 0 else 0.0
                enqueued = step * 1000.0 + position * 50.0 + (host_late.get(position, 0.0) if rank == 1 else 0.0)
                found.append(TimedCollective("0", seq, enqueued, transfer + wait + 0.1 * (seq % 3)))
        region = TimedRegion(steps, tuple(found), host="node-a")
        calls = tuple(f"all_reduce at tp.py:{10 + p} in forward" for p in range(per_step))
        ranks[rank] = Collectives(steps, calls, (), 0, (region,))
    return ranks


def test_the_timed_runs_collectives_are_matched_by_sequence_number_and_split_by_their_device_times() -> None:
    """A GPU late by 100 us at the second collective of each step: rank 0 waits that per token, named at that
    collective's site; its host enqueued on time, so the wait is its GPU's. The waits come from the timed runs even
    where a traced run's kernels are there too."""
    from pytest_syncguard.analysis.collectives import FLIGHT_RECORDER

    ranks = _timed_ranks(steps=16, per_step=4, late={1: 100.0}, host_late={})
    traced = {r: Collectives(16, c.calls, tuple((i * 10.0, i * 10.0 + 5) for i in range(64)), 0, c.timed)
              for r, c in ranks.items()}  # fmt: skip
    waits = match(traced)
    assert isinstance(waits, CollectiveWaits) and waits.clock == FLIGHT_RECORDER
    assert waits.matched == 64 and waits.per_step == 4 and waits.straggler == 1
    assert waits.late_us == pytest.approx(100.0, abs=0.5) and waits.wait_us[1] == pytest.approx(0.0, abs=0.5)
    assert waits.worst == 1 and waits.worst_site == "all_reduce at tp.py:11 in forward" and waits.worst_last == 1
    assert waits.host_late_us == pytest.approx(0.0)
    # The traced kernels only where it is asked (or where no rank has timed runs).
    assert match(traced, clock=STARTS).clock == STARTS  # type: ignore[union-attr]


def test_a_wait_under_half_the_transfers_time_names_no_straggler() -> None:
    """Ranks doing the same work arrive apart by some share of the transfers' time (two H200s: 16-33%): below half
    of it no straggler is named, and the line says why."""
    from pytest_syncguard.render.chain import collective_lines

    waits = match(_timed_ranks(steps=8, per_step=2, late={0: 5.0}, host_late={}))
    assert isinstance(waits, CollectiveWaits) and waits.straggler is None and waits.late_us == pytest.approx(5.0, 0.1)
    text = "".join(str(part) for line in collective_lines(waits) for part in line)
    assert "no straggler" in text and "half the transfers' time" in text
    assert match(_timed_ranks(steps=8, per_step=2, late={0: 13.0}, host_late={})).straggler == 1  # type: ignore[union-attr]


def test_collectives_missing_on_a_rank_or_untimed_are_left_out_and_said() -> None:
    """A collective one rank's recorder no longer held, or did not time, is not matched; the waits say so."""
    from dataclasses import replace

    ranks = _timed_ranks(steps=4, per_step=2, late={}, host_late={})
    one = ranks[1]
    region = one.timed[0]  # type: ignore[attr-defined]
    ranks[1] = replace(one, timed=(replace(region, collectives=region.collectives[1:], untimed=1, lost=True),))
    waits = match(ranks)  # type: ignore[arg-type]
    assert isinstance(waits, CollectiveWaits) and waits.matched == 7 and waits.per_step == 0
    assert any("rank 1: 1" in said for said in waits.said) and any(
        "TORCH_NCCL_TRACE_BUFFER_SIZE" in s for s in waits.said
    )
    assert waits.straggler is None


def test_a_symmetric_loop_names_no_straggler() -> None:
    waits = match(_timed_ranks(steps=32, per_step=8, late={}, host_late={}))
    assert isinstance(waits, CollectiveWaits) and waits.straggler is None and waits.host_late_us is None
    assert max(waits.wait_us) < 1.0


def test_a_record_written_before_the_timed_runs_reads_with_none() -> None:
    from pytest_syncguard import codec

    old = {"tokens": 4, "calls": ["all_reduce"], "kernels": [[0.0, 1.0]], "more": 0}
    record = codec.decode(Collectives, old)
    assert record.timed == () and codec.decode(Collectives, codec.encode(record)) == record
    timed = _timed_ranks(steps=2, per_step=1, late={}, host_late={})[0]
    assert codec.decode(Collectives, codec.encode(timed)) == timed


def test_the_plugin_turns_the_recorders_timing_on_for_the_run_and_back_off_after(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under --syncguard, process groups made by a test time their collectives (unless the user said otherwise,
    which is kept); after the run the variables are as they were."""
    import os

    from pytest_syncguard.environment import TIMING_VARIABLE, TRACE_VARIABLE

    monkeypatch.delenv(TIMING_VARIABLE, raising=False)
    monkeypatch.setenv(TRACE_VARIABLE, "64")
    pytester.makepyfile(
        test_env="""
        import os

        def test_sees():
            assert os.environ["TORCH_NCCL_ENABLE_TIMING"] == "1"
            assert os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "64"
        """
    )
    pytester.runpytest_inprocess("--syncguard", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert TIMING_VARIABLE not in os.environ and os.environ[TRACE_VARIABLE] == "64"
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(failed=1)  # not without --syncguard


RECORDER = Path(__file__).parent / "data" / "h200x2_tp_recorder"


@pytest.mark.parametrize("run", ["straggler", "every"])
def test_the_recorders_waits_of_a_real_launch_name_the_planted_straggler_with_the_planted_time(
    tmp_path: Path, run: str
) -> None:
    """The example under torchrun on two H200s (GPU-ff3b5238, GPU-f7ffc511; torch 2.11, NCCL 2.28) with the flight
    recorder's timing, its two tests (``measure()`` and a ``generation()`` region): rank 1 spinning a calibrated
    200 us before its second layer (``straggler``) or before every layer (``every``,
    ``SYNCGUARD_PLANT_STRAGGLER_LAYERS=all``). The documents are the plugin's own, gzipped."""
    from pytest_syncguard.analysis.collectives import FLIGHT_RECORDER

    paths = []
    for rank in (0, 1):
        path = tmp_path / f"r.rank{rank}.json"
        path.write_bytes(gzip.decompress((RECORDER / f"{run}.rank{rank}.json.gz").read_bytes()))
        paths.append(path)
    tests = {t.nodeid.rsplit("::", 1)[1]: t for t in results_file.read_all(paths)}
    assert set(tests) == {"test_tp_decode", "test_tp_decode_in_a_region"}
    for name, test in tests.items():
        waits = _waits(test)
        assert waits.clock == FLIGHT_RECORDER and waits.straggler == 1 and waits.per_step == 4, (name, waits)
        assert waits.matched == (640 if name == "test_tp_decode" else 128), (name, waits)
        if run == "straggler":
            assert waits.worst == 1 and 170 <= waits.worst_wait_us <= 250, (name, waits)
        else:  # 4 collectives a step, each late by the spin: within 15% of 800 us per token
            assert 0.85 * 800 <= waits.late_us <= 1.15 * 800, (name, waits)
        assert max(waits.wait_us) + max(waits.transfer_us) < 1e6 / test.metrics.values["tokens_per_second"], (
            name,
            waits,
        )
