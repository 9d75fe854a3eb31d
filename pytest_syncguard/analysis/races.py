"""Asynchronous-copy races, as data: which non_blocking copies between host and device memory the host has waited
for (stream clocks), and a host access made before that wait (a race). Pure data, no torch.

A non_blocking copy is queued on a stream and the call returns at once. The host may touch the copy's host memory
(read a device-to-host destination, write a host-to-device source) only after it has waited for the copy: by
synchronizing the copy's stream, the device, or an event ordered after the copy, or by a query of one of these that
returned True, or by a blocking operation that synchronized such a stream. Ordering two streams on the device
(``wait_stream``, ``wait_event``) orders their work, never the host.

What "ordered after" means is kept as vector clocks (:class:`StreamClocks`): each stream counts the copies queued
on it, an event records its stream's clock, a stream that waits for an event takes the event's clock in, and the
host's clock takes in what it waited for. A copy is complete for the host once the host's clock has reached it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from .sites import Frame

#: A stream, as the race probe names it: (device index, stream id).
StreamKey = tuple[int, int]
Clock = dict[StreamKey, int]


def _merge(into: Clock, other: Mapping[StreamKey, int]) -> None:
    for stream, seen in other.items():
        if seen > into.get(stream, 0):
            into[stream] = seen


class StreamClocks:
    """What each stream, each recorded event and the host have waited for, in copies per stream. Events are keyed
    by themselves: the clocks keep them alive (a region's worth), so that an id is never reused."""

    def __init__(self) -> None:
        self._streams: dict[StreamKey, Clock] = {}
        self._events: dict[Hashable, Clock] = {}
        self._host: Clock = {}

    def _of(self, stream: StreamKey) -> Clock:
        return self._streams.setdefault(stream, {})

    def copy(self, stream: StreamKey) -> int:
        """A copy queued on ``stream``: its number there (complete once the host's clock reaches it)."""
        clock = self._of(stream)
        clock[stream] = clock.get(stream, 0) + 1
        return clock[stream]

    def record(self, event: Hashable, stream: StreamKey) -> None:
        """``event`` recorded on ``stream``: it completes after what the stream has queued or waited for so far."""
        self._events[event] = dict(self._of(stream))

    def stream_waits(self, stream: StreamKey, event: Hashable) -> None:
        """``stream`` waits for ``event`` on the device (``wait_event``, ``wait_stream``)."""
        _merge(self._of(stream), self._events.get(event, {}))

    def host_waits_event(self, event: Hashable) -> None:
        """The host waited for ``event`` (synchronize, or a query that returned True)."""
        _merge(self._host, self._events.get(event, {}))

    def host_waits_stream(self, stream: StreamKey) -> None:
        """The host waited for everything queued on ``stream`` so far."""
        _merge(self._host, self._of(stream))

    def host_waits_device(self, device: int | None = None) -> None:
        """The host waited for every stream of ``device`` (None: of every device)."""
        for stream, clock in self._streams.items():
            if device is None or stream[0] == device:
                _merge(self._host, clock)

    def complete(self, stream: StreamKey, number: int) -> bool:
        """Whether the host has waited for copy ``number`` of ``stream``."""
        return self._host.get(stream, 0) >= number


def stream_name(stream: StreamKey) -> str:
    """A stream in words: ``cuda:0 stream 3`` (``default stream`` for id 0)."""
    device, ident = stream
    return f"cuda:{device} {'default stream' if ident == 0 else f'stream {ident}'}"


class RaceEvent(NamedTuple):
    """A race as the probe records it: what was accessed how, by what, from where, on which streams."""

    direction: str
    access: str
    op: str
    copy_site: Frame | None
    access_site: Frame | None
    copy_stream: StreamKey
    access_stream: StreamKey


@dataclass(frozen=True)
class AsyncRace:
    """A host access of memory whose non_blocking copy the host had not waited for, as reports show it."""

    direction: str
    """``device->host`` (the access read or wrote the copy's destination) or ``host->device`` (it wrote the
    copy's source)."""
    access: str
    """``read`` or ``write``."""
    op: str
    """What accessed the memory: an operator (``aten::item``) or a Tensor method (``Tensor.tolist``)."""
    copy_site: str
    """``file:line in function`` of the copy ("?" when no frame outside torch and the plugin made it)."""
    access_site: str
    copy_stream: str
    access_stream: str
    copy_code: str = ""
    access_code: str = ""

    def lines(self) -> list[str]:
        """The race in words: both sites with their source lines, the streams, and the fix."""
        host = "destination" if self.direction == "device->host" else "source"
        return [
            f"host {self.access} of the {host} of a non_blocking {self.direction} copy the host had not waited for",
            f"  copy   {self.copy_site} on {self.copy_stream}" + (f": {self.copy_code}" if self.copy_code else ""),
            f"  {self.access:<6} {self.access_site} by {self.op} on {self.access_stream}"
            + (f": {self.access_code}" if self.access_code else ""),
            "  fix: record an event after the copy on its stream (event.record(stream)) and call event.synchronize(), "
            "or read once event.query() has returned True, before the host touches this memory; wait_stream and "
            "wait_event order streams on the device, not the host",
        ]


def race_lines(races: Iterable[AsyncRace], shown: int = 5) -> list[str]:
    """The races in words, the same race (a loop's every step) once with its count; the first ``shown`` of them."""
    counts: dict[AsyncRace, int] = {}
    for race in races:
        counts[race] = counts.get(race, 0) + 1
    lines = []
    for race, count in list(counts.items())[:shown]:
        first, *rest = race.lines()
        lines += [first + (f" ({count} times)" if count > 1 else ""), *rest]
    if len(counts) > shown:
        lines.append(f"  ... and {len(counts) - shown} more")
    return lines
