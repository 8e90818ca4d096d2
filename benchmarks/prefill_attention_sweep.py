"""Which tile shape makes the prefill attention over a cached prefix fastest (PrefillAttention.SHAPES)?

Prefill attention over a cached prefix, alone, by (prefix, new tokens) and kernel shape (a development tool:
it picks prefill_attention.PrefillAttention's block sizes). 28 layers of the 1.5B's KV shape; GPU microseconds per
layer and the attention TFLOP/s reached (causal work only). SDPA's flash kernel on a fresh prompt of the same
total length is printed for scale.

usage: python -m benchmarks.prefill_attention_sweep [--json FILE]
"""

import argparse
import itertools
import json

import torch
import torch.nn.functional as F

from model_loader.kernels import gemv, prefill_attention
from model_loader.kernels.reference import keep_off_cudnn

LAYERS, HQ, HKV, D = 28, 12, 2, 128
CASES = (
    (0, 512),
    (0, 2048),
    (512, 1024),
    (512, 2048),
    (4096, 1024),
    (4096, 2048),
    (8192, 2048),
    (4096, 16),
    (8192, 256),
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    keep_off_cudnn()  # SDPA as r1desk's prefill runs it (never cuDNN's attention)
    max_ctx = max(s + t for s, t in CASES)
    k = torch.randn(LAYERS, HKV, max_ctx, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    shapes = [
        (bm, bn, w, st)
        for bm, bn, w, st in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3))
        if not (bm == 128 and bn == 128 and w == 4)
    ]
    kernels = {}
    for bm, bn, w, st in shapes:
        cls = type("Sweep", (prefill_attention.PrefillAttention,), {"SHAPES": ((None, (bm, bn, w, st)),)})
        kernels[(bm, bn, w, st)] = cls(HQ, HKV, D, "cuda", max_tokens=2048)
    rows = []
    for start, t in CASES:
        q = torch.randn(t, HQ, D, device="cuda", dtype=torch.bfloat16)
        start_t = torch.tensor([start], dtype=torch.int32, device="cuda")
        res = gemv.time_configs(
            list(range(LAYERS)), list(kernels), lambda i, c: kernels[c](q, k[i], v[i], start_t, D**-0.5)
        )
        flops = 4 * HQ * D * t * (start + (t + 1) / 2)
        q4 = q.transpose(0, 1)[None]
        sdpa = gemv.time_configs(
            list(range(LAYERS)),
            [None],
            lambda i, c: F.scaled_dot_product_attention(
                q4, k[i, :, :t][None], v[i, :, :t][None], is_causal=True, enable_gqa=True
            ),
        )
        best = sorted(res.items(), key=lambda kv: kv[1])
        for c, us in best:
            rows.append(
                {
                    "start": start,
                    "new": t,
                    "config": c,
                    "us_per_layer": round(us, 2),
                    "tflops": round(flops / us / 1e6, 1),
                }
            )
        tuned = next(shape for upto, shape in prefill_attention.PrefillAttention.SHAPES if upto is None or t <= upto)
        print(
            f"prefix {start:>5} + {t:>4} new: tuned {tuned} {res.get(tuned, float('nan')):.1f} us; "
            f"SDPA fresh {t} {sdpa.get(None, float('nan')):.1f} us; best "
            + "; ".join(f"{c} {us:.1f} us ({flops / us / 1e6:.0f} TF/s)" for c, us in best[:4]),
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
