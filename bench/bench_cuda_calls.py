"""What the CUDA-call probe (:mod:`pytest_syncguard.probes.cuda_calls`) costs a decoding loop, and what it counts
there, on the suite's strategies (GPT-2 124M, batch 32, prompt 16, 100 new tokens). Needs CUDA.

Per strategy and round, three runs in an order that rotates: the sync probe alone, the sync probe with the
CUDA-call probe counting (its subscriber held from before the timed span to after it, as a region holds it), and
the sync probe alone again; wall-time ratios of the second and third to the first (the A/A beside the A/B),
medians with 90% signed-rank intervals. Each probed run's blocking CUDA calls
outside torch are printed (the suite's strategies make none that torch does not count: a count here changes the
baselines). ``--budget SECONDS`` stops adding rounds once spent, after at least two per strategy.

Run from the repository root: ``python -m bench.bench_cuda_calls [--strategies a,b] [--rounds N] [--budget S]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext

import torch

from bench.bench_timeline_capture import NEW_TOKENS, ratio_interval, shared_deadlines, timed, workload
from examples.strategies import STRATEGIES
from pytest_syncguard.probes.cuda_calls import CUDA_CALLS
from pytest_syncguard.probes.sync_ops import SyncKind
from pytest_syncguard.probes.syncs import PROBE, SyncRecorder

VARIANTS = ("sync probe", "with CUDA calls", "sync probe again")


@contextmanager
def _probed(variant: str, found: Counter[str]) -> Iterator[None]:
    recorder = SyncRecorder(on_device=True)
    with ExitStack() as stack:
        stack.enter_context(PROBE.recording(recorder))
        if variant == "with CUDA calls":
            watch = stack.enter_context(CUDA_CALLS.counting())
            if watch.not_counted is not None:
                raise SystemExit(f"the CUDA-call probe could not count: {watch.not_counted}")
        yield
    found.update(f"{e.op} at {e.site}" for e in recorder.events if e.kind == SyncKind.CUDA_CALL)


def cost(name: str, fn: Callable[[], object], rounds: int, deadline: float) -> None:
    walls: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    found: Counter[str] = Counter()
    for variant in VARIANTS:  # warm-up
        timed(fn, _probed(variant, Counter()))
    for r in range(rounds):
        if r >= 2 and time.monotonic() > deadline:
            break
        order = VARIANTS[r % 3 :] + VARIANTS[: r % 3]
        for variant in order:
            with CUDA_CALLS.held() if variant == "with CUDA calls" else nullcontext():
                walls[variant].append(timed(fn, _probed(variant, found)))
    ratios = {v: [w / base for w, base in zip(walls[v], walls["sync probe"], strict=True)] for v in VARIANTS[1:]}
    median = statistics.median
    print(
        f"{name:<16} {len(ratios['with CUDA calls'])} rounds, sync probe {median(walls['sync probe']) * 1e3:7.1f} ms"
        f" | with CUDA calls {median(ratios['with CUDA calls']):.3f} ({ratio_interval(ratios['with CUDA calls'])})"
        f" | A/A {median(ratios['sync probe again']):.3f} ({ratio_interval(ratios['sync probe again'])})"
        f" | counted outside torch: {dict(found) or 'none'}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--budget", type=float, default=1e9, help="seconds after which no round is started")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_cuda_calls needs CUDA")
    began = time.monotonic()
    model, prompt, eos = workload()
    print(f"machine: {torch.cuda.get_device_name()}; torch {torch.__version__}", flush=True)
    names = [n for n in args.strategies.split(",") if n]
    for name, deadline in shared_deadlines(names, args.budget, began):
        strategy = STRATEGIES[name]
        cost(name, lambda s=strategy: s(model, prompt, NEW_TOKENS, eos), args.rounds, deadline)


if __name__ == "__main__":
    main()
