"""Plant a CUDA-graph regression in a copy of the strategy suite, for evidence of what the graph health signal
sees (docs/explanation/graphs.md). Each variant changes ``static_compiled`` in CHECKOUT/examples/strategies.py in
place (run it on a copy):

- ``new-cache``: a new static cache each call (new static input addresses: the CUDA graph tree re-records);
- ``mutated-input``: the compiled step writes into its ``position`` input (torch skips its CUDA graphs);
- ``cpu-position``: the step's ``position`` is a host tensor (a CPU tensor input).

    python devtools/plant_graph_regressions.py CHECKOUT VARIANT
"""

from __future__ import annotations

import argparse
from pathlib import Path

_STEP = "            return model(token, **with_cache(cache), cache_position=position, use_cache=True).logits\n"
VARIANTS = {
    "new-cache": ("    cache = caches.get(key)\n", "    cache = None  # planted: a new static cache each call\n"),
    "mutated-input": (_STEP, "            position.add_(0)  # planted: the step writes into its input\n" + _STEP),
    "cpu-position": (
        "    position = torch.tensor([length], device=prompt.device)\n",
        "    position = torch.tensor([length])  # planted: a CPU tensor input\n",
    ),
}


def plant(checkout: Path, variant: str) -> int:
    """Rewrite the suite's strategies in ``checkout`` with ``variant``; the line planted."""
    path = checkout / "examples" / "strategies.py"
    text = path.read_text()
    old, new = VARIANTS[variant]
    if text.count(old) != 1:
        raise SystemExit(f"{path}: the line {variant} replaces is not there once: {old.strip()!r}")
    path.write_text(text.replace(old, new))
    return text[: text.index(old)].count("\n") + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path)
    parser.add_argument("variant", choices=sorted(VARIANTS))
    args = parser.parse_args()
    print(f"planted {args.variant} at line {plant(args.checkout, args.variant)}")


if __name__ == "__main__":
    main()
