"""An engine that decodes in a process of its own, as serving engines run theirs (vLLM's engine core, SGLang's
scheduler, TGI's shards): the test process is the client, and the engine process, started with multiprocessing's
spawn, loads the tiny model and decodes each request from its request queue with a KV cache, one host read per step
(its stop check), on the GPU where there is one. syncguard measures the engine's syncs with the test's, per the
test's tokens (docs/howto/child-processes.md): the budget holds for the engine's loop, which the client never runs.

Planted for the evidence: ``SYNCGUARD_PLANT_ENGINE_READ=1`` makes the engine read each step's token on the host
(as a log line would), which fails the test naming the engine's line. On CUDA the engine also counts its syncs with
torch's own sync-debug mode and adds up the bytes it moved from its tensors' sizes, and the test checks that
syncguard counted the same syncs and transfers.
"""

from __future__ import annotations

import multiprocessing
import os
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from transformers import DynamicCache

from pytest_syncguard import SyncGuard

from .models import VOCAB, gpt2, with_cache

NEW_TOKENS = 16


@torch.inference_mode()
def decode(model: Any, prompt: torch.Tensor, plant: bool) -> torch.Tensor:
    """Greedy decoding with a KV cache; the stop check reads the device each step (no EOS: it never stops)."""
    cache = DynamicCache(config=model.config)
    finished = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    step_input, tokens = prompt, []
    for _ in range(NEW_TOKENS):
        token = model(step_input, **with_cache(cache), use_cache=True).logits[:, -1].argmax(-1)
        if plant:
            _ = int(token[0])  # planted: the engine reads the token on the host, as a log line would
        tokens.append(token)
        step_input = token[:, None]
        finished |= token == VOCAB  # no such token: the loop runs its length
        if bool(finished.all()):  # the stop check: one host read per step
            break
    return torch.stack(tokens, dim=1)


def engine_core(requests: Any, replies: Any) -> None:
    """The engine process: load the model, then serve requests (a prompt's token ids; None ends it) until told to
    stop. Each reply is the new tokens, on CUDA the syncs torch's sync-debug mode saw while decoding, and the bytes
    the request moved between host and device by the tensors' own sizes: the prompt up, a stop check's flag per
    step and the tokens down."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = gpt2(device, tiny=True)
    plant = os.environ.get("SYNCGUARD_PLANT_ENGINE_READ") == "1"
    while (request := requests.get()) is not None:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("warn")
            try:
                prompt = torch.tensor(request, device=device)  # on CUDA an upload from pageable memory: a sync
                decoded = decode(model, prompt, plant)
                tokens = decoded.tolist()  # and the reply's download: another
            finally:
                if device.type == "cuda":
                    torch.cuda.set_sync_debug_mode(0)
        steps = len(tokens[0])  # each step's stop flag (a bool), and the planted read's token
        moved = prompt.nbytes + steps * (1 + (decoded.element_size() if plant else 0)) + decoded.nbytes
        replies.put((tokens, sum("synchronizing" in str(w.message) for w in seen), moved))


class Engine:
    """The client's end of the engine process."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._requests, self._replies = context.Queue(), context.Queue()
        self.process = context.Process(target=engine_core, args=(self._requests, self._replies), daemon=True)
        self.process.start()

    def generate(self, prompt: list[list[int]]) -> tuple[list[list[int]], int, int]:
        self._requests.put(prompt)
        return self._replies.get(timeout=300)  # type: ignore[no-any-return]

    def close(self) -> None:
        self._requests.put(None)
        self.process.join(timeout=60)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    """One engine for the module, warmed up by a first request (its model loaded, its kernels chosen)."""
    started = Engine()
    started.generate([[1, 2, 3, 4]])
    yield started
    started.close()


# The stop check each step, and on CUDA the prompt's upload and the reply's download: 18 syncs over 16 tokens; the
# bytes those move (64 up, 16 + 256 down) are 21 a token (a CUDA budget: on the CPU it is not measured).
@pytest.mark.max_syncs_per_token(1.125)
@pytest.mark.max_transfer_bytes_per_token(21)
def test_the_engine_decodes_within_its_budget(syncguard: SyncGuard, engine: Engine) -> None:
    prompt = [[5, 6, 7, 8], [9, 10, 11, 12]]
    with syncguard.generation(tokens=NEW_TOKENS) as region:
        tokens, debugged, moved = engine.generate(prompt)
    assert len(tokens[0]) == NEW_TOKENS
    if torch.cuda.is_available():  # the engine's own counts (torch's, the tensors') of what syncguard counted
        assert region.syncs == debugged, (region.syncs, debugged)
        assert region.count("transfer_bytes") == moved, (region.count("transfer_bytes"), moved)
