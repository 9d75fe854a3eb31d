"""The race check's parts that run without a GPU: the stream clocks that decide when the host has waited for a
copy, the native access check on real CPU operators, the marker, and the report of a race. Races on CUDA, from
real copies, are in test_gpu_races.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pytest_syncguard.analysis.races import AsyncRace, RaceEvent, StreamClocks
from pytest_syncguard.analysis.sites import Frame
from pytest_syncguard.budgets import DEFAULT_RACE_CHECK, with_default_checks
from pytest_syncguard.codec import decode, encode
from pytest_syncguard.document.budget import Budget
from pytest_syncguard.document.file import from_record, record
from pytest_syncguard.document.measured import MeasuredTest, race_record
from pytest_syncguard.probes import native
from pytest_syncguard.render.terminal import failure_text

MAIN, SIDE, OTHER_DEVICE = (0, 0), (0, 7), (1, 0)


def test_wait_stream_orders_the_device_not_the_host() -> None:
    """The seed article's loop: a copy on a side stream, the current stream waits for it, the host reads."""
    clocks = StreamClocks()
    copy = clocks.copy(SIDE)
    clocks.record("e", SIDE)  # what wait_stream does: an event on the side stream ...
    clocks.stream_waits(MAIN, "e")  # ... that the current stream waits for, on the device
    assert not clocks.complete(SIDE, copy)
    clocks.host_waits_stream(MAIN)  # the host waits for the current stream: the copy is behind it
    assert clocks.complete(SIDE, copy)


def test_the_wrong_stream_and_an_event_before_the_copy_do_not_complete_it() -> None:
    clocks = StreamClocks()
    clocks.record("before", SIDE)
    copy = clocks.copy(SIDE)
    clocks.host_waits_stream(MAIN)
    clocks.host_waits_event("before")
    clocks.host_waits_event("never recorded")
    clocks.host_waits_device(1)
    assert not clocks.complete(SIDE, copy)
    clocks.record("after", SIDE)
    second = clocks.copy(SIDE)
    clocks.host_waits_event("after")
    assert clocks.complete(SIDE, copy) and not clocks.complete(SIDE, second)
    clocks.host_waits_device(0)
    assert clocks.complete(SIDE, second)


needs_native = pytest.mark.skipif(
    native.NATIVE.load() is None, reason=f"native kernel unavailable: {native.NATIVE.unavailable}"
)


@pytest.fixture
def watch() -> Iterator[tuple[torch.Tensor, list[tuple[int, str, bool]], object]]:
    """The native access check on a real host tensor: (tensor, the accesses it reported, the module)."""
    module = native.NATIVE.load()
    host = torch.zeros(8)
    hits: list[tuple[int, str, bool]] = []
    module.race_callback(lambda ident, op, wrote: hits.append((ident, op, wrote)))
    try:
        yield host, hits, module
    finally:
        module.race_unwatch(-1)
        module.race_callback(None)
    assert module.race_watched() == 0


@needs_native
def test_the_access_check_reports_reads_and_writes_of_watched_bytes_and_no_views(watch: tuple) -> None:
    host, hits, module = watch
    start = host.data_ptr()
    module.race_watch(1, start + 4 * 4, start + 6 * 4, True)  # elements 4 and 5, as a device->host destination
    view = host[4:6]
    host[0:4].sum()  # other bytes
    assert hits == []
    float(view[1])
    assert hits[0] == (1, "aten::item", False)
    hits.clear()
    host.add_(1)  # a write of the whole tensor
    assert (1, "aten::add_", True) in hits
    module.race_unwatch(1)
    hits.clear()
    module.race_watch(2, start, start + 32, False)  # a host->device source: only writes race
    host.sum()
    assert hits == []
    host[2] = 3.0
    torch.mul(host, 2, out=host)
    assert [(op, wrote) for _, op, wrote in hits] == [("aten::copy_", True), ("aten::mul", True)]


@needs_native
def test_the_access_check_stops_when_nothing_is_watched(watch: tuple) -> None:
    host, hits, module = watch
    module.race_watch(3, host.data_ptr(), host.data_ptr() + 32, True)
    assert module.race_watched() == 1
    module.race_unwatch(3)
    assert module.race_watched() == 0
    host.sum().item()
    assert hits == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CPU its budget is not measured; on CUDA it is")
def test_no_async_races_is_a_marker_without_arguments(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
import pytest, torch

@pytest.mark.no_async_races
def test_plain(syncguard):
    with syncguard.generation(tokens=1):
        torch.ones(1).sum().item()

@pytest.mark.no_async_races(1)
def test_with_a_limit(syncguard):
    pass

def test_unmarked(syncguard):
    with syncguard.generation(tokens=1):
        torch.ones(1).sum().item()
"""
    )
    result = pytester.runpytest("--syncguard", "-rA")
    result.assert_outcomes(passed=1, skipped=1, errors=1)  # test_plain: its one budget not measured on CPU
    result.stdout.fnmatch_lines(["*test_with_a_limit: @pytest.mark.no_async_races(): too many positional arguments"])
    # On CPU the marked test says its check was not measured; the unmarked one gets no default check.
    result.stdout.fnmatch_lines(["*::test_plain *  no_async_races  *NOT MEASURED", "*::test_unmarked *  -  *MEASURED"])


def test_the_race_check_is_on_by_default_on_cuda_only() -> None:
    marked = (Budget("no_async_races", 0.0),)
    assert with_default_checks((), on_cuda=False) == ()
    assert with_default_checks((), on_cuda=True) == (DEFAULT_RACE_CHECK,)
    assert with_default_checks(marked, on_cuda=True) == marked
    assert DEFAULT_RACE_CHECK.describe() == "no_async_races"


def _line(text: str) -> int:
    return next(n for n, line in enumerate(Path(__file__).read_text().splitlines(), 1) if line.strip() == text)


def test_a_race_is_reported_with_both_sites_the_streams_and_the_fix() -> None:
    copy_line, read_line = _line("copy = clocks.copy(SIDE)"), _line('clocks.host_waits_event("after")')
    event = RaceEvent(
        "device->host", "read", "aten::item", Frame(__file__, copy_line, "copy_side"),
        Frame(__file__, read_line, "read_flag"), (0, 7), (0, 0),
    )  # fmt: skip
    race = race_record(event)
    assert race.copy_stream == "cuda:0 stream 7" and race.access_stream == "cuda:0 default stream"
    assert (race.copy_code, race.access_code) == ("copy = clocks.copy(SIDE)", 'clocks.host_waits_event("after")')
    assert decode(AsyncRace, encode(race)) == race
    text = "\n".join(race.lines())
    assert "host read of the destination of a non_blocking device->host copy" in text
    assert f"test_races.py:{copy_line} in copy_side on cuda:0 stream 7: copy = clocks.copy(SIDE)" in text
    assert f"test_races.py:{read_line} in read_flag by aten::item on cuda:0 default stream" in text
    assert "event.synchronize()" in text
    data = json.loads(json.dumps(record(_failing_result(race))))
    restored = from_record(data)
    assert restored.races == (race,)
    shown = failure_text(restored)
    assert "no_async_races: measured 1 host accesses" in shown and "fix: record an event" in shown


def _failing_result(race: AsyncRace) -> MeasuredTest:
    from pytest_syncguard.document.budget import BudgetCheck
    from pytest_syncguard.metrics import Metrics

    check = BudgetCheck(
        DEFAULT_RACE_CHECK, 1.0, False,
        "no_async_races: measured 1 host accesses of memory whose non_blocking copy the host had not waited for",
    )  # fmt: skip
    metrics = Metrics({"syncs": 0.0, "async_races": 1.0}, {"syncs": 1, "async_races": 1})
    return MeasuredTest("t.py::test", "cuda", 4, 1, metrics, 0, {}, (), checks=(check,), races=(race,))
