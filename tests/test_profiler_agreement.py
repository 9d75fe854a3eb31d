"""The plugin's CPU count equals an independent ground truth: torch.profiler's own op events."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from pytest_syncguard.probes.syncs import PROBE, SyncRecorder

transformers = pytest.importorskip("transformers")
from examples.models import tiny_llama  # noqa: E402

#: The data-dependent operators a GPU run blocks on: scalar reads and the nonzero family.
SYNCING_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::_unique2")


def profiler_count(fn: Callable[[], object]) -> int:
    """Syncing ops in the profiler's op tree, leaving out those nested in another syncing op.

    A CPU ``masked_select`` reads a scalar inside its kernel, where the CUDA kernel's one sync is its
    ``nonzero``: either way the GPU run blocks once per outermost syncing op.
    """
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()

    def nested(event: object) -> bool:
        parent = getattr(event, "cpu_parent", None)
        while parent is not None:
            if parent.name in SYNCING_OPS:
                return True
            parent = parent.cpu_parent
        return False

    outermost = Counter(e.name for e in prof.events() if e.name in SYNCING_OPS and not nested(e))
    return sum(outermost.values())


def plugin_count(fn: Callable[[], object]) -> int:
    recorder = SyncRecorder(on_device=False)
    with PROBE.recording(recorder):
        fn()
    return recorder.syncs


def test_hf_generate_count_matches_the_profiler() -> None:
    model = tiny_llama()
    prompt = torch.randint(1, 256, (1, 8), generator=torch.Generator().manual_seed(1))

    def generate() -> object:
        with torch.inference_mode():
            return model.generate(prompt, max_new_tokens=64, min_new_tokens=64, do_sample=False)

    generate()
    truth = profiler_count(generate)
    assert truth >= 64  # at least the stopping criteria's read of every step
    assert plugin_count(generate) == truth


def test_loop_with_masks_and_reads_matches_the_profiler() -> None:
    logits = torch.randn(4, 256, generator=torch.Generator().manual_seed(2))

    def loop() -> object:
        seen = []
        for step in range(16):
            scores = logits * (step + 1)
            top = scores[scores > 1.5]  # nonzero inside index
            seen.append(torch.unique(top.round()))
            if bool((scores.argmax(-1) == 7).any()):
                break
            seen.append(torch.masked_select(scores, scores < -2).sum().item())
        return seen

    truth = profiler_count(loop)
    assert truth == 5 * 16  # index, unique, bool, masked_select, item: five per step
    assert plugin_count(loop) == truth
