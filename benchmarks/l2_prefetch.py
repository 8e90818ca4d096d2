"""Which L2 policy makes the decode step fastest: weights read evict_first (the app's) or not, and an L2 prefetch?

The prefetch: the next layer's K/V cache rows into L2 while the current layer's MLP runs (a development tool).

At depth a decode step reads the cache at about bandwidth (~4.6 TB/s on the H200), but the rest of the step
(the weight GEMVs, the small kernels between them) runs at ~2.7 TB/s on average: the GPU's memory is idle for part
of every step. This asks whether the cache read can use that idle part. After each layer's attention, a kernel on
a side stream (a branch of the CUDA graph, which nothing waits for until the step's end) issues
`prefetch.global.L2` for every 128-byte line of the next layer's rows [0, pos]; by the time that layer's attention
runs, its rows should be in L2. The weights can be read with the evict_first policy (gemv.GEMV_WEIGHT_EVICTION)
so that the 82 MB a layer's MLP streams do not push the prefetched rows out (the H200's L2 is 50-60 MB; a layer's
16-bit cache is 16.8 MB at 16k, 33.5 MB at 32k).

Nothing here is in the app: the benchmark wraps the model's decode attention for its graphs (prefetch_model).
usage: python -m benchmarks.l2_prefetch MODEL_DIR [--depths 512,4096,16384,32768] [--kv-cache 8-bit]
           [--variants base,wfirst,pf+wfirst,base] [--programs 132] [--json OUT]
A variant: "base" (no prefetch, every load with L2's default policy) or tokens joined by "+": wfirst (the GEMVs'
weights read evict_first: gemv.GEMV_WEIGHT_EVICTION), pf / pflast (the prefetch, its lines marked
evict_normal / evict_last).

H100, 2026-12-05: the prefetch made every depth slower (16k +30 us a step, 32k +110); the weights read evict_first
made every depth faster (1-3%), which the app now does. (The decode attention's own cache reads marked evict_first
as well changed nothing beyond the noise; that variant was taken out with its kernel setting.)
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

LINE = tl.constexpr(128)


@triton.jit
def _prefetch_l2(ptrs, EVICT_LAST: tl.constexpr):
    # a prefetch has no destination register: the thread goes on at once (the asm's output is a dummy)
    if EVICT_LAST:
        tl.inline_asm_elementwise(
            "prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;",
            "=r,l",
            [ptrs],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )
    else:
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
        )


@triton.jit
def _prefetch_segments(ptr, rows, segments, segment_stride, row_bytes, EVICT_LAST: tl.constexpr, BLOCK: tl.constexpr):
    # `segments` runs of rows * row_bytes bytes, segment_stride bytes apart, split by line over the programs
    base = ptr.to(tl.pointer_type(tl.int8))
    lines_per_segment = tl.cdiv(rows * row_bytes, LINE)
    total = segments * lines_per_segment
    for l0 in range(tl.program_id(0) * BLOCK, total, tl.num_programs(0) * BLOCK):
        line = l0 + tl.arange(0, BLOCK)
        line = tl.where(line < total, line, 0)  # past the end: line 0 again (harmless)
        segment = line // lines_per_segment
        offs = segment.to(tl.int64) * segment_stride + (line - segment * lines_per_segment).to(tl.int64) * LINE
        _prefetch_l2(base + offs, EVICT_LAST)


@triton.jit
def _prefetch_kv_kernel(
    k_ptr,
    v_ptr,
    pos_ptr,
    k_segments,
    k_stride,
    k_row_bytes,
    v_segments,
    v_stride,
    v_row_bytes,
    EVICT_LAST: tl.constexpr,
    BLOCK: tl.constexpr,
):
    rows = tl.load(pos_ptr) + 1
    if tl.program_id(1) == 0:
        _prefetch_segments(k_ptr, rows, k_segments, k_stride, k_row_bytes, EVICT_LAST, BLOCK)
    else:
        _prefetch_segments(v_ptr, rows, v_segments, v_stride, v_row_bytes, EVICT_LAST, BLOCK)


def segments_of(cache: torch.Tensor) -> tuple[int, int, int]:
    """(segments, stride in bytes, bytes a token) of one layer's [Hkv, tokens, D] cache view: a run of rows per KV
    head where the tokens are rows (stride D), a run per (head, dimension) where they are columns (V transposed)."""
    es = cache.element_size()
    heads, _, dims = cache.shape
    if cache.stride(2) == 1:  # row-major: [Hkv, max_ctx, D]
        return heads, cache.stride(0) * es, dims * es
    return heads * dims, cache.stride(2) * es, es  # transposed: token stride 1, a run per (head, dim)


class L2Prefetch:
    """Wraps a model's decode attention: after layer i's attention, the rows [0, pos] of layer i+1 (after the last
    layer: layer 0, for the next step) are prefetched on a side stream; join() before the step ends."""

    def __init__(self, model, evict_last: bool, programs: int, block: int = 256):
        self.model, self.inner = model, model.decode_attention
        self.evict_last, self.programs, self.block = evict_last, programs, block
        # high priority: its programs are dispatched ahead of the GEMVs' waiting ones (it issues and exits)
        self.stream = torch.cuda.Stream(device=model.device, priority=-1)
        self.layers = model.k_cache.shape[0]
        self.events = [torch.cuda.Event() for _ in range(self.layers)]
        self.layer_bytes = model.k_cache[0].numel() * model.k_cache.element_size()
        self.pos_t = None

    def __getattr__(self, name):  # the rest of DecodeAttention (candidates, resolve, ...)
        return getattr(self.inner, name)

    @property
    def config(self):
        return self.inner.config

    @config.setter
    def config(self, value):  # Qwen2Model.set_decode_attention_config
        self.inner.config = value

    def __call__(self, q, k_cache, v_cache, pos_t, length, scale, config=None, scales=None):
        out = self.inner(q, k_cache, v_cache, pos_t, length, scale, config=config, scales=scales)
        layer = (k_cache.data_ptr() - self.model.k_cache.data_ptr()) // self.layer_bytes
        nxt = (layer + 1) % self.layers
        main = torch.cuda.current_stream()
        self.events[layer].record(main)
        self.stream.wait_event(self.events[layer])
        k, v = self.model.k_cache[nxt], self.model.v_cache[nxt]
        with torch.cuda.stream(self.stream):
            _prefetch_kv_kernel[(self.programs, 2)](
                k, v, pos_t, *segments_of(k), *segments_of(v), EVICT_LAST=self.evict_last, BLOCK=self.block, num_warps=4
            )
        return out

    def join(self):
        torch.cuda.current_stream().wait_stream(self.stream)


def prefetch_model(model, evict_last: bool, programs: int):
    """Install an L2Prefetch on the model (its decode joins the side stream before returning); returns an undo."""
    wrapper = L2Prefetch(model, evict_last, programs)
    decode = model.decode

    def joined_decode(*args, **kwargs):
        out = decode(*args, **kwargs)
        wrapper.join()
        return out

    model.decode_attention, model.decode = wrapper, joined_decode

    def undo():
        model.decode_attention = wrapper.inner
        del model.decode  # the class's method again

    return undo


def main() -> None:
    from model_loader.engine import Engine
    from model_loader.kernels import gemv

    from benchmarks.profile_decode import time_graph

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--depths", default="512,4096,16384,32768")
    ap.add_argument("--kv-cache", default="16-bit")
    ap.add_argument("--variants", default="base,wfirst,base,wfirst")
    ap.add_argument("--programs", type=int, default=0, help="prefetch programs per tensor (0: the SM count)")
    ap.add_argument("--json")
    args = ap.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    engine = Engine.load(args.model, device="cuda", context_length=max(depths) + 512, kv_cache=args.kv_cache)
    engine.warm_up()
    step, model = engine.step, engine.model
    programs = args.programs or torch.cuda.get_device_properties(model.device).multi_processor_count
    print(
        f"{torch.cuda.get_device_name()}: L2 {torch.cuda.get_device_properties(model.device).L2_cache_size} bytes;"
        f" plan {[(upper, str(c)) for upper, c in step.plan]}",
        flush=True,
    )
    weights_default = gemv.GEMV_WEIGHT_EVICTION
    rows = {}
    for i, variant in enumerate(args.variants.split(",")):
        tokens = set(variant.split("+")) - {"base"}
        unknown = tokens - {"wfirst", "pf", "pflast"}
        if unknown:
            raise SystemExit(f"unknown variant part(s): {sorted(unknown)}")
        gemv.GEMV_WEIGHT_EVICTION = "evict_first" if "wfirst" in tokens else ""
        prefetch = tokens & {"pf", "pflast"}
        undo = prefetch_model(model, "pflast" in prefetch, programs) if prefetch else None
        step.graphs.clear()
        try:
            step.capture("greedy")
            times = {d: round(time_graph(step, step.graphs[("greedy", step.config_for(d + 1))], d), 1) for d in depths}
        finally:
            if undo:
                undo()
            gemv.GEMV_WEIGHT_EVICTION = weights_default
        rows[f"{i}:{variant}"] = times
        print(f"{variant:16s} " + " ".join(f"{us:8.1f}" for us in times.values()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "device": torch.cuda.get_device_name(), "step_us": rows}, f, indent=1)


if __name__ == "__main__":
    main()
