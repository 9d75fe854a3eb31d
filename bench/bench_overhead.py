"""Instrumented/bare time ratio of a tiny-Llama HF ``generate`` of 64 tokens (the seed issue's benchmark).

Bare and instrumented runs alternate in one process; the result is the median of the per-pair ratios.
Run: ``python bench/bench_overhead.py [--pairs N]``; it prints the machine it ran on.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from pytest_syncguard.probes.syncs import PROBE, SyncRecorder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=15)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = LlamaConfig(
        vocab_size=256, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, pad_token_id=0, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device).eval()
    prompt = torch.randint(1, 256, (1, 8), device=device)

    def generate() -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(prompt, max_new_tokens=64, min_new_tokens=64, do_sample=False)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    def instrumented() -> float:
        recorder = SyncRecorder(on_device=device != "cpu")
        with PROBE.recording(recorder):
            return generate()

    for _ in range(3):
        generate(), instrumented()
    bare_times, inst_times, ratios = [], [], []
    for i in range(args.pairs):
        # Alternate the order inside each pair so neither variant always runs second.
        if i % 2:
            inst, bare = instrumented(), generate()
        else:
            bare, inst = generate(), instrumented()
        bare_times.append(bare)
        inst_times.append(inst)
        ratios.append(inst / bare)
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({platform.processor() or platform.machine()})"
    print(f"machine: {name}; torch {torch.__version__}; pairs {args.pairs}")
    bare_ms, inst_ms = statistics.median(bare_times) * 1e3, statistics.median(inst_times) * 1e3
    print(f"bare median {bare_ms:.1f} ms; instrumented median {inst_ms:.1f} ms")
    low, high = min(ratios), max(ratios)
    print(f"instrumented/bare ratio: median {statistics.median(ratios):.3f} (min {low:.3f}, max {high:.3f})")


if __name__ == "__main__":
    main()
