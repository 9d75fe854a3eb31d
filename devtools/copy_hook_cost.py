"""How much of the probe's GPU overhead is the copy_ kernel: HF generate with and without it, interleaved."""

import statistics
import sys
import time
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import LlamaConfig, LlamaForCausalLM

import pytest_syncguard.probes.syncs as syncs

cfg = LlamaConfig(vocab_size=256, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=256, pad_token_id=0, bos_token_id=None, eos_token_id=None)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).cuda().eval()
prompt = torch.randint(1, 256, (1, 8), device="cuda")


def gen() -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    with torch.inference_mode():
        model.generate(prompt, max_new_tokens=64, min_new_tokens=64, do_sample=False)
    torch.cuda.synchronize()
    return time.perf_counter() - t


with profile(activities=[ProfilerActivity.CPU]) as prof:
    gen()
names = Counter(e.name for e in prof.events())
print("aten::copy_ per generate:", names["aten::copy_"], "aten ops:", sum(v for k, v in names.items() if k.startswith("aten::")))
full = syncs.CATALOGUE
without_copy = tuple(e for e in full if e.name != "copy_")


def inst(catalogue) -> float:
    syncs.CATALOGUE = catalogue
    with syncs.PROBE.recording(syncs.SyncRecorder(True)):
        return gen()


for _ in range(3):
    gen(); inst(full); inst(without_copy)
r_full, r_nocopy = [], []
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 15):
    b = gen(); f = inst(full); n = inst(without_copy)
    r_full.append(f / b); r_nocopy.append(n / b)
print(f"ratio with copy_ hook {statistics.median(r_full):.3f}; without {statistics.median(r_nocopy):.3f}")
