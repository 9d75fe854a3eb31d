"""xdist workers on a CPU: each takes its share of the cores for torch's threads, says so, and gives them back.

Before, each worker ran torch with all the cores' threads: on the 2-core CI machine a 20-token CPU loop's timed
region took 1.4-5.4 s under ``-n 2`` against about 20 ms serially, and nothing said why."""

from __future__ import annotations

import json

import pytest

from pytest_syncguard.environment import available_cores

pytest.importorskip("xdist")

LOOP = """
import json
import pytest
import torch


@pytest.mark.max_syncs_per_token(1)
def test_loop_{n}(syncguard):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(256, {width}), torch.nn.Linear({width}, {width}))
    tokens = torch.randint(0, 256, ({batch}, 16))
    with torch.inference_mode():
        region = syncguard.measure(lambda: [model(tokens[:, -1:]) for _ in range(20)], tokens=20, repeat={repeat})
    with open("threads-{n}.json", "w") as out:  # in the rootdir, the workers' working directory
        out.write(json.dumps({{"threads": torch.get_num_threads(), "seconds": [t.seconds for t in region.timings]}}))
"""


def test_each_worker_takes_its_share_of_the_cores_and_says_so(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    if available_cores() < 2:
        pytest.skip("one core: two workers of one thread each cannot oversubscribe it")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # tests/conftest.py sets it for the suite's own runs
    pytester.makepyfile(**{f"test_loop_{n}": LOOP.format(n=n, width=256, batch=8, repeat=3) for n in range(2)})
    result = pytester.runpytest("-n", "2", "--syncguard", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    share = max(1, available_cores() // 2)
    for n in range(2):
        found = json.loads((pytester.path / f"threads-{n}.json").read_text())
        assert found["threads"] == share
    result.stdout.fnmatch_lines([f"*xdist worker gw*: torch's intra-op threads * -> {share}, its share of*"])


def test_a_thread_count_the_user_set_is_left_alone(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    pytester.makepyfile(**{f"test_loop_{n}": LOOP.format(n=n, width=256, batch=8, repeat=3) for n in range(2)})
    result = pytester.runpytest("-n", "2", "--syncguard", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    for n in range(2):
        assert json.loads((pytester.path / f"threads-{n}.json").read_text())["threads"] == 2
    result.stdout.no_fnmatch_line("*intra-op threads*")


def test_only_a_whole_number_of_threads_is_a_thread_setting() -> None:
    from pytest_syncguard.environment import _threads

    assert [_threads(v) for v in ("1", " 8 ", "0", "-1", "abc", "1.5", "")] == [True, True] + [False] * 5


def test_a_thread_setting_that_is_no_number_of_threads_is_named_not_obeyed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OMP_NUM_THREADS=abc chooses nothing: the workers share the cores as without it, and say that the setting
    was ignored."""
    monkeypatch.setenv("OMP_NUM_THREADS", "abc")
    pytester.makepyfile(**{f"test_loop_{n}": LOOP.format(n=n, width=64, batch=2, repeat=1) for n in range(2)})
    result = pytester.runpytest("-n", "2", "--syncguard", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    share = max(1, available_cores() // 2)
    for n in range(2):
        assert json.loads((pytester.path / f"threads-{n}.json").read_text())["threads"] <= share
    result.stdout.fnmatch_lines(["*xdist worker gw*: torch's intra-op threads *OMP_NUM_THREADS='abc' is not a "
                                 "number of threads (1 or more): ignored*"])  # fmt: skip
