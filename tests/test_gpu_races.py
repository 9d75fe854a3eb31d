"""The race check on CUDA, with real copies: the two published mistakes are reported at their read lines, and the
loops that wait for their copies (an event, a query, the strategies of examples/strategies.py) are not; nothing
of the check outlives its region."""

from __future__ import annotations

import textwrap
from collections.abc import Callable

import pytest
import torch

from pytest_syncguard import SyncGuard
from pytest_syncguard.analysis.races import RaceEvent
from pytest_syncguard.probes import native
from pytest_syncguard.probes.races import RACES

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(native.NATIVE.load() is None, reason=f"native kernel unavailable: {native.NATIVE.unavailable}"),
]
STEPS = 16


def races_of(loop: Callable[[], object]) -> tuple[list[RaceEvent], int]:
    """The races of ``loop`` in a checked region, and how many copies the check watched."""
    guard = SyncGuard("races", device="cuda", needs=frozenset({"races"}))
    seen = RACES.seen
    with guard.generation(tokens=STEPS) as region:
        loop()
    assert region.measurement is not None
    assert not RACES.installed and native.NATIVE.load().race_watched() == 0
    return list(region.measurement.races), RACES.seen - seen


def line_of(function: Callable[..., object], text: str) -> int:
    import inspect

    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


def seed_article_loop() -> int:
    """The seed article's ping-pong: the flag copied on a side stream, the current stream made to wait for it on the
    device, and the flag read by the host, which never waited."""
    side = torch.cuda.Stream()
    flag = torch.zeros(1, dtype=torch.bool, pin_memory=True)
    state = torch.zeros(4096, device="cuda")
    decoded = 0
    for _ in range(STEPS):
        state = torch.sin(state) + 1
        finished = (state > 1e9).all()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            flag.copy_(finished.view(1), non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)
        decoded += 1
        if flag.item():
            break
    return decoded


def wrong_stream_loop() -> None:
    """The other write-up: ``.to("cpu", non_blocking=True)`` on a side stream, then the current stream synchronized."""
    side = torch.cuda.Stream()
    tokens = torch.zeros(8, dtype=torch.long, device="cuda")
    for _ in range(STEPS):
        tokens = tokens + 1
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            on_host = tokens.to("cpu", non_blocking=True)
        torch.cuda.current_stream().synchronize()
        assert len(on_host.tolist()) == 8


def event_loop() -> None:
    """The fix: an event recorded after the copy on its stream, synchronized before the read."""
    side = torch.cuda.Stream()
    flag = torch.zeros(1, dtype=torch.bool, pin_memory=True)
    copied = torch.cuda.Event()
    state = torch.zeros(4096, device="cuda")
    for _ in range(STEPS):
        state = torch.sin(state) + 1
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            flag.copy_((state > 1e9).all().view(1), non_blocking=True)
            copied.record(side)
        copied.synchronize()
        if flag.item():
            break


def query_and_transitive_loop() -> None:
    """Two more ways to wait: a query that returned True, and the current stream, made to wait for the copy's
    stream, synchronized by the host."""
    side = torch.cuda.Stream()
    flags = torch.zeros(2, dtype=torch.bool, pin_memory=True)
    copied = torch.cuda.Event()
    state = torch.zeros(4096, device="cuda")
    for _ in range(STEPS):
        state = torch.sin(state) + 1
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            flags[0:1].copy_((state > 1e9).all().view(1), non_blocking=True)
            copied.record(side)
            flags[1:2].copy_((state < -1).all().view(1), non_blocking=True)
        while not copied.query():
            pass
        assert not flags[0].item()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.current_stream().synchronize()
        assert not flags[1].item()


def source_write_loop() -> None:
    """A host->device copy's pinned source rewritten by the host before the copy was waited for."""
    source = torch.zeros(1024, pin_memory=True)
    target = torch.empty(1024, device="cuda")
    for step in range(STEPS):
        target.copy_(source, non_blocking=True)
        source.fill_(float(step))
    torch.cuda.synchronize()


def test_the_seed_articles_loop_is_reported_at_its_read_line() -> None:
    races, seen = races_of(seed_article_loop)
    assert seen == STEPS and len(races) == STEPS
    race = races[0]
    assert (race.direction, race.access, race.op) == ("device->host", "read", "aten::item")
    assert race.access_site is not None and race.access_site.lineno == line_of(seed_article_loop, "if flag.item():")
    assert race.copy_site is not None and race.copy_site.lineno == line_of(seed_article_loop, "flag.copy_(")
    assert race.copy_stream != race.access_stream == (torch.cuda.current_device(), 0)


def test_a_copy_read_after_synchronizing_the_wrong_stream_is_reported() -> None:
    races, seen = races_of(wrong_stream_loop)
    assert seen == STEPS and len(races) == STEPS
    assert {(r.op, r.access_site.lineno if r.access_site else 0) for r in races} == {
        ("Tensor.tolist", line_of(wrong_stream_loop, "on_host.tolist()"))
    }
    assert races[0].copy_site is not None
    assert races[0].copy_site.lineno == line_of(wrong_stream_loop, 'tokens.to("cpu", non_blocking=True)')


def test_a_host_write_of_a_copys_pinned_source_is_reported() -> None:
    races, seen = races_of(source_write_loop)
    assert seen == STEPS and races
    assert {(r.direction, r.access, r.op) for r in races} == {("host->device", "write", "aten::fill_")}


@pytest.mark.parametrize("loop", [event_loop, query_and_transitive_loop], ids=["event", "query_and_transitive"])
def test_loops_that_wait_for_their_copies_are_not_reported(loop: Callable[[], object]) -> None:
    races, seen = races_of(loop)
    assert races == [] and seen >= STEPS


@pytest.mark.parametrize("name", ["stream_pingpong", "cuda_graph"])
def test_the_strategies_that_copy_asynchronously_are_not_reported(name: str) -> None:
    pytest.importorskip("transformers")
    from examples import models
    from examples.strategies import STRATEGIES

    model = models.gpt2("cuda", tiny=True)
    prompt = torch.randint(0, model.config.vocab_size, (2, 8), device="cuda")
    strategy, tokens = STRATEGIES[name], 40  # cuda_graph copies its flag every 8 steps: both slots reused
    strategy(model, prompt, tokens, model.config.vocab_size)  # graphs captured, nothing compiled in the region
    races, seen = races_of(lambda: strategy(model, prompt, tokens, model.config.vocab_size))
    assert races == [] and seen >= 4


def test_nothing_of_the_check_outlives_a_region_that_raised() -> None:
    originals = (torch.cuda.Event.record, torch.cuda.Event.query, torch.cuda.Stream.wait_event, torch.Tensor.tolist)
    guard = SyncGuard("races", device="cuda", needs=frozenset({"races"}))
    flag = torch.zeros(1, pin_memory=True)
    with pytest.raises(KeyboardInterrupt), guard.generation(tokens=1):
        flag.copy_(torch.ones(1, device="cuda"), non_blocking=True)
        assert RACES.installed and RACES.watched == 1
        raise KeyboardInterrupt
    assert not RACES.installed and RACES.watched == 0 and native.NATIVE.load().race_watched() == 0
    assert (torch.cuda.Event.record, torch.cuda.Event.query, torch.cuda.Stream.wait_event, torch.Tensor.tolist) == (
        originals
    )
    flag.copy_(torch.ones(1, device="cuda"), non_blocking=True)
    assert RACES.watched == 0  # no region: nothing is watched


def test_under_syncguard_and_xdist_a_race_fails_its_test_with_both_sites_and_the_fix(pytester: pytest.Pytester) -> None:
    source = textwrap.dedent(
        """\
            import torch

            def test_racy(syncguard):
                side = torch.cuda.Stream()
                flag = torch.zeros(1, dtype=torch.bool, pin_memory=True)
                with syncguard.generation(tokens=4):
                    for _ in range(4):
                        finished = (torch.randn(64, device="cuda") > 10).all()
                        side.wait_stream(torch.cuda.current_stream())
                        with torch.cuda.stream(side):
                            flag.copy_(finished.view(1), non_blocking=True)
                        torch.cuda.current_stream().wait_stream(side)
                        if flag.item():
                            break

            def test_waits(syncguard):
                flag = torch.zeros(1, dtype=torch.bool, pin_memory=True)
                copied = torch.cuda.Event()
                with syncguard.generation(tokens=4):
                    for _ in range(4):
                        flag.copy_((torch.randn(64, device="cuda") > 10).all().view(1), non_blocking=True)
                        copied.record()
                        copied.synchronize()
                        assert not flag.item()
            """
    )
    pytester.makepyfile(source)
    lines = source.splitlines()
    copy_line = 1 + next(i for i, line in enumerate(lines) if "flag.copy_(finished" in line)
    read_line = 1 + next(i for i, line in enumerate(lines) if "if flag.item():" in line)
    result = pytester.runpytest("--syncguard", "-n", "2")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*no_async_races: measured 4 host accesses of memory whose non_blocking copy the host had not waited for",
            "host read of the destination of a non_blocking device->host copy the host had not waited for (4 times)",
            f"  copy   test_under_syncguard_and_xdist*.py:{copy_line} in test_racy on cuda:* stream *: flag.copy_(*",
            f"  read   test_under_syncguard_and_xdist*.py:{read_line} in test_racy by aten::item on cuda:* default "
            "stream: if flag.item():",
            "  fix: record an event after the copy*",
        ]
    )
    result.stdout.fnmatch_lines(["*::test_racy *no_async_races*FAIL", "*::test_waits *no_async_races*PASS"])
