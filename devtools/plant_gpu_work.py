"""Plant device work in a copy of the strategy suite, for evidence of what the gate sees: after each decode step of
``cuda_graph`` (each graph replay) and ``static_compiled`` (each compiled step), one ``torch.cuda._sleep`` kernel
that spins for PERCENT of the step's device time: in the committed H100 baseline, or with ``--step-results`` in a
results file of this runner (``pytest --syncguard-json`` of the base's speed tests: the step as this GPU runs it).
``--percent 0`` plants the same kernel spinning a single cycle: the base of a planted change, with the same
operators, launches and syncs, so that only device time differs between the two.

    python devtools/plant_gpu_work.py CHECKOUT --percent 3 [--only cuda_graph] [--step-results step.json]

rewrites CHECKOUT/examples/strategies.py in place (run it on a copy). The kernel's cycles per microsecond are
measured once per process on the device it runs on (CUDA events around a long spin).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

#: Where each strategy's step ends, and the committed baseline test whose device time per step sets the spin.
SITES = {
    "cuda_graph": ("        graphed.graph.replay()\n", "examples/test_strategies.py::test_timeline[cuda_graph]"),
    "static_compiled": (
        "        logits = step_fn(token[:, None].clone(), cache, position).clone()\n",
        "examples/test_strategies.py::test_timeline[static_compiled]",
    ),
}
BASELINE = Path("baselines/nvidia-h100-80gb-hbm3.json")
HELPER = '''

_PLANT_CYCLES_PER_US: list[float] = []


def _planted_spin(us: float) -> None:
    """Planted by devtools/plant_gpu_work.py: spin the device for ``us`` microseconds (one cycle when 0)."""
    if not _PLANT_CYCLES_PER_US:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(50_000_000)
        end.record()
        end.synchronize()
        _PLANT_CYCLES_PER_US.append(50_000_000 / (start.elapsed_time(end) * 1000.0))
    torch.cuda._sleep(max(1, int(us * _PLANT_CYCLES_PER_US[0])))
'''


def _steps(results: Path, names: Sequence[str]) -> dict[str, float]:
    """Device time per step of the speed test of each strategy of ``names`` in a results file of this runner, by
    strategy."""
    from pytest_syncguard.document import file

    measured = {t.nodeid: t.metrics.values for t in file.read(results)}
    steps = {}
    for name in names:
        nodeid = f"examples/test_strategies.py::test_speed[{name}]"
        if "gpu_us_per_token" not in measured.get(nodeid, {}):
            raise SystemExit(f"{results}: no gpu_us_per_token of {nodeid}")
        steps[name] = measured[nodeid]["gpu_us_per_token"]
    return steps


def plant(
    checkout: Path, percent: float, only: Sequence[str] = (), step_results: Path | None = None
) -> dict[str, float]:
    """Rewrite the checkout's strategies (``percent`` in those of ``only``, default all; the others get the one-cycle
    spin of a base), sized from ``step_results`` where given; returns the microseconds planted per step of each
    strategy."""
    unknown = set(only) - set(SITES)
    if unknown:
        raise SystemExit(f"--only {', '.join(sorted(unknown))}: not one of {', '.join(SITES)}")
    source = checkout / "examples" / "strategies.py"
    text = source.read_text(encoding="utf-8")
    if "_planted_spin" in text:
        raise SystemExit(f"{source}: already planted")
    if step_results is not None:
        step = _steps(step_results, [name for name in SITES if percent and (not only or name in only)])
    else:
        baseline = json.loads((checkout / BASELINE).read_text(encoding="utf-8"))["tests"]
        step = {name: baseline[test]["gpu_us_per_token"] for name, (_, test) in SITES.items()}
    planted = {}
    for name, (line, _) in SITES.items():
        if text.count(line) != 1:
            raise SystemExit(f"{source}: the end of {name}'s step was not found once")
        share = percent if not only or name in only else 0.0
        us = round(share / 100 * step[name], 2) if share else 0.0
        indent = line[: len(line) - len(line.lstrip())]
        text = text.replace(line, f"{line}{indent}_planted_spin({us})\n")
        planted[name] = us
    anchor = "\n\n_GRAPHS:"
    text = text.replace(anchor, HELPER + anchor, 1)
    source.write_text(text, encoding="utf-8")
    return planted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path)
    parser.add_argument("--percent", type=float, required=True, help="of the step's device time; 0: the base")
    parser.add_argument("--only", action="append", default=[], choices=sorted(SITES),
                        help="plant PERCENT in this strategy only (repeatable; default: every one)")  # fmt: skip
    parser.add_argument("--step-results", type=Path, help="size the spin from the speed tests' device time per step "
                        "in this results file (default: the committed H100 baseline's)")  # fmt: skip
    args = parser.parse_args()
    print(json.dumps(plant(args.checkout, args.percent, args.only, args.step_results)))


if __name__ == "__main__":
    main()
