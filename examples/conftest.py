"""Fixtures of the example suite: a tiny random-init Llama (built from a config: nothing is downloaded)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from . import models
from .models import VOCAB


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="session")
def tiny_llama(device: torch.device) -> LlamaForCausalLM:
    return models.tiny_llama(device)


@pytest.fixture
def prompt(device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(1, VOCAB, (1, 8), generator=generator).to(device)
