"""How fast does the decode attention's split kernel read the 16-bit and the 8-bit cache, alone, at one depth?

The kernel alone over each cache (random values), timed with CUDA events (GB/s of cache read) or launched for
Nsight Compute to read. A development tool, CUDA only:
  python -m benchmarks.ncu_decode_attention [--depth 32768]     (times each alone, in a CUDA graph)
  ncu --clock-control none -k regex:_decode_attn_split_kernel --launch-skip 12 --launch-count 1 \\
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \\
      python -m benchmarks.ncu_decode_attention --kv-cache 8-bit --ncu --calls 8
Shapes: DecodeAttention's candidates for the cache (decode_attention.DECODE_ATTN_CONFIGS, and KV8_CONFIGS for 8-bit);
--config N picks one (default: the split-per-SM shape for 16-bit, the two-per-SM one for 8-bit).
"""

import argparse

import torch

from model_loader.kernels import decode_attention
from model_loader.kv_cache import value_cache

HQ, HKV, D = 12, 2, 128  # DeepSeek-R1-Distill-Qwen-1.5B's attention
LAYERS = 8


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--depth", type=int, default=32768)
    ap.add_argument("--kv-cache", choices=("16-bit", "8-bit", "both"), default="both")
    ap.add_argument("--config", type=int, help="index into the cache's candidates")
    ap.add_argument("--calls", type=int, default=50, help="graph replays timed (--ncu: launches)")
    ap.add_argument("--ncu", action="store_true", help="plain launches, untimed (for Nsight Compute)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    max_ctx = args.depth + 64
    for kind in ("16-bit", "8-bit") if args.kv_cache == "both" else (args.kv_cache,):
        fp8 = kind == "8-bit"
        configs = decode_attention.DECODE_ATTN_CONFIGS + (decode_attention.KV8_CONFIGS if fp8 else ())
        config = configs[args.config if args.config is not None else (-1 if fp8 else 1)]
        attn = decode_attention.DecodeAttention(HQ, HKV, D, dev, torch.bfloat16, configs=configs)
        dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
        # LAYERS caches taken in turn, as the model's layers are: together over the 50 MB of an H100's L2
        k = torch.randn(LAYERS, HKV, max_ctx, D, device=dev).to(dtype)
        v = value_cache((LAYERS, HKV, max_ctx, D), dev, dtype, transposed=fp8)
        v.copy_(torch.randn(LAYERS, HKV, max_ctx, D, device=dev).to(dtype))
        scales = (torch.rand(LAYERS, HKV, max_ctx, device=dev) + 0.5) * 0.01
        q = torch.randn(HQ, D, device=dev, dtype=torch.bfloat16)
        pos = torch.tensor([args.depth - 1], device=dev, dtype=torch.int32)

        def run(layer: int):
            attn(
                q,
                k[layer],
                v[layer],
                pos,
                args.depth,
                D**-0.5,
                config=config,
                scales=(scales[layer], scales[layer]) if fp8 else None,
            )

        for i in range(LAYERS):
            run(i)
        torch.cuda.synchronize()
        if args.ncu:  # plain launches, for ncu to count and skip
            for i in range(args.calls):
                run(i % LAYERS)
            torch.cuda.synchronize()
            continue
        # Timed as a CUDA graph of one launch per cache: from Python each launch costs more host time (tens of
        # us) than the GPU takes, so back-to-back launches would time the host.
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(LAYERS):
                run(i)
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.calls):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        us = start.elapsed_time(end) * 1e3 / (args.calls * LAYERS)
        nbytes = HKV * args.depth * D * (2 if not fp8 else 1) * 2 + (HKV * args.depth * 8 if fp8 else 0)
        print(
            f"{kind} depth {args.depth}: {us:.2f} us a call (split + reduce), {nbytes / us / 1e3:.0f} GB/s of "
            f"cache; {attn.resolve(config)}"
        )


if __name__ == "__main__":
    main()
