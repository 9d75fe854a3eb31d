"""On CUDA: how the timeline capture records the device work of a CUDA graph that holds a device-to-device copy,
replayed alone and with a kernel launched after each replay: per case, the kind and name of each device op that
the graph launches ran (matched by correlation), and the counts :func:`device_work` makes of the trace.
``python devtools/graph_copies.py``."""

from __future__ import annotations

from collections import Counter

import torch

from pytest_syncguard.analysis import trace_file
from pytest_syncguard.analysis.device_work import device_work
from pytest_syncguard.analysis.trace_file import GRAPH_LAUNCHES
from pytest_syncguard.probes.timeline import TIMELINE

REPLAYS = 20


def graphed() -> torch.cuda.CUDAGraph:
    x = torch.randn(32, 1024, device="cuda")
    w = torch.randn(1024, 1024, device="cuda")
    token = torch.zeros(32, 1, dtype=torch.long, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            token.copy_((x @ w).argmax(-1)[:, None])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        token.copy_((x @ w).argmax(-1)[:, None])  # a 256-byte device-to-device copy node
    return graph


def main() -> int:
    graph = graphed()
    for after in ("nothing", "a kernel"):
        torch.cuda.synchronize()
        with TIMELINE.capturing() as files:
            for _ in range(REPLAYS):
                graph.replay()
                if after == "a kernel":
                    torch.cuda._sleep(1000)  # type: ignore[no-untyped-call]
            torch.cuda.synchronize()
        trace = trace_file.load(files[0])
        files[0].unlink()
        graph_calls = {c.correlation for c in trace.host_calls if c.name in GRAPH_LAUNCHES}
        kinds = Counter((op.category, op.name[:60], op.bytes) for op in trace.gpu_ops if op.correlation in graph_calls)
        counts = device_work(trace, (float("-inf"), float("inf")))
        print(f"after each replay: {after}; {len(graph_calls)} graph launches recorded")
        for (category, name, size), n in sorted(kinds.items()):
            print(f"  {n:4d} x {category:10s} {size:6d} B  {name}")
        print("  counts:", {k: v for k, v in counts.values.items() if v})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
