"""The example suite: budgets on the syncs of three decoding loops over the same tiny Llama.

Run with ``pytest examples --syncguard`` (CPU by default, CUDA when present).
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaForCausalLM

from pytest_syncguard import SyncGuard

from .models import with_cache

NEW_TOKENS = 64
EOS = 2


@pytest.mark.max_syncs_per_token(3)
def test_hf_generate(syncguard: SyncGuard, tiny_llama: LlamaForCausalLM, prompt: torch.Tensor) -> None:
    """HF ``generate``: its stopping criteria read the device every step (about 2 syncs per token)."""
    with torch.inference_mode(), syncguard.generation(model=tiny_llama):
        out = tiny_llama.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    assert out.shape[1] == prompt.shape[1] + NEW_TOKENS


def greedy(model: LlamaForCausalLM, prompt: torch.Tensor, steps: int, *, stop_check: bool) -> torch.Tensor:
    """A hand-written greedy loop with a KV cache; ``stop_check`` asks the host every step whether all hit EOS."""
    cache = DynamicCache(config=model.config)
    tokens = prompt
    step_input = prompt
    finished = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    for _ in range(steps):
        logits = model(step_input, **with_cache(cache), use_cache=True).logits[:, -1]
        next_token = logits.argmax(-1, keepdim=True)
        finished |= next_token.squeeze(-1) == EOS
        tokens = torch.cat([tokens, next_token], dim=-1)
        step_input = next_token
        if stop_check and bool(finished.all()):  # one host read per token
            break
    return tokens


@pytest.mark.max_syncs_per_token(1)
def test_greedy_loop_with_stop_check(syncguard: SyncGuard, tiny_llama: LlamaForCausalLM, prompt: torch.Tensor) -> None:
    with torch.inference_mode(), syncguard.generation(model=tiny_llama):
        greedy(tiny_llama, prompt, NEW_TOKENS, stop_check=True)
    assert syncguard.last is not None
    assert syncguard.last.tokens == NEW_TOKENS


@pytest.mark.max_syncs(0)
def test_greedy_loop_without_host_reads(
    syncguard: SyncGuard, tiny_llama: LlamaForCausalLM, prompt: torch.Tensor
) -> None:
    """No host read inside the loop; decoding the result at the end is an intended sync."""
    with torch.inference_mode(), syncguard.generation(model=tiny_llama):
        tokens = greedy(tiny_llama, prompt, NEW_TOKENS, stop_check=False)
        with syncguard.allow():
            decoded = tokens.tolist()
    assert len(decoded[0]) == prompt.shape[1] + NEW_TOKENS
