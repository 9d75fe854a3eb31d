"""Greedy decoding strategies of one signature, from the plainest to the fastest.

Every strategy takes ``(model, prompt, max_new_tokens, eos_token_id)`` and returns a tensor of shape
``(batch, prompt_len + max_new_tokens)``: the prompt, then each sequence's tokens up to and including its EOS,
then ``eos_token_id`` as padding. A strategy stops once every sequence has emitted EOS (or after
``max_new_tokens``); the ones that learn this late only decode a few padded steps more, so all of them return
the same tensor for the same model and prompt.

- ``no_cache``: the whole sequence through the model at every step; the host asks ``finished.all()`` each step.
- ``kv_cache``: HF ``DynamicCache``; one host read per step.
- ``static_cache``: HF ``StaticCache`` (fixed shapes, positions given); one host read per step.
- ``static_compiled``: the static-cache decode step under ``torch.compile`` (inductor with CUDA graphs on CUDA,
  ``aot_eager`` on CPU, where inductor would need a C++ toolchain); one host read per step.
- ``stream_pingpong`` (CUDA): the stop flag is copied on a second stream into pinned memory and read by the
  host only when an event says the copy is complete: no sync in the loop.
- ``cuda_graph`` (CUDA): one captured graph per decode step, the stop check on the device, its flag copied to
  pinned memory every ``check_every`` steps and read when its event has completed: no sync in the loop.
- ``hf_generate``: ``model.generate`` (its stopping criteria read the device every step).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache, StaticCache

from .models import with_cache

Strategy = Callable[[Any, torch.Tensor, int, int], torch.Tensor]


def _start(prompt: torch.Tensor, max_new_tokens: int, eos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The output buffer (prompt, then padding) and the per-sequence finished flags."""
    batch, length = prompt.shape
    out = torch.full((batch, length + max_new_tokens), eos, dtype=prompt.dtype, device=prompt.device)
    out[:, :length] = prompt
    return out, torch.zeros(batch, dtype=torch.bool, device=prompt.device)


def _emit(logits: torch.Tensor, finished: torch.Tensor, eos: int) -> torch.Tensor:
    """The next token of each sequence (EOS once finished); updates ``finished`` in place."""
    token = logits[:, -1].argmax(-1)
    token = torch.where(finished, torch.full_like(token, eos), token)
    finished |= token == eos
    return token


@torch.inference_mode()
def no_cache(model: Any, prompt: torch.Tensor, max_new_tokens: int, eos: int) -> torch.Tensor:
    out, finished = _start(prompt, max_new_tokens, eos)
    length = prompt.shape[1]
    for step in range(max_new_tokens):
        logits = model(out[:, : length + step], use_cache=False).logits
        out[:, length + step] = _emit(logits, finished, eos)
        if bool(finished.all()):  # host read
            break
    return out


@torch.inference_mode()
def kv_cache(model: Any, prompt: torch.Tensor, max_new_tokens: int, eos: int) -> torch.Tensor:
    out, finished = _start(prompt, max_new_tokens, eos)
    length = prompt.shape[1]
    cache = DynamicCache(config=model.config)
    step_input = prompt
    for step in range(max_new_tokens):
        logits = model(step_input, **with_cache(cache), use_cache=True).logits
        token = _emit(logits, finished, eos)
        out[:, length + step] = token
        step_input = token[:, None]
        if bool(finished.all()):  # host read
            break
    return out


#: Per model (held weakly: a cache goes with its model, and no later model reuses it), its static caches by shape.
_CACHES: weakref.WeakKeyDictionary[Any, dict[tuple[tuple[int, ...], int, str], StaticCache]] = (
    weakref.WeakKeyDictionary()
)


def _static_cache(model: Any, prompt: torch.Tensor, max_new_tokens: int) -> StaticCache:
    """A static cache for this model and shape, emptied: one per shape, reused by later calls (a compiled step
    keeps working on the same cache object instead of recompiling for a new one)."""
    caches = _CACHES.setdefault(model, {})
    key = (tuple(prompt.shape), max_new_tokens, str(prompt.device))
    cache = caches.get(key)
    if cache is None:
        cache = caches[key] = StaticCache(config=model.config, max_cache_len=prompt.shape[1] + max_new_tokens)
    else:
        cache.reset()
    return cache


def _prefill(model: Any, prompt: torch.Tensor, cache: StaticCache) -> torch.Tensor:
    positions = torch.arange(prompt.shape[1], device=prompt.device)
    return model(prompt, **with_cache(cache), cache_position=positions, use_cache=True).logits


@torch.inference_mode()
def static_cache(model: Any, prompt: torch.Tensor, max_new_tokens: int, eos: int) -> torch.Tensor:
    out, finished = _start(prompt, max_new_tokens, eos)
    length = prompt.shape[1]
    cache = _static_cache(model, prompt, max_new_tokens)
    positions = torch.arange(length, length + max_new_tokens, device=prompt.device)
    logits = _prefill(model, prompt, cache)
    for step in range(max_new_tokens):
        token = _emit(logits, finished, eos)
        out[:, length + step] = token
        if bool(finished.all()) or step + 1 == max_new_tokens:  # host read
            break
        position = positions[step : step + 1]
        logits = model(token[:, None], **with_cache(cache), cache_position=position, use_cache=True).logits
    return out


_COMPILED: dict[tuple[int, str], Callable[..., torch.Tensor]] = {}


def _compiled_step(model: Any, device: torch.device) -> Callable[..., torch.Tensor]:
    key = (id(model), device.type)
    if key not in _COMPILED:

        def step(token: torch.Tensor, cache: StaticCache, position: torch.Tensor) -> torch.Tensor:
            return model(token, **with_cache(cache), cache_position=position, use_cache=True).logits

        if device.type == "cuda":
            _COMPILED[key] = torch.compile(step, mode="reduce-overhead", fullgraph=True)
        else:
            _COMPILED[key] = torch.compile(step, backend="aot_eager", fullgraph=True)
    return _COMPILED[key]


def release_kept_state() -> None:
    """Drop what the strategies keep between calls: the static caches, the compiled steps and dynamo's caches,
    and cuda_graph's captured steps with their own static caches. On CUDA a CUDA graph keeps its memory pool
    reserved for as long as it lives: released, it goes back with the next ``torch.cuda.empty_cache()``, with the
    caches' memory."""
    _CACHES.clear()
    _COMPILED.clear()
    _GRAPHS.clear()
    torch._dynamo.reset()  # resets inductor's CUDA graph trees too
    gc.collect()  # what referred to the graphs in reference cycles


@torch.inference_mode()
def static_compiled(model: Any, prompt: torch.Tensor, max_new_tokens: int, eos: int) -> torch.Tensor:
    out, finished = _start(prompt, max_new_tokens, eos)
    length = prompt.shape[1]
    cache = _static_cache(model, prompt, max_new_tokens)
    step_fn = _compiled_step(model, prompt.device)
    logits = _prefill(model, prompt, cache)
    position = torch.tensor([length], device=prompt.device)
    for step in range(max_new_tokens):
        token = _emit(logits, finished, eos)
        out[:, length + step] = token
        if bool(finished.all()) or step + 1 == max_new_tokens:  # host read
            break
        position.fill_(length + step)  # one device buffer: the compiled graph sees the same input every step
        logits = step_fn(token[:, None].clone(), cache, position).clone()
    return out


class _StopFlag:
    """``finished.all()`` copied to pinned host memory on a side stream; the host reads it only once the copy's
    event has completed (``Event.query()`` does not block).

    The host reads the flags through a numpy view made once, so a poll runs no operator: how many operators a
    step runs does not depend on how far the host is ahead of the device when it polls."""

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device)
        self.host = torch.zeros(2, dtype=torch.bool, pin_memory=True)
        self.flags = self.host.numpy()
        self.copied = [torch.cuda.Event(), torch.cuda.Event()]
        self.pending = [False, False]
        self.slot = 0

    def send(self, finished: torch.Tensor) -> None:
        """Queue a copy of ``finished.all()`` after the work queued so far on the current stream."""
        flag = finished.all()
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            flag.record_stream(self.stream)
            self.host[self.slot : self.slot + 1].copy_(flag.reshape(1), non_blocking=True)
            self.copied[self.slot].record(self.stream)
        self.pending[self.slot] = True
        self.slot ^= 1

    def done(self) -> bool:
        """Whether a completed copy says every sequence has finished (never waits)."""
        for slot in (0, 1):
            if self.pending[slot] and self.copied[slot].query():
                self.pending[slot] = False
                if self.flags[slot]:  # pinned host memory, read without an operator
                    return True
        return False


@torch.inference_mode()
def stream_pingpong(model: Any, prompt: torch.Tensor, max_new_tokens: int, eos: int) -> torch.Tensor:
    if prompt.device.type != "cuda":
        raise ValueError("stream_pingpong needs a CUDA device")
    out, finished = _start(prompt, max_new_tokens, eos)
    length = prompt.shape[1]
    cache = _static_cache(model, prompt, max_new_tokens)
    flag = _StopFlag(prompt.device)
    logits = _prefill(model, prompt, cache)
    positions = torch.arange(length, length + max_new_tokens, device=prompt.device)
    for step in range(max_new_tokens):
        token = _emit(logits, finished, eos)
        out[:, length + step] = token
        flag.send(finished)
        if flag.done() or step + 1 == max_new_tokens:
            break
        position = positions[step : step + 1]
        logits = model(token[:, None], **with_cache(cache), cache_position=position, use_cache=True).logits
    return out


class _GraphedStep:
    """One decode step (model forward, token choice, finished flags, output write) captured as a CUDA graph
    over static buffers; ``replay`` runs it for the position in ``self.position``."""

    def __init__(self, model: Any, cache: StaticCache, out: torch.Tensor, finished: torch.Tensor, eos: int) -> None:
        self.model, self.cache, self.out, self.finished, self.eos = model, cache, out, finished, eos
        device = out.device
        self.token = torch.zeros(out.shape[0], 1, dtype=out.dtype, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.column = torch.zeros(1, dtype=torch.long, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream())
        saved = self._save()
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up outside the graph (allocations, lazy inits)
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        self._restore(saved)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step()
        self._restore(saved)

    def _save(self) -> list[torch.Tensor]:
        return [t.clone() for t in (self.out, self.finished, self.token)]

    def _restore(self, saved: list[torch.Tensor]) -> None:
        for target, value in zip((self.out, self.finished, self.token), saved, strict=True):
            target.copy_(value)

    def _step(self) -> None:
        logits = self.model(self.token, **with_cache(self.cache), cache_position=self.position, use_cache=True).logits
        token = _emit(logits, self.finished, self.eos)
        self.out.index_copy_(1, self.column, token[:, None])
        self.token.copy_(token[:, None])


_GRAPHS: dict[tuple[int, tuple[int, ...], int], tuple[_GraphedStep, StaticCache]] = {}


@torch.inference_mode()
def cuda_graph(
    model: Any, prompt: torch.Tensor, max_new_tokens: int, eos: int, *, check_every: int = 8
) -> torch.Tensor:
    if prompt.device.type != "cuda":
        raise ValueError("cuda_graph needs a CUDA device")
    length = prompt.shape[1]
    key = (id(model), tuple(prompt.shape), max_new_tokens)
    if key not in _GRAPHS:  # one capture per model and shape, replayed by every later call
        out, finished = _start(prompt, max_new_tokens, eos)
        cache = StaticCache(config=model.config, max_cache_len=length + max_new_tokens)  # the graph's own
        _GRAPHS[key] = (_GraphedStep(model, cache, out, finished, eos), cache)
    graphed, cache = _GRAPHS[key]
    cache.reset()
    graphed.out.fill_(eos)
    graphed.out[:, :length] = prompt
    graphed.finished.zero_()
    flag = _StopFlag(prompt.device)
    logits = _prefill(model, prompt, cache)
    token = _emit(logits, graphed.finished, eos)
    graphed.out[:, length] = token
    graphed.token.copy_(token[:, None])
    for step in range(1, max_new_tokens):
        if step % check_every == 0:
            flag.send(graphed.finished)
            if flag.done():
                break
        graphed.position.fill_(length + step - 1)
        graphed.column.fill_(length + step)
        graphed.graph.replay()
    return graphed.out.clone()


@torch.inference_mode()
def hf_generate(model: Any, prompt: torch.Tensor, max_new_tokens: int, eos: int) -> torch.Tensor:
    generated = model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    out, _ = _start(prompt, max_new_tokens, eos)
    out[:, : generated.shape[1]] = generated
    return out


STRATEGIES: dict[str, Strategy] = {
    "no_cache": no_cache,
    "kv_cache": kv_cache,
    "static_cache": static_cache,
    "static_compiled": static_compiled,
    "stream_pingpong": stream_pingpong,
    "cuda_graph": cuda_graph,
    "hf_generate": hf_generate,
}
CUDA_ONLY = frozenset({"stream_pingpong", "cuda_graph"})
