"""Under torchrun every rank runs the same pytest with the same options: both wrote r.json and j.xml, the last
writer won, and one rank's results vanished without a word. Each rank now writes its own files, named by its
rank, and its results say which rank measured them. Run here on the CPU with torchrun's own launcher (two ranks,
no process group: the files are what is tested; the tensor-parallel NCCL loop of the report needs two GPUs)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_syncguard.gate.cli import main
from pytest_syncguard.ranks import Rank, current

TEST = """
import pytest
import torch


@pytest.mark.max_syncs_per_token(1)
def test_loop(syncguard):
    with syncguard.generation(tokens=4):
        x = torch.ones(4)
        for _ in range(4):
            x.sum().item()
"""


def test_a_rank_is_read_from_torchruns_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert current() is None
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert current() is None  # a launch of one: names stay as given
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert current() == Rank(1, 2)
    assert Rank(1, 2).path("out/r.json") == "out/r.rank1.json"


def test_each_rank_of_torchrun_keeps_its_own_results_and_says_its_rank(tmp_path: Path) -> None:
    (tmp_path / "test_r.py").write_text(TEST)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "pytest",
               "-q", "-p", "no:cacheprovider", "test_r.py", "--syncguard", "--syncguard-json", "r.json",
               "--junitxml", "j.xml"]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "j.xml").exists()
    launch_ids = set()
    for rank in (0, 1):
        assert (tmp_path / f"j.rank{rank}.xml").is_file()
        document = json.loads((tmp_path / f"r.rank{rank}.json").read_text())
        launch_ids.add(document["launch"].pop("launch_id"))
        assert document["launch"] == {
            "rank": rank,
            "world_size": 2,
            "finished": True,
            "in_flight": None,
            "device_slug": "cpu-x2",
        }
        assert not (tmp_path / f"r.rank{rank}.stopped.txt").exists()  # not stopped: SIGTERM put back, file gone
        (test,) = document["tests"]
        assert f"syncguard: measured by rank {rank} of 2 (torchrun: RANK, WORLD_SIZE)" in test["notes"]
        assert f"syncguard results written to r.rank{rank}.json" in done.stdout
    (launch_id,) = launch_ids  # one launch: torchrun's run id and rendezvous, shared by its ranks
    assert re.fullmatch(r"[0-9a-f-]{36}@localhost:\d+", launch_id), launch_id


def test_a_launch_of_two_nodes_is_joined_from_each_nodes_folder_and_a_missing_node_fails_the_run(
    tmp_path: Path,
) -> None:
    """``torchrun --nnodes 2`` simulated on one host: two agents, one process each, a static rendezvous on the
    loopback, a gloo all-reduce between the nodes at every step, each node in a folder of its own (as two CI jobs
    would upload them). The report joins the two nodes' documents into one verdict per test, the collectives
    counted on each node; given one node's alone, it fails naming the rank it lacks."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    agents = []
    for node in (0, 1):
        folder = tmp_path / f"node{node}"
        folder.mkdir()
        (folder / "test_tp.py").write_text(TP_TEST)
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                   "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "pytest",
                   "-q", "-p", "no:cacheprovider", "test_tp.py::test_tp", "--syncguard", "--syncguard-json", "r.json"]  # fmt: skip
        agents.append(
            subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    for agent in agents:
        out, _ = agent.communicate(timeout=300)
        assert agent.returncode == 0, out[-3000:]
    files = [str(tmp_path / f"node{node}" / f"r.rank{node}.json") for node in (0, 1)]
    assert {json.loads(Path(f).read_text())["launch"]["rank"] for f in files} == {0, 1}
    joined = tmp_path / "joined.json"
    assert main(["report", *files, "--json", str(joined), "--fail-on-regression"]) == 0
    (test,) = json.loads(joined.read_text())["tests"]
    assert test["device"] == "cpu-x2" and test["outcome"] == "passed" and test["nodeid"] == "test_tp.py::test_tp"
    assert test["metrics"]["syncs_per_token"] == 1 and test["metrics"]["collectives_per_token"] == 1
    alone = tmp_path / "alone.md"
    assert main(["report", files[0], "--markdown", str(alone), "--fail-on-regression"]) == 1
    assert "- rank 1 of 2: missing: `rank 1 of 2 left no results file" in alone.read_text()


@pytest.mark.parametrize(
    ("rank", "world", "said"),
    [
        (None, "2", "WORLD_SIZE=2 with no RANK"),
        ("abc", "2", "WORLD_SIZE=2 with RANK='abc'"),
        ("2", "2", "WORLD_SIZE=2 with RANK='2'"),
        ("-1", "2", "WORLD_SIZE=2 with RANK='-1'"),
        ("0", "two", "WORLD_SIZE='two' is not a number of processes"),
    ],
)
def test_a_launch_without_a_usable_rank_names_both_variables(
    monkeypatch: pytest.MonkeyPatch, rank: str | None, world: str, said: str
) -> None:
    monkeypatch.setenv("WORLD_SIZE", world)
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    with pytest.raises(ValueError, match=said):
        current()


def test_such_a_launch_is_a_usage_error_not_one_shared_file(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each rank would write r.json (the last writer wins): the run stops before any test, naming the variables."""
    pytester.makepyfile(test_r=TEST)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "abc")
    done = pytester.runpytest_subprocess("--syncguard", "--syncguard-json", "r.json")
    assert done.ret == pytest.ExitCode.USAGE_ERROR
    assert "syncguard: WORLD_SIZE=2 with RANK='abc'" in done.stderr.str()
    assert not (pytester.path / "r.json").exists()


TP_TEST = """
import os
import signal

import pytest
import torch
import torch.distributed as dist


@pytest.fixture(scope="module")
def group():
    dist.init_process_group("gloo")
    yield
    dist.destroy_process_group()


def decode(steps, die_at=None):
    x = torch.ones(8)
    for step in range(steps):
        if step == die_at and dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        x = x * 0.5
        dist.all_reduce(x)  # a tensor-parallel layer's reduction
        if x.sum().item() < 0:  # the loop's stop check: one sync per step
            break


@pytest.mark.max_syncs_per_token(1)
@pytest.mark.max_collectives_per_token(1)
def test_tp(syncguard, group):
    with syncguard.generation(tokens=4):
        decode(4)


@pytest.mark.max_syncs_per_token(1)
def test_dies(syncguard, group):
    with syncguard.generation(tokens=4):
        decode(4, die_at=2 if os.environ.get("KILL_RANK1") else None)
"""


def _torchrun(folder: Path, *, kill: bool) -> subprocess.CompletedProcess[str]:
    (folder / "test_tp.py").write_text(TP_TEST)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "pytest",
               "-q", "-p", "no:cacheprovider", "test_tp.py", "--syncguard", "--syncguard-json", "r.json"]  # fmt: skip
    env = {**os.environ, "KILL_RANK1": "1" if kill else ""}
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=300, env=env)


def test_the_report_judges_a_launch_as_one_run_and_names_the_rank_killed_mid_test(tmp_path: Path) -> None:
    """Two gloo ranks under torchrun's own launcher; rank 1 kills itself (SIGKILL) inside the second test's region.
    Rank 0's all-reduce fails or waits, and torchrun stops it (SIGTERM). Each rank's document was written as it went:
    the report joins them, one entry per test with its ranks, and the killed test fails naming rank 1 as killed, rank
    0 as stopped by its launcher (where it was) or failed in the collective, whichever came first there."""
    done = _torchrun(tmp_path, kill=True)
    assert done.returncode != 0
    killed = json.loads((tmp_path / "r.rank1.json").read_text())
    assert killed["launch"].pop("launch_id")
    assert killed["launch"] == {
        "rank": 1,
        "world_size": 2,
        "finished": False,
        "in_flight": "test_tp.py::test_dies",
        "device_slug": "cpu-x2",
    }
    assert [t["nodeid"] for t in killed["tests"]] == ["test_tp.py::test_tp"]
    assert (tmp_path / "r.rank1.stopped.txt").read_text() == ""  # SIGKILL: no stack
    files = [str(tmp_path / f"r.rank{r}.json") for r in (0, 1)]
    out = tmp_path / "report.json"
    status = main(["report", *files, "--json", str(out), "--markdown", str(tmp_path / "c.md"), "--fail-on-regression"])
    assert status == 1
    tests = {t["nodeid"]: t for t in json.loads(out.read_text())["tests"]}
    assert tests["test_tp.py::test_tp"]["outcome"] == "passed"
    assert tests["test_tp.py::test_tp"]["device"] == "cpu-x2"
    assert tests["test_tp.py::test_tp"]["metrics"]["syncs_per_token"] == 1
    # The all-reduce is a collective, counted by the collective probe at its call site, and no sync.
    assert tests["test_tp.py::test_tp"]["metrics"]["collectives_per_token"] == 1
    (tp,) = [t for t in killed["tests"] if t["nodeid"] == "test_tp.py::test_tp"]
    line = TP_TEST.splitlines().index("        dist.all_reduce(x)  # a tensor-parallel layer's reduction") + 1
    assert tp["counted_top"]["collectives"] == [[f"all_reduce at test_tp.py:{line} in decode", 4]]
    assert tests["test_tp.py::test_dies"]["outcome"] == "error"
    comment = (tmp_path / "c.md").read_text()
    assert "1 of 2 tests failed: 1 failed in the run" in comment
    assert "- rank 1 of 2: missing: `rank 1 of 2 died during this test (no stop signal: killed or crashed)" in comment
    rank0 = next(line for line in comment.splitlines() if line.startswith("  - rank 0 of 2: "))
    assert "was stopped during this test by its launcher (SIGTERM" in rank0 or rank0.startswith(
        "  - rank 0 of 2: failed"
    )


def test_updating_baselines_from_a_rank_is_a_usage_error_naming_the_joined_way(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every rank would write its own numbers into one baseline file: the run stops before any test."""
    pytester.makepyfile(test_r=TEST)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    done = pytester.runpytest_subprocess("--syncguard", "--syncguard-update-baselines")
    assert done.ret == pytest.ExitCode.USAGE_ERROR
    assert "this process is rank 1 of 2" in done.stderr.str()
    assert "syncguard baselines DIR --record RESULTS.rank*.json" in done.stderr.str()


def test_a_shard_of_a_split_suite_that_left_no_file_fails_the_report_by_name(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three CI jobs each run a shard of the suite and upload its results file; the report given the files of shards
    1 and 3 fails naming shard 2, and passes once it is there. The shard is --syncguard-shard K/N or
    SYNCGUARD_SHARD; a value that is no shard is a usage error naming where it came from."""
    pytester.makepyfile(test_s=TEST)
    for shard in (1, 2, 3):
        if shard == 3:
            monkeypatch.setenv("SYNCGUARD_SHARD", "3/3")
            given: tuple[str, ...] = ()
        else:
            given = ("--syncguard-shard", f"{shard}/3")
        done = pytester.runpytest_inprocess(
            "--syncguard", "--syncguard-json", f"r{shard}.json", "-p", "no:cacheprovider", *given
        )
        done.assert_outcomes(passed=1)
        assert json.loads((pytester.path / f"r{shard}.json").read_text())["shard"] == {"index": shard, "count": 3}
    files = [str(pytester.path / f"r{shard}.json") for shard in (1, 3)]
    comment = pytester.path / "c.md"
    (pytester.path / "baselines").mkdir()
    assert main(["report", *files, "--baselines", "baselines", "--markdown", str(comment), "--fail-on-regression"]) == 1
    text = comment.read_text()
    assert "`shard 2 of 3` | `cpu` | error" in text or "shard 2 of 3 left no results file" in text
    new = text[text.index("**New tests**") :].split("\n\n")[1]
    assert "test_" in new and "shard 2 of 3" not in new  # a shard that left nothing is no new test
    every = [*files, str(pytester.path / "r2.json")]
    assert main(["report", *every, "--fail-on-regression"]) == 0
    monkeypatch.setenv("SYNCGUARD_SHARD", "4/3")
    done = pytester.runpytest_inprocess("--syncguard", "-p", "no:cacheprovider")
    assert (
        done.ret == pytest.ExitCode.USAGE_ERROR
        and "SYNCGUARD_SHARD '4/3': shard 4 of 3 is no shard" in done.stderr.str()
    )
    monkeypatch.delenv("SYNCGUARD_SHARD")
    done = pytester.runpytest_inprocess("--syncguard", "--syncguard-shard", "two", "-p", "no:cacheprovider")
    assert (
        done.ret == pytest.ExitCode.USAGE_ERROR
        and "--syncguard-shard 'two': give the shard as K/N" in done.stderr.str()
    )
