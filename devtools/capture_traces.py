"""Capture the real CUDA traces used as test data and benchmark input (run on a GPU machine).

    python devtools/capture_traces.py OUT_DIR

Writes to OUT_DIR:
- item_loop.trace.json.gz: 12 decode-like steps (8 x (1024x1024 matmul + tanh) each) with a ``.item()`` per
  step, under the plugin's own annotations (region, steps, counted syncs), trimmed to the events the analysis
  reads;
- graph_loop.trace.json.gz: the same steps replayed as a CUDA graph, without host reads, trimmed alike;
- gpt2_b32_100.trace.json.gz: HF generate of 100 new tokens with GPT-2 (124M config, random init) at batch 32,
  the full trace (the input of bench/bench_trace.py).

``--capture`` writes, instead, traces of the timeline capture as it is now (CUDA activity and the plugin's
annotations, no host operators, a sentinel kernel at the end), trimmed alike:
- capture_graph_steps.trace.json.gz: 12 graph replays in a region without a model (steps: the graph launches);
- capture_marked_steps.trace.json.gz: the eager steps with a ``.item()`` each, marked by ``region.step()``.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from pytest_syncguard.analysis.trace_file import GPU_CATEGORIES, HOST_CATEGORIES, RANGE_CATEGORIES
from pytest_syncguard.guard import SyncGuard
from pytest_syncguard.probes.timeline import TIMELINE

KEEP = GPU_CATEGORIES | HOST_CATEGORIES | RANGE_CATEGORIES


class Step(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(1024, 1024, device="cuda") / 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(8):
            x = torch.tanh(x @ self.w)
        return x


class GraphStep(torch.nn.Module):
    def __init__(self, step: Step, x: torch.Tensor) -> None:
        super().__init__()
        self.static_x = x.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                step(self.static_x)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_y = step(self.static_x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.static_x.copy_(x)
        self.graph.replay()
        return self.static_y


def trimmed(source: Path, target: Path) -> None:
    data = json.loads(source.read_text())
    events = [e for e in data["traceEvents"] if e.get("ph") == "X" and e.get("cat") in KEEP]
    keep = {
        "schemaVersion": data.get("schemaVersion"),
        "traceEvents": events,
        "note": "trimmed by devtools/capture_traces.py: complete events of the categories the analysis reads",
    }
    with gzip.open(target, "wt") as sink:
        json.dump(keep, sink, separators=(",", ":"))
    print(f"{target}: {len(events)} events, {target.stat().st_size} bytes")


def loop(out: Path, name: str, graphed: bool) -> None:
    torch.manual_seed(0)
    step = Step()
    x = torch.randn(256, 1024, device="cuda")
    guard = SyncGuard("capture")
    with torch.no_grad():
        model: torch.nn.Module = GraphStep(step, x) if graphed else step
        torch.cuda.synchronize()
        with TIMELINE.capturing() as files, guard.generation(model=model):
            for _ in range(12):
                x = model(x)
                if not graphed and x.sum().item() > 1e30:
                    break
    trimmed(files[0], out / f"{name}.trace.json.gz")
    files[0].unlink()


def capture_loops(out: Path) -> None:
    """The traces of the capture as it is now: graph replays as steps, steps marked by the loop."""
    torch.manual_seed(0)
    step = Step()
    x = torch.randn(256, 1024, device="cuda")
    guard = SyncGuard("capture")
    with torch.no_grad():
        graphed = GraphStep(step, x)
        torch.cuda.synchronize()
        with TIMELINE.capturing() as files, guard.generation(tokens=12):
            for _ in range(12):
                x = graphed(x)
        trimmed(files[0], out / "capture_graph_steps.trace.json.gz")
        files[0].unlink()
        with TIMELINE.capturing() as files, guard.generation(tokens=12) as region:
            for _ in range(12):
                region.step()
                x = step(x)
                if x.sum().item() > 1e30:
                    break
        trimmed(files[0], out / "capture_marked_steps.trace.json.gz")
        files[0].unlink()


def gpt2(out: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).cuda().eval()
    prompt = torch.randint(0, 50257, (32, 32), device="cuda")
    with torch.inference_mode():
        model.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            model.generate(prompt, max_new_tokens=100, min_new_tokens=100, do_sample=False, pad_token_id=0)
            torch.cuda.synchronize()
    raw = out / "gpt2_b32_100.trace.json"
    prof.export_chrome_trace(str(raw))
    events = len(json.loads(raw.read_text())["traceEvents"])
    target = out / "gpt2_b32_100.trace.json.gz"
    with raw.open("rb") as source, gzip.open(target, "wb") as sink:
        sink.write(source.read())
    print(f"{target}: {events} events, {raw.stat().st_size} bytes of JSON, {target.stat().st_size} gzipped")
    raw.unlink()


if __name__ == "__main__":
    if sys.argv[1] == "--capture":
        directory = Path(sys.argv[2])
        directory.mkdir(parents=True, exist_ok=True)
        capture_loops(directory)
        sys.exit(0)
    directory = Path(sys.argv[1])
    directory.mkdir(parents=True, exist_ok=True)
    loop(directory, "item_loop", graphed=False)
    loop(directory, "graph_loop", graphed=True)
    gpt2(directory)
