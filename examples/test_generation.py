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


def greedy_on_the_host(model: LlamaForCausalLM, prompt: torch.Tensor, steps: int) -> torch.Tensor:
    """The standard-API pattern of the ONNX Runtime write-up: each step's logits come to the host as numpy, the next
    token is picked there and sent back (an engine that returns numpy outputs does this whatever the caller wants)."""
    cache = DynamicCache(config=model.config)
    tokens, step_input = prompt, prompt
    for _ in range(steps):
        logits = model(step_input, **with_cache(cache), use_cache=True).logits[:, -1]
        scores = logits.float().cpu().numpy()  # every step's logits to the host
        step_input = torch.from_numpy(scores.argmax(-1)[:, None]).to(prompt.device)
        tokens = torch.cat([tokens, step_input], dim=-1)
    return tokens


#: A loop may bring a token id a step to the host, not its logits (a row of the vocabulary).
TOKEN_BYTES = 64


@pytest.mark.xfail(
    torch.cuda.is_available(), strict=True,
    reason="the logits go to the host every step (the vocabulary's row of floats): the transfer budget fails it",
)  # fmt: skip
@pytest.mark.max_transfer_bytes_d2h_per_token(TOKEN_BYTES)
@pytest.mark.max_syncs_per_token(2)  # on CUDA the logits' copy into pageable memory and the token's copy back
def test_greedy_loop_with_logits_on_the_host(
    syncguard: SyncGuard, tiny_llama: LlamaForCausalLM, prompt: torch.Tensor
) -> None:
    with torch.inference_mode(), syncguard.generation(model=tiny_llama):
        greedy_on_the_host(tiny_llama, prompt, NEW_TOKENS)


@pytest.mark.max_transfer_bytes_d2h_per_token(TOKEN_BYTES)
@pytest.mark.max_syncs_per_token(1)
def test_greedy_loop_with_logits_on_the_device(
    syncguard: SyncGuard, tiny_llama: LlamaForCausalLM, prompt: torch.Tensor
) -> None:
    """The same loop with the logits kept on the device (IO binding, in ONNX Runtime's words)."""
    with torch.inference_mode(), syncguard.generation(model=tiny_llama):
        greedy(tiny_llama, prompt, NEW_TOKENS, stop_check=False)
