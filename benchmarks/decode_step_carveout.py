"""Does reconfiguring the SMs' shared memory / L1 split cost the decode step time (a development tool)?

The split-per-SM decode attention asks for 139,520 bytes of shared memory a program, so Triton marks it "prefer
shared"; the other decode kernels take a few KB and leave the carveout to the driver. This times each decode
attention candidate's whole-step graph by depth with every Triton kernel's preferred carveout at the driver's
default (-1), then at the most shared memory (100), twice each (drift check).
H200, 2026-12-05 (BENCHMARKS, eighteenth session): max shared made the split-per-SM step 60 us faster at 512
tokens and 16 at 4,096, nothing at 16k or 32k, and the 32-split shape (the 512 bucket's) 5 us slower: not kept.
usage: python benchmarks/decode_step_carveout.py MODEL_DIR   (libcuda via ctypes; Linux)"""
import ctypes
import sys

import triton
from triton.runtime.jit import JITFunction

from model_loader.engine import Engine
from model_loader.kernels import jit_int4, jit_ops, jit_sampler
from profile_decode import time_graph  # benchmarks/ is on the path when run as a script

CARVEOUT = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
DEPTHS = (512, 4096, 16384, 32768)


def driver():
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    return lib


def loaded_kernels():
    """Every compiled kernel of r1desk's Triton modules that this process has loaded or may load."""
    for module in (jit_ops, jit_int4, jit_sampler):
        for fn in vars(module).values():
            if isinstance(fn, JITFunction):
                for cache in fn.device_caches.values():
                    yield from cache[0].values()


def set_carveout(cuda, value: int) -> tuple[int, int]:
    """(kernels set, refusals) after asking every loaded kernel for `value` (-1: the driver's choice)."""
    n = refused = 0
    for kernel in loaded_kernels():
        try:
            kernel._init_handles()
        except Exception:  # one this GPU can't run (more shared memory than it has): never launched
            continue
        refused += cuda.cuFuncSetAttribute(ctypes.c_void_p(kernel.function), CARVEOUT, value) != 0
        n += 1
    return n, refused


def main() -> None:
    cuda = driver()
    current = {"value": None}

    def on_load(module, function, *_):  # kernels loaded later (graph capture) get the same preference
        if current["value"] is not None:
            cuda.cuFuncSetAttribute(ctypes.c_void_p(function), CARVEOUT, current["value"])

    triton.knobs.runtime.kernel_load_end_hook.add(on_load)
    engine = Engine.load(sys.argv[1], device="cuda", context_length=max(DEPTHS) + 512)
    engine.warm_up()
    step = engine.step
    configs = list(engine.model.decode_attention_candidates())
    for label, value in (("default", -1), ("max_shared", 100), ("default", -1), ("max_shared", 100)):
        current["value"] = value
        print(label, "kernels set, refused:", set_carveout(cuda, value), flush=True)
        step.graphs.clear()  # captured anew with the new preference
        for config in configs:
            step.plan = [(engine.model.max_ctx, config)]
            step.capture("greedy")
            graph = step.graphs[("greedy", config)]
            row = [time_graph(step, graph, d) for d in DEPTHS]
            print(f"  {label:10s} {str(config)[:60]:60s} " + " ".join(f"{us:8.1f}" for us in row), flush=True)


if __name__ == "__main__":
    main()
