"""Models of the example suite, benchmarks and tests, built from configs with random weights (nothing is
downloaded)."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

VOCAB = 256


def tiny_llama_config() -> LlamaConfig:
    """The seed issue's tiny Llama: one layer, hidden size 16, vocabulary 256, no EOS (generation runs full length)."""
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
    )


def tiny_llama(device: torch.device | str = "cpu", seed: int = 0) -> LlamaForCausalLM:
    """The tiny Llama in eval mode on ``device``, with weights drawn from ``seed``."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_llama_config()).to(device).eval()


def gpt2_config(*, tiny: bool) -> GPT2Config:
    """GPT-2 124M (the seed article's model), or a two-layer miniature of it for CPU runs."""
    if tiny:
        return GPT2Config(
            vocab_size=512, n_positions=256, n_embd=64, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
        )
    return GPT2Config()  # 124M: 12 layers, 768 wide, vocabulary 50257


def gpt2(device: torch.device | str = "cpu", seed: int = 0, *, tiny: bool = True) -> GPT2LMHeadModel:
    """GPT-2 (random init from ``seed``) in eval mode on ``device``."""
    torch.manual_seed(seed)
    return GPT2LMHeadModel(gpt2_config(tiny=tiny)).to(device).eval()


#: The keyword that hands a model's forward its KV cache: ``cache`` where transformers takes it (5.24 warns that
#: ``past_key_values`` will be removed in 5.40), ``past_key_values`` in the releases before it (5.17 on the GPU
#: hosts). One name for every model of an installed transformers, found once (a compiled step reads a constant).
CACHE_KEYWORD = "cache" if "cache" in inspect.signature(GPT2LMHeadModel.forward).parameters else "past_key_values"


def with_cache(kv_cache: Any) -> dict[str, Any]:
    """A model forward's keyword argument for its KV cache (:data:`CACHE_KEYWORD`)."""
    return {CACHE_KEYWORD: kv_cache}
