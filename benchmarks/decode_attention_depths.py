"""Which decode-attention kernel configuration is fastest alone at each context depth (CUDA GPU)?

A development tool: it picks the candidates in decode_attention.DECODE_ATTN_CONFIGS. 28 layers' worth of KV cache of
the 1.5B's shape, each layer's read once per timed call, so the reads come from HBM as in decoding. Prints GPU
microseconds per layer and the share of HBM bandwidth the KV read reaches.

    python -m benchmarks.decode_attention_depths [--depths 512,4096,16384,32768] [--json FILE]
"""

import argparse
import itertools
import json

import torch

from model_loader.kernels import decode_attention, gemv

LAYERS, HQ, HKV, D = 28, 12, 2, 128


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--depths", default="512,1024,4096,8192,16384,32768")
    ap.add_argument("--json")
    args = ap.parse_args()
    depths = [int(x) for x in args.depths.split(",")]
    max_ctx = max(depths)
    k = torch.randn(LAYERS, HKV, max_ctx, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    configs = list(
        dict.fromkeys(
            list(decode_attention.DECODE_ATTN_CONFIGS)
            + [
                decode_attention.DecodeAttnConfig(s, m, b, w, st)
                for s, m, b, w, st in itertools.product(
                    (32, 64, 128), (32, 64, 128, 256), (32, 64, 128), (4, 8), (3, 4)
                )
                if m >= b
            ]
        )
    )
    attn = decode_attention.DecodeAttention(HQ, HKV, D, "cuda", torch.bfloat16, configs=configs)
    q = torch.randn(HQ, D, device="cuda", dtype=torch.bfloat16)
    pos_t = torch.zeros(1, dtype=torch.int32, device="cuda")
    rows = []
    for depth in depths:
        pos_t.fill_(depth - 1)
        res = gemv.time_configs(
            list(range(LAYERS)), configs, lambda i, c: attn(q, k[i], v[i], pos_t, depth, D**-0.5, config=c)
        )
        kv_bytes = 2 * HKV * depth * D * 2
        for c, us in sorted(res.items(), key=lambda kv: kv[1]):
            rows.append(
                {
                    "depth": depth,
                    "config": str(c),
                    "us_per_layer": round(us, 2),
                    "kv_gb_s": round(kv_bytes / us / 1e3, 1),
                    "splits": decode_attention.decode_splits(attn.resolve(c), depth),
                }
            )
        best = sorted(res.items(), key=lambda kv: kv[1])[:5]
        default = res.get(decode_attention.DECODE_ATTN_CONFIGS[0])
        print(
            f"depth {depth:>6}: default {default:.2f} us; best: "
            + "; ".join(f"{c} {us:.2f} us ({kv_bytes / us / 1e3:.0f} GB/s)" for c, us in best),
            flush=True,
        )
    for c in decode_attention.DECODE_ATTN_CONFIGS:
        print(
            f"candidate {c}: " + ", ".join(f"{r['depth']}={r['us_per_layer']}" for r in rows if r["config"] == str(c))
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
