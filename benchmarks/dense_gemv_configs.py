"""Which configurations of our single-token dense GEMV are fastest (gemv.GEMV_CONFIGS), against cuBLAS?

Our single-token dense GEMV by configuration, against cuBLAS, on the 1.5B's shapes (random weights, 28 of
each so every read comes from HBM as in decoding), GPU time per call through CUDA graphs (gemv.time_configs,
what the warm-up's tuning measures), programmatic dependent launch as the decode step runs it.

Two questions:
- the MLP's gate/up weight with its rows in pairs, the GEMV writing SiLU(gate) * up itself, against the GEMV
  followed by the separate SiLU kernel (the decode step until now; decode_kernel_bounds.py put that kernel at 25 us a
  step on the H200), and cuBLAS + the SiLU kernel;
- splitting K across programs (fp32 partials, summed by the last split to finish) for the down projection (K =
  8,960: without a split its programs each stream 8,960 columns) and the others.

usage: python -m benchmarks.dense_gemv_configs [--dtype bf16] [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from model_loader.kernels import gemv, small_ops
from model_loader.linears import pair_gate_up_rows

LAYERS = 28
SHAPES = {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960)}


def sweep(k: int) -> list[tuple]:
    configs = list(gemv.GEMV_CONFIGS)
    split_counts = (1, 2, 3) if k <= 2048 else (1, 2, 3, 4, 5, 7, 9)
    for block_n, block_k, warps, splits in itertools.product((4, 8, 16, 32), (256, 512), (4, 8), split_counts):
        config = (block_n, block_k, warps, splits) if splits > 1 else (block_n, block_k, warps)
        if config not in configs and gemv.gemv_split(k, config)[1] == splits:
            configs.append(config)
    return configs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--json")
    args = ap.parse_args()
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    dev = torch.device("cuda")
    gemv.split_counters(dev)
    g = torch.Generator(device=dev).manual_seed(0)
    results = {}
    for name, (n, k) in SHAPES.items():
        ws = [torch.randn(n, k, device=dev, dtype=dt, generator=g) * 0.02 for _ in range(LAYERS)]
        x = torch.randn(1, k, device=dev, dtype=dt, generator=g)
        ref = F.linear(x.float(), ws[0].float())
        table = {}
        configs = sweep(k)
        if name == "gate_up":
            for w in ws:
                pair_gate_up_rows(w)
            ref = small_ops.silu_mul(F.linear(x, ws[0]), paired=True).float()
            table["cuBLAS + SiLU kernel"] = gemv.time_configs(
                ws, [None], lambda w, c: small_ops.silu_mul(F.linear(x, w), paired=True)
            )[None]
            separate = gemv.time_configs(ws, configs, lambda w, c: small_ops.silu_mul(gemv.gemv(x, w, c), paired=True))
            for c, us in separate.items():
                table[f"{c} + SiLU kernel"] = us
            fused = gemv.time_configs(ws, configs, lambda w, c: gemv.gemv(x, w, c, silu_output=True))
            for c, us in fused.items():
                err = (gemv.gemv(x, ws[0], c, silu_output=True).float() - ref).abs().max().item()
                table[f"{c} SiLU output"] = us
                assert err < 0.05, (c, err)
        else:
            table["cuBLAS"] = gemv.time_configs(ws, [None], lambda w, c: F.linear(x, w))[None]
            timed = gemv.time_configs(ws, configs, lambda w, c: gemv.gemv(x, w, c))
            for c, us in timed.items():
                err = (gemv.gemv(x, ws[0], c).float() - ref).abs().max().item()
                assert err < 0.05 * max(1.0, ref.abs().max().item()), (c, err)
                table[str(c)] = us
        ranked = sorted(table.items(), key=lambda item: item[1])
        results[f"{name} {n}x{k}"] = {label: round(us, 2) for label, us in ranked}
        print(f"{name} {n} x {k}: " + ", ".join(f"{label} {us:.2f}" for label, us in ranked[:12]), flush=True)
        for label in (
            ("cuBLAS", "cuBLAS + SiLU kernel")
            + tuple(str(c) for c in gemv.GEMV_CONFIGS)
            + tuple(f"{c} + SiLU kernel" for c in gemv.GEMV_CONFIGS)
        ):
            if label in table:
                print(f"    {label}: {table[label]:.2f} us", flush=True)
        del ws
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
