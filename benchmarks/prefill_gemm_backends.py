"""The prefill's GEMMs (a follow-up of 2,048 new tokens: M = 2,048 rows through the 1.5B's four weight shapes, 28
weights of each) under torch's BLAS back-ends: cuBLAS (the default) and cuBLASLt
(torch.backends.cuda.preferred_blas_library), GPU time per GEMM through CUDA graphs, and TFLOP/s.

Why (2026-12-04, fourteenth session): the follow-up bar (<= 10 ms for 2,048 new tokens) is 0.8 ms away, and the
GEMMs are 6.9 ms of the 10.7 ms graph at ~774 TFLOP/s; the O and down projections have only 1,536 outputs (at
128 x 128 tiles 192 tiles on 132 SMs: 1.45 waves).

--kernels (fifteenth session) names the kernels each GEMM launches: the follow-up graph's QKV GEMM comes with a
memset (cuBLAS), and the GPU idles ~3.5 us between that memset and the GEMM.

--split-gate-up PARTS (fifteenth session, not yet run on a GPU) times the gate/up GEMM cut into PARTS GEMMs
writing column slices of one output, to see whether cuBLAS then plans it without that memset.

usage: python benchmarks/prefill_gemm_backends.py [--rows 2048,1024] [--kernels] [--split-gate-up 2]
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
    ap.add_argument("--split-gate-up", type=int, default=0, metavar="PARTS",
                    help="also the gate/up GEMM cut into PARTS GEMMs along its outputs, each writing its columns "
                         "of one output buffer, + SiLU·mul, against the whole GEMM + SiLU·mul (cuBLAS)")
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
        if args.split_gate_up:
            split_gate_up(weights["gate_up"], xs["gate_up"], args.split_gate_up, args.kernels)
    torch.backends.cuda.preferred_blas_library("cublas")


def gate_up_in_parts(x: torch.Tensor, w: torch.Tensor, parts: int, out: torch.Tensor) -> torch.Tensor:
    """x @ w.T written part by part: rows [i * n / parts, (i + 1) * n / parts) of the weight into the same
    columns of `out` (a column slice of a row-major matrix is a matrix with a leading dimension to cuBLAS: no
    copy). With the rows in (gate, up) pairs and n / parts even, every part holds whole pairs."""
    n = w.shape[0]
    step = n // parts
    for i in range(parts):
        torch.mm(x, w[i * step:(i + 1) * step].t(), out=out[:, i * step:(i + 1) * step])
    return out


def split_gate_up(ws: list, x: torch.Tensor, parts: int, list_kernels: bool) -> None:
    """Why (fifteenth session): cuBLAS launches a memset before the whole gate/up GEMM (N = 17,920) and the GPU
    idles ~3.5 us after it in the follow-up graph (~0.13 ms of a 2,048-token follow-up); smaller GEMMs may be
    planned without it."""
    rows = x.shape[0]
    out = torch.empty((rows, ws[0].shape[0]), device=x.device, dtype=x.dtype)
    assert ws[0].shape[0] % (2 * parts) == 0, "every part must hold whole (gate, up) pairs"
    whole = T.time_configs(ws, [None], lambda w, c: T.silu_mul(F.linear(x, w), paired=True))[None]
    cut = T.time_configs(ws, [None], lambda w, c: T.silu_mul(gate_up_in_parts(x, w, parts, out), paired=True))[None]
    diff = (gate_up_in_parts(x, ws[0], parts, out).float() - F.linear(x, ws[0]).float()).abs().max().item()
    print(f"M={rows} gate/up + SiLU·mul: whole {whole:.1f} us, in {parts} parts {cut:.1f} us "
          f"(max |diff| of the GEMM {diff:.2e})", flush=True)
    if list_kernels:
        launched = kernel_totals(lambda: gate_up_in_parts(x, ws[0], parts, out), 5)
        print(f"  in {parts} parts: " + "; ".join(f"{k} {v['us']:.1f} us x{v['launches']}"
                                                  for k, v in launched.items()), flush=True)


if __name__ == "__main__":
    main()
