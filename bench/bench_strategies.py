"""Speed of the reference decoding strategies, interleaved in one process (the seed article's sizes on CUDA:
GPT-2 124M, batch 32, 100 new tokens; a tiny GPT-2 on CPU).

Each round runs every strategy once, in a rotated order; the result is each strategy's median time and the
median over rounds of the ratio no_cache time / strategy time. Run from the repository root:
``python -m bench.bench_strategies [--rounds N]``; it prints the machine it ran on.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from examples import models
from examples.strategies import CUDA_ONLY, STRATEGIES


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    batch, prompt_len, new_tokens = (32, 16, 100) if cuda else (4, 8, 24)
    model = models.gpt2(device, tiny=not cuda)
    prompt = torch.randint(0, model.config.vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(2))
    prompt = prompt.to(device)
    eos = model.config.vocab_size  # never emitted: every strategy decodes all steps
    names = [n for n in STRATEGIES if cuda or n not in CUDA_ONLY]

    def timed(name: str) -> float:
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        STRATEGIES[name](model, prompt, new_tokens, eos)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    for name in names:  # warm-up: compilation, graph capture, allocator
        timed(name)
        timed(name)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(timed(name))
    machine = torch.cuda.get_device_name() if cuda else f"CPU ({platform.machine()})"
    print(f"machine: {machine}; torch {torch.__version__}; GPT-2 {'124M' if cuda else 'tiny'}, batch {batch}, "
          f"prompt {prompt_len}, {new_tokens} new tokens; {args.rounds} rounds")  # fmt: skip
    print(f"{'strategy':<16} {'median ms':>10} {'tokens/s':>10} {'speed-up vs no_cache':>21}")
    for name in names:
        median = statistics.median(times[name])
        ratios = [a / b for a, b in zip(times["no_cache"], times[name], strict=True)]
        print(
            f"{name:<16} {median * 1e3:>10.1f} {batch * new_tokens / median:>10.0f} {statistics.median(ratios):>20.2f}x"
        )


if __name__ == "__main__":
    main()
