"""The prefill's GEMMs (a follow-up of 2,048 new tokens: M = 2,048 rows through the 1.5B's four weight shapes, 28
weights of each) under torch's BLAS back-ends: cuBLAS (the default) and cuBLASLt
(torch.backends.cuda.preferred_blas_library), GPU time per GEMM through CUDA graphs, and TFLOP/s.

Why (2026-12-04, fourteenth session): the follow-up bar (<= 10 ms for 2,048 new tokens) is 0.8 ms away, and the
GEMMs are 6.9 ms of the 10.7 ms graph at ~774 TFLOP/s; the O and down projections have only 1,536 outputs (at
128 x 128 tiles 192 tiles on 132 SMs: 1.45 waves).

--kernels (fifteenth session) names the kernels each GEMM launches: the follow-up graph's QKV GEMM comes with a
memset (cuBLAS), and the GPU idles ~3.5 us between that memset and the GEMM.

usage: python benchmarks/prefill_gemm_backends.py [--rows 2048,1024] [--kernels]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model_loader.kernels import triton_ops as T  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_decode import kernel_totals  # noqa: E402

LAYERS = 28
SHAPES = {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="2048,1024")
    ap.add_argument("--kernels", action="store_true",
                    help="also list the kernels (and memsets) each GEMM launches under each back-end")
    args = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    weights = {name: [torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=g) * 0.02
                      for _ in range(LAYERS)] for name, (n, k) in SHAPES.items()}
    for rows in (int(r) for r in args.rows.split(",")):
        xs = {name: torch.randn(rows, k, device=dev, dtype=torch.bfloat16, generator=g) for name, (_, k) in
              SHAPES.items()}
        for backend in ("cublas", "cublaslt", "cublas"):
            torch.backends.cuda.preferred_blas_library(backend)
            total = 0.0
            line = []
            for name, (n, k) in SHAPES.items():
                us = T.time_configs(weights[name], [None], lambda w, c, x=xs[name]: F.linear(x, w))[None]
                total += us
                if args.kernels:
                    launched = kernel_totals(lambda x=xs[name], w=weights[name][0]: F.linear(x, w), 5)
                    print(f"  M={rows} {backend} {name}: " + "; ".join(
                        f"{k} {v['us']:.1f} us x{v['launches']}" for k, v in launched.items()), flush=True)
                line.append(f"{name} {us:.1f} us ({2 * rows * n * k / us / 1e6:.0f} TFLOP/s)")
            print(f"M={rows} {backend}: " + ", ".join(line) + f"; per layer {total:.1f} us", flush=True)
    torch.backends.cuda.preferred_blas_library("cublas")


if __name__ == "__main__":
    main()
