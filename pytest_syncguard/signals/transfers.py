"""The transfers signal: bytes moved between host and device memory in a region, by torch or any other library in
the process (CuPy, an extension, the driver API), each a memcpy call counted at the CUDA API with its direction,
size and Python call site by the CUDA-call probe (:mod:`..probes.cuda_calls`), on every timeline source. The
device's own records of the same copies are the timeline's ``copies_*`` and ``copy_bytes_*`` (a traced run's):
the tests hold the two to agree. A CUDA graph's copy nodes make no call and are not transfers (the timeline counts
them with the graph's kernels)."""

from __future__ import annotations

from .base import CounterSpec, Limit, Measured, Signal

DIRECTIONS = {"h2d": "host-to-device", "d2h": "device-to-host"}
#: What a region whose memcpy calls could not be watched says of these counters.
UNCOUNTED = "transfers are counted at the CUDA API, whose callbacks this region could not have"


def _bytes(way: str) -> CounterSpec:
    suffix = f"_{way}" if way else ""
    words = DIRECTIONS[way] if way else "between host and device"

    def sentence(budget: Limit, value: float, m: Measured, example: int) -> str:
        return (
            f"{budget.marker}: limit {budget.limit:g} B per token, measured {value:.1f} B: "
            f"{m.count(f'transfer_bytes{suffix}')} B {words} in {m.count(f'transfers{suffix}')} transfers over "
            f"{m.tokens} tokens"
        )

    return CounterSpec(
        f"transfer_bytes{suffix}",
        f"bytes transferred {words} (memcpy calls of any library)",
        per_token=True,
        unit="B",
        explained_by=f"transfers{suffix}",
        counted_runs=True,
        budget=f"max_transfer_bytes{suffix}_per_token",
        sentence=sentence,
    )


def _calls(way: str) -> CounterSpec:
    suffix = f"_{way}" if way else ""
    words = DIRECTIONS[way] if way else "host-device"
    return CounterSpec(
        f"transfers{suffix}",
        f"{words} transfers (memcpy calls of any library, at the CUDA API)",
        items="transfers (call site, CUDA function, direction and size)",
        counted_runs=True,
    )


SIGNAL = Signal(
    "transfers",
    counters=(_calls(""), _bytes(""), _calls("h2d"), _bytes("h2d"), _calls("d2h"), _bytes("d2h")),
    cuda=True,
    needs_text=" Needs CUDA; counted at the CUDA API (any library's memcpy calls).",
)
