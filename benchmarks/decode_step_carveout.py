"""Does reconfiguring the SMs' shared memory / L1 split cost the decode step time (a development tool)?

The split-per-SM decode attention asks for 139,520 bytes of shared memory a program, so Triton marks it "prefer
shared"; the other decode kernels take a few KB and leave the carveout to the driver. This times each decode
attention candidate's whole-step graph by depth with every Triton kernel's preferred carveout at the driver's
default (-1), then at the most shared memory (100), twice each (drift check).
H200, 2026-12-05 (BENCHMARKS, eighteenth session): max shared made the split-per-SM step 60 us faster at 512
tokens and 16 at 4,096, nothing at 16k or 32k, and the 32-split shape (the 512 bucket's) 5 us slower: not kept.
usage: python benchmarks/decode_step_carveout.py MODEL_DIR   (libcuda via ctypes; Linux)"""
import ctypes, sys
import torch
import triton
from triton.runtime.jit import JITFunction
from model_loader.engine import Engine
from model_loader.kernels import jit_int4, jit_ops, jit_sampler, triton_ops
from profile_decode import time_graph

cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
CARVEOUT = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT

def kernels():
    for mod in (jit_ops, jit_int4, jit_sampler):
        for fn in vars(mod).values():
            if isinstance(fn, JITFunction):
                for cache in fn.device_caches.values():
                    for k in cache[0].values():
                        yield k

def set_all(value):
    n = bad = 0
    for k in kernels():
        try:
            k._init_handles()
        except Exception:
            continue
        rc = cuda.cuFuncSetAttribute(ctypes.c_void_p(k.function), CARVEOUT, value)
        n += 1; bad += rc != 0
    return n, bad

current = {"v": None}
def hook(module, function, name, group, hsh):
    if current["v"] is not None:
        cuda.cuFuncSetAttribute(ctypes.c_void_p(function), CARVEOUT, current["v"])
triton.knobs.runtime.kernel_load_end_hook.add(hook)

model = sys.argv[1]
depths = [512, 4096, 16384, 32768]
e = Engine.load(model, device="cuda", context_length=max(depths) + 512)
e.warm_up()
step = e.step
configs = list(triton_ops.decode_attention_candidates(e.model.device, e.model.linear.int4_gemv))
for label, value in (("default", -1), ("max_shared", 100), ("default", -1), ("max_shared", 100)):
    current["v"] = value
    print(label, "kernels set:", set_all(value), flush=True)
    step.graphs.clear()
    for config in configs:
        step.plan = [(e.model.max_ctx, config)]
        step.capture("greedy")
        g = step.graphs[("greedy", config)]
        row = [time_graph(step, g, d) for d in depths]
        print(f"  {label:10s} {str(config)[:60]:60s} " + " ".join(f"{us:8.1f}" for us in row), flush=True)
