"""Calibration: runtime sync calls of each FACTS-table operation on CUDA vs dispatcher-level hook calls."""
import json, sys, warnings, collections, os
import torch
from torch._C import DispatchKey
from torch.profiler import profile, ProfilerActivity

after = torch._C._dispatch_keyset_full_after(DispatchKey.BackendSelect)
calls = []
depth = [0]
OPS = ["_local_scalar_dense", "nonzero", "masked_select", "repeat_interleave.Tensor", "equal", "bincount",
       "_unique2", "_unique", "unique_dim", "unique_consecutive", "histc", "copy_", "_to_copy", "index.Tensor",
       "index_put_", "_index_put_impl_", "nonzero_static", "argwhere", "is_nonzero", "item", "masked_scatter_", "_assert_async"]
lib = torch.library.Library("aten", "IMPL")
def mk(op):
    def hook(keyset, *args, **kwargs):
        info = {}
        if op._name == "aten::copy_":
            s, src = args[0], args[1]
            info = dict(dst=str(s.device), src=str(src.device), nb=bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False)),
                        dst_pinned=s.is_pinned() if s.device.type == "cpu" else None, src_pinned=src.is_pinned() if src.device.type == "cpu" else None)
        calls.append((op._name + ("." + op._overloadname if op._overloadname != "default" else ""), depth[0], info))
        depth[0] += 1
        try:
            return op.redispatch(keyset & after, *args, **kwargs)
        finally:
            depth[0] -= 1
    return hook
for name in OPS:
    base, _, ov = name.partition(".")
    pk = getattr(torch.ops.aten, base)
    op = getattr(pk, ov or "default")
    try:
        lib.impl(name, mk(op), "BackendSelect", with_keyset=True)
    except Exception as e:
        print("cannot hook", name, e)

dev = "cuda"
x = torch.randn(1000, device=dev)
mask = x > 0
pinned = torch.empty(1000).pin_memory()
pageable = torch.empty(1000)
small = torch.tensor([1, 2, 3], device=dev)
s0 = torch.tensor(3.0, device=dev)
ints = torch.randint(0, 10, (100,), device=dev)
ev = torch.cuda.Event(); ev.record()
st = torch.cuda.Stream()
probs = torch.softmax(torch.randn(4, 50, device=dev), -1)
cases = {
    "item": lambda: x.sum().item(),
    "bool": lambda: bool(x.sum() > 0),
    "int": lambda: int(s0),
    "float": lambda: float(s0),
    "fstring": lambda: f"{s0}",
    "tolist": lambda: x.tolist(),
    "cpu": lambda: x.cpu(),
    "to_cpu": lambda: x.to("cpu"),
    "to_cpu_nb": lambda: x.to("cpu", non_blocking=True),
    "copy_d2h_pageable": lambda: pageable.copy_(x),
    "copy_d2h_pinned": lambda: pinned.copy_(x),
    "copy_d2h_pageable_nb": lambda: pageable.copy_(x, non_blocking=True),
    "copy_d2h_pinned_nb": lambda: pinned.copy_(x, non_blocking=True),
    "h2d_pageable": lambda: pageable.to(dev),
    "h2d_pinned": lambda: pinned.to(dev),
    "h2d_pageable_nb": lambda: pageable.to(dev, non_blocking=True),
    "h2d_pinned_nb": lambda: pinned.to(dev, non_blocking=True),
    "copy_h2d_pageable": lambda: x.copy_(pageable),
    "copy_h2d_pageable_nb": lambda: x.copy_(pageable, non_blocking=True),
    "tensor_factory": lambda: torch.tensor([1, 2, 3], device=dev),
    "nonzero": lambda: torch.nonzero(x),
    "masked_select": lambda: torch.masked_select(x, mask),
    "unique": lambda: torch.unique(ints),
    "unique_sorted_inverse": lambda: torch.unique(ints, return_inverse=True, return_counts=True),
    "unique_dim": lambda: torch.unique(ints.view(10, 10), dim=0),
    "unique_consecutive": lambda: torch.unique_consecutive(ints),
    "where_1arg": lambda: torch.where(mask),
    "bool_index": lambda: x[mask],
    "bool_index_put": lambda: x.__setitem__(mask, 0.0),
    "argwhere": lambda: torch.argwhere(mask),
    "repeat_interleave": lambda: torch.repeat_interleave(small),
    "repeat_interleave_outsize": lambda: torch.repeat_interleave(small, output_size=6),
    "repeat_interleave_x": lambda: torch.repeat_interleave(x[:3], small, dim=0),
    "bincount": lambda: torch.bincount(ints),
    "histc": lambda: torch.histc(x, bins=10),
    "histc_range": lambda: torch.histc(x, bins=10, min=-1, max=1),
    "equal": lambda: torch.equal(x, x),
    "allclose": lambda: torch.allclose(x, x),
    "zeros_int": lambda: torch.zeros(int(s0)),
    "stream_sync": lambda: st.synchronize(),
    "current_stream_sync": lambda: torch.cuda.current_stream().synchronize(),
    "cuda_sync": lambda: torch.cuda.synchronize(),
    "accel_sync": lambda: torch.accelerator.synchronize(),
    "event_sync": lambda: ev.synchronize(),
    "argmax": lambda: x.argmax(),
    "multinomial": lambda: torch.multinomial(probs, 1),
    "any": lambda: x.any(),
    "all": lambda: x.all(),
    "topk": lambda: x.topk(5),
    "masked_scatter": lambda: x.clone().masked_scatter_(mask, x),
    "max": lambda: x.max(),
    "arange_tensor": lambda: torch.arange(s0),
    "index_tensor": lambda: x[ints],
    "sort": lambda: x.sort(),
    "cumsum": lambda: x.cumsum(0),
}
RT = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"}
out = {}
for name, fn in cases.items():
    fn(); torch.cuda.synchronize()
    calls.clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    names = collections.Counter(e.name for e in prof.events())
    rt = {k: v for k, v in names.items() if k.startswith("cuda") and not k.startswith("cudaLaunch") and k not in ("cudaGetDeviceCount","cudaGetDevice","cudaDeviceGetAttribute","cudaPeekAtLastError","cudaGetLastError")}
    mem = {k: v for k, v in names.items() if k.startswith("Memcpy") or k.startswith("Memset")}
    out[name] = dict(runtime_syncs=sum(names[k] for k in RT), rt=rt, mem=mem,
                     warn=sum("synchroniz" in str(m.message) for m in w), hooks=calls[:])
    print(f"{name:28s} rt={out[name]['runtime_syncs']} warn={out[name]['warn']} hooks={[(c[0], c[1]) for c in calls]} {rt} {mem}", flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "calib.json"), "w"), indent=1, default=str)

# HF generate on a tiny random-init Llama
import time
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(vocab_size=256, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=256, pad_token_id=0, eos_token_id=None, bos_token_id=None)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).to(dev).eval()
ids = torch.randint(1, 256, (1, 8), device=dev)
def gen():
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=64, min_new_tokens=64, do_sample=False)
gen(); torch.cuda.synchronize()
calls.clear()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    gen()
names = collections.Counter(e.name for e in prof.events())
print("generate: rt", {k: names[k] for k in RT}, "lsd", names["aten::_local_scalar_dense"],
      "hooks", collections.Counter((c[0], c[1]) for c in calls), flush=True)
print("copies", [c for c in calls if c[0] == "aten::copy_"][:10])
# overhead: hooks installed vs destroyed, interleaved
def timeit(n=5):
    torch.cuda.synchronize(); t = time.perf_counter(); gen(); torch.cuda.synchronize(); return time.perf_counter() - t
lib._destroy()
import statistics
ratios = []
for i in range(7):
    bare = timeit()
    lib2 = torch.library.Library("aten", "IMPL")
    for name in ["_local_scalar_dense", "nonzero", "masked_select", "repeat_interleave.Tensor", "equal", "bincount", "_unique2", "copy_"]:
        base, _, ov = name.partition(".")
        lib2.impl(name, mk(getattr(getattr(torch.ops.aten, base), ov or "default")), "BackendSelect", with_keyset=True)
    inst = timeit()
    lib2._destroy()
    ratios.append(inst / bare)
    print(f"bare {bare*1e3:.1f} ms hooked {inst*1e3:.1f} ms", flush=True)
print("median ratio", statistics.median(ratios))
