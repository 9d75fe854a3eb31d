"""The truth harness for idle time by cause: the strategy suite's loops run three ways on one GPU, side by side.

- unmeasured: each loop in this process with nothing of syncguard's running, timed by the wall clock (median of
  ``--rounds`` runs after a warm-up): the loop's own time per token;
- syncguard's default: ``pytest examples/test_strategies.py -k test_timeline --syncguard
  --syncguard-timeline=sampled`` in a child process (the PM sampler over each timed run, the counted syncs and the
  launch log);
- a full trace: the same tests under ``--syncguard-timeline=trace`` (CUPTI's kernel and launch records).

For each loop it prints the time per token of each way, and the judged idle time and its shares by cause of the two
measured ways, with the largest difference between their shares (points) and the share the default attributes to a
cause other than ``other``; then each cause's idle time (ms) of both. ``--plant-host-read`` runs the loops with a
device read planted in every step (the commonest regression: ``int(token[0])`` after each token is chosen, outside
a CUDA graph's capture; this module is the measured runs' pytest plugin for it).

    python devtools/idle_truth.py [--loops kv_cache,cuda_graph] [--rounds 5] [--plant-host-read] [--json OUT]

Run from the repository root on a CUDA machine; it prints the GPU, torch and transformers it ran with.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
CAUSES = ("host sync", "launch-bound", "collective wait", "copy wait", "other")


PLANTED = "SYNCGUARD_PLANT_HOST_READ"


def plant_host_read() -> None:
    """Read the device once after every token the example loops choose (not while a CUDA graph is captured)."""
    from examples import strategies

    emit = strategies._emit

    def planted(logits: torch.Tensor, finished: torch.Tensor, eos: int) -> torch.Tensor:
        token = emit(logits, finished, eos)
        if not torch.cuda.is_current_stream_capturing():
            int(token[0])  # the planted read
        return token

    strategies._emit = planted


def pytest_configure(config: Any) -> None:
    """As the measured runs' plugin (``-p idle_truth``): plant the read where asked."""
    if os.environ.get(PLANTED) == "1":
        plant_host_read()


def unmeasured(loops: list[str], rounds: int) -> dict[str, float]:
    """Each loop's median wall time per token (ms), nothing of syncguard's loaded but the example loops."""
    sys.path.insert(0, str(ROOT))
    from examples import models
    from examples.strategies import STRATEGIES, release_kept_state
    from examples.test_strategies import BATCH, NEW_TOKENS, PROMPT

    if os.environ.get(PLANTED) == "1":
        plant_host_read()

    device = torch.device("cuda")
    model = models.gpt2(device, tiny=False)
    generator = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, model.config.vocab_size, (BATCH, PROMPT), generator=generator).to(device)
    eos = model.config.vocab_size
    found = {}
    for name in loops:
        strategy = STRATEGIES[name]
        strategy(model, prompt, NEW_TOKENS, eos)  # warm-up: compiles, captures graphs
        times = []
        for _ in range(rounds):
            torch.cuda.synchronize()
            began = time.perf_counter()
            strategy(model, prompt, NEW_TOKENS, eos)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - began) / NEW_TOKENS * 1e3)
        found[name] = statistics.median(times)
        release_kept_state()
    return found


def measured(loops: list[str], source: str, extra_env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each loop's ``test_timeline`` under ``source``: its time per token (ms), judged idle time and its causes."""
    with tempfile.TemporaryDirectory() as folder:
        results = Path(folder) / "results.json"
        selection = "test_timeline and (" + " or ".join(loops) + ")"
        command = [
            sys.executable, "-m", "pytest", "examples/test_strategies.py", "-k", selection, "-q", "-p",
            "no:cacheprovider", "-p", "idle_truth", "--syncguard", f"--syncguard-timeline={source}",
            "--syncguard-json", str(results),
        ]  # fmt: skip
        path = os.pathsep.join(filter(None, (str(ROOT / "devtools"), os.environ.get("PYTHONPATH"))))
        env = {**os.environ, **extra_env, "PYTHONPATH": path}
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        print(done.stdout[-1500:], done.stderr[-1500:], sep="\n", file=sys.stderr)
        document = json.loads(results.read_text())
    found = {}
    for test in document["tests"]:
        name = next((loop for loop in loops if f"[{loop}]" in test["nodeid"]), None)
        timeline = test.get("timeline")
        timeline = timeline[0] if isinstance(timeline, list) and timeline else timeline
        if name is None or not timeline:
            continue
        rate = test.get("metrics", {}).get("values", {}).get("tokens_per_second")
        found[name] = {
            "ms_per_token": 1e3 / rate if rate else None,
            "idle_us": sum(timeline.get("idle_us_by_cause", {}).values()),
            "by_cause": timeline.get("idle_us_by_cause", {}),
            "busy": timeline.get("busy_us", 0.0) / timeline["span_us"] if timeline.get("span_us") else None,
        }
    return found


def shares(by_cause: dict[str, float]) -> dict[str, float]:
    total = sum(by_cause.values())
    return {cause: by_cause.get(cause, 0.0) / total * 100 if total else 0.0 for cause in CAUSES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", default="no_cache,kv_cache,static_cache,static_compiled,stream_pingpong,cuda_graph,"
                        "hf_generate")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--plant-host-read", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    loops = args.loops.split(",")
    env = {PLANTED: "1"} if args.plant_host_read else {}
    os.environ.update(env)
    import transformers

    gpu = torch.cuda.get_device_properties(0)
    print(f"{gpu.name} {gpu.uuid}; torch {torch.__version__}; transformers {transformers.__version__}")
    if args.plant_host_read:
        print("planted: a device read in every step")
    bare = unmeasured(loops, args.rounds)
    default, trace = measured(loops, "sampled", env), measured(loops, "trace", env)
    rows = {}
    header = f"{'loop':16} {'ms/token bare':>13} {'sampled':>8} {'trace':>8}  {'idle us sampled':>15} {'trace':>9}"
    print(header + "  shares by cause, sampled | trace; largest difference (points); sampled attributed")
    for name in loops:
        if name not in default or name not in trace:
            print(f"{name:16} not measured by both sources")
            continue
        ours, theirs = shares(default[name]["by_cause"]), shares(trace[name]["by_cause"])
        worst = max(abs(ours[c] - theirs[c]) for c in CAUSES)
        said = ", ".join(f"{c} {ours[c]:.1f}%" for c in CAUSES if ours[c] >= 0.05)
        truth = ", ".join(f"{c} {theirs[c]:.1f}%" for c in CAUSES if theirs[c] >= 0.05)

        def ms(value: float | None) -> str:
            return f"{value:.2f}" if value else "-"

        print(
            f"{name:16} {bare[name]:13.2f} {ms(default[name]['ms_per_token']):>8} {ms(trace[name]['ms_per_token']):>8}"
            f"  {default[name]['idle_us']:15.0f} {trace[name]['idle_us']:9.0f}  {said} | {truth}; {worst:.1f}; "
            f"{100 - ours['other']:.1f}%"
        )
        # In time as well as in shares: a trace that slows the host adds launch-bound idle time of its own, which
        # moves every share of the trace's without moving the other causes' time.
        both = ", ".join(
            f"{c} {default[name]['by_cause'].get(c, 0.0) / 1e3:.1f} | {trace[name]['by_cause'].get(c, 0.0) / 1e3:.1f}"
            for c in CAUSES
            if default[name]["by_cause"].get(c) or trace[name]["by_cause"].get(c)
        )
        print(f"{'':16} idle ms by cause, sampled | trace: {both}")
        rows[name] = {"bare_ms_per_token": bare[name], "sampled": default[name], "trace": trace[name],
                      "largest_difference_points": worst}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"gpu": str(gpu.uuid), "torch": torch.__version__, "loops": rows}, indent=1))


if __name__ == "__main__":
    main()
