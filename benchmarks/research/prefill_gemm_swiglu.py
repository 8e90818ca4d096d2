"""Can a Triton gate/up GEMM writing SiLU(gate) * up in its epilogue beat cuBLAS + the SiLU·mul kernel in a prefill?

A prefill's gate/up projection with SiLU(gate) * up in the GEMM's epilogue (Triton) against what runs now:
cuBLAS's GEMM writing all 2 x 8,960 outputs, then the SiLU·mul kernel reading them back
(silu_mul(paired=True)). GPU time per layer through CUDA graphs over 28 weights (so weights come from HBM),
rows M = 2,048 / 1,024 / 512 (a follow-up's new tokens), the 1.5B's gate/up weight (17,920 x 1,536, rows in
(gate, up) pairs as linears.pair_gate_up_rows stores them on the Triton path).

Why: the follow-up bar (<= 10 ms for 2,048 new tokens) is 0.1-0.7 ms away; the
SiLU·mul kernel is ~0.74 ms of that graph (27 layers x 2,048 x 17,920 bf16 read, half that written: at HBM
bandwidth already), so only not writing and re-reading the gate/up output can remove it.

Result (docs/BENCHMARKS.md, "Tried and rejected"): no gain on an H200. The best fused kernel ((128, 64, 64,
4 warps, 3 stages) with TMA, or persistent (128, 128, 64, 8, 3), with or without Triton's warp specialization) ties
cuBLAS + SiLU·mul at M = 2,048 (175-179 us against 178-180) and loses at 1,024 and 512: Triton's GEMM reaches
~630-645 TFLOP/s where cuBLAS reaches 710-736, which eats what the fusion saves. Kept as a benchmark, not in the
app.

usage: python -m benchmarks.research.prefill_gemm_swiglu [--rows 2048,1024,512] [--configs all]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from model_loader.kernels import gemv, small_ops

LAYERS = 28
N, K = 17920, 1536
# (BLOCK_M, BLOCK_N outputs = 2 x BLOCK_N weight rows, BLOCK_K, num_warps, num_stages)
SWIGLU_CONFIGS = ((128, 128, 64, 8, 3), (128, 64, 64, 4, 4))


@triton.jit
def _tile_of(tile, blocks_m, blocks_n, GROUP_M: tl.constexpr):
    per_group = GROUP_M * blocks_n
    first_m = (tile // per_group) * GROUP_M
    group_rows = tl.minimum(blocks_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % group_rows, (tile % per_group) // group_rows


@triton.jit
def _gemm_swiglu_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    N2,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    TMA: tl.constexpr,
):
    # out[M, N2] = SiLU(x @ gate.T) * (x @ up.T) for a gate/up weight whose rows come in (gate j, up j) pairs
    # (linears.pair_gate_up_rows), so that row j of the weight viewed as [N2, 2K] is gate j's K inputs followed
    # by up j's: the gate and up tiles of a block of outputs are two tiles of that view, K columns apart, and
    # the two accumulators share one layout, so the epilogue is elementwise. Each product is rounded to the
    # output's dtype before the SiLU, as the separate kernels round.
    # TMA: x_ptr, w_ptr and out_ptr are tensor descriptors of x [M, K], the weight as [N2, 2K] and out [M, N2]
    # (K a multiple of BLOCK_K, or the gate tile would run into the up half). Otherwise contiguous tensors.
    pid_m, pid_n = _tile_of(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N2, BLOCK_N), GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    rm = off_m + tl.arange(0, BLOCK_M)
    rn = off_n + tl.arange(0, BLOCK_N)
    for k0 in range(0, K, BLOCK_K):
        if TMA:
            a = x_ptr.load([off_m, k0])
            g = w_ptr.load([off_n, k0])
            u = w_ptr.load([off_n, K + k0])
        else:
            rk = k0 + tl.arange(0, BLOCK_K)
            k_mask = rk[None, :] < K
            a = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & k_mask, other=0.0)
            w_rows = w_ptr + rn[:, None] * (2 * K) + rk[None, :]
            w_mask = (rn[:, None] < N2) & k_mask
            g = tl.load(w_rows, mask=w_mask, other=0.0)
            u = tl.load(w_rows + K, mask=w_mask, other=0.0)
        acc_g = tl.dot(a, g.T, acc_g)
        acc_u = tl.dot(a, u.T, acc_u)
    if TMA:
        out_ty = out_ptr.dtype
    else:
        out_ty = out_ptr.dtype.element_ty
    gate = acc_g.to(out_ty).to(tl.float32)
    up = acc_u.to(out_ty).to(tl.float32)
    y = (gate / (1.0 + tl.exp(-gate)) * up).to(out_ty)
    if TMA:
        out_ptr.store([off_m, off_n], y)
    else:
        tl.store(out_ptr + rm[:, None] * N2 + rn[None, :], y, mask=(rm[:, None] < M) & (rn[None, :] < N2))


def gemm_swiglu(x: torch.Tensor, w: torch.Tensor, config: tuple, tma: bool) -> torch.Tensor:
    """x [M, K] @ a paired gate/up weight w [2 * N2, K] -> SiLU(gate) * up [M, N2] in x's dtype."""
    m, k = x.shape
    n2 = w.shape[0] // 2
    block_m, block_n, block_k, warps, stages = config
    out = torch.empty((m, n2), device=x.device, dtype=x.dtype)
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        assert k % block_k == 0, "the gate tile would run into the up half"
        args = (
            TensorDescriptor.from_tensor(x, [block_m, block_k]),
            TensorDescriptor.from_tensor(w.view(n2, 2 * k), [block_n, block_k]),
            TensorDescriptor.from_tensor(out, [block_m, block_n]),
        )
    else:
        args = (x, w, out)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n2, block_n),)
    _gemm_swiglu_kernel[grid](
        *args,
        m,
        n2,
        k,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        GROUP_M=8,
        TMA=tma,
        num_warps=warps,
        num_stages=stages,
    )
    return out


@triton.jit
def _store_swiglu(out_desc, off_m, off_n, acc_g, acc_u):
    gate = acc_g.to(out_desc.dtype).to(tl.float32)  # rounded as the separate kernels round
    up = acc_u.to(out_desc.dtype).to(tl.float32)
    out_desc.store([off_m, off_n], (gate / (1.0 + tl.exp(-gate)) * up).to(out_desc.dtype))


@triton.jit
def _swiglu_ws_kernel(
    x_desc,
    w_desc,
    out_desc,
    M,
    N2,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr,
    PERSISTENT: tl.constexpr,
    WS: tl.constexpr,
    FLATTEN: tl.constexpr,
):
    # Experimental variants of jit_gemm._gemm_swiglu_kernel (TMA only): persistent programs walking the tiles
    # (the epilogue of one tile can overlap the next one's loads) and/or Triton's warp specialization.
    blocks_m = tl.cdiv(M, BLOCK_M)
    blocks_n = tl.cdiv(N2, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    if PERSISTENT:
        for tile in tl.range(tl.program_id(0), blocks_m * blocks_n, NUM_SMS, flatten=FLATTEN, warp_specialize=WS):
            pid_m, pid_n = _tile_of(tile, blocks_m, blocks_n, GROUP_M)
            off_m = pid_m * BLOCK_M
            off_n = pid_n * BLOCK_N
            acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for ki in range(k_tiles):
                a = x_desc.load([off_m, ki * BLOCK_K])
                acc_g = tl.dot(a, w_desc.load([off_n, ki * BLOCK_K]).T, acc_g)
                acc_u = tl.dot(a, w_desc.load([off_n, K + ki * BLOCK_K]).T, acc_u)
            _store_swiglu(out_desc, off_m, off_n, acc_g, acc_u)
    else:
        pid_m, pid_n = _tile_of(tl.program_id(0), blocks_m, blocks_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in tl.range(0, k_tiles, warp_specialize=WS):
            a = x_desc.load([off_m, ki * BLOCK_K])
            acc_g = tl.dot(a, w_desc.load([off_n, ki * BLOCK_K]).T, acc_g)
            acc_u = tl.dot(a, w_desc.load([off_n, K + ki * BLOCK_K]).T, acc_u)
        _store_swiglu(out_desc, off_m, off_n, acc_g, acc_u)


def swiglu_variant(x, w, config, persistent: bool, ws: bool, flatten: bool):
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = x.shape
    n2 = w.shape[0] // 2
    block_m, block_n, block_k, warps, stages = config
    out = torch.empty((m, n2), device=x.device, dtype=x.dtype)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n2, block_n)
    grid = (min(sms, tiles) if persistent else tiles,)
    _swiglu_ws_kernel[grid](
        TensorDescriptor.from_tensor(x, [block_m, block_k]),
        TensorDescriptor.from_tensor(w.view(n2, 2 * k), [block_n, block_k]),
        TensorDescriptor.from_tensor(out, [block_m, block_n]),
        m,
        n2,
        k,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        GROUP_M=8,
        NUM_SMS=sms,
        PERSISTENT=persistent,
        WS=ws,
        FLATTEN=flatten,
        num_warps=warps,
        num_stages=stages,
    )
    return out


VARIANTS = {
    "persistent": (True, False, False),
    "persistent+flatten": (True, False, True),
    "persistent+ws": (True, True, False),
    "persistent+ws+flatten": (True, True, True),
    "ws": (False, True, False),
}

EXTRA_CONFIGS = (
    (128, 128, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 64, 64, 4, 4),
    (128, 64, 64, 4, 3),
    (64, 128, 64, 4, 4),
    (128, 64, 128, 4, 3),
    (128, 128, 32, 8, 5),
    (64, 64, 64, 4, 5),
    (128, 64, 64, 8, 4),
    (256, 64, 64, 8, 3),
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="2048,1024,512")
    ap.add_argument("--configs", default="all", help="'all' (the kept ones and the extra ones) or 'kept'")
    ap.add_argument("--variants", default="", help="comma-separated VARIANTS names to time too (TMA only)")
    ap.add_argument("--no-plain", action="store_true", help="leave out the production kernel's TMA/pointer runs")
    args = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16, generator=g) * 0.02 for _ in range(LAYERS)]
    configs = tuple(dict.fromkeys(SWIGLU_CONFIGS + (EXTRA_CONFIGS if args.configs == "all" else ())))
    for rows in (int(r) for r in args.rows.split(",")):
        x = torch.randn(rows, K, device=dev, dtype=torch.bfloat16, generator=g)
        ref = small_ops.silu_mul(F.linear(x, ws[0]), paired=True)
        flops = 2 * rows * N * K
        for _ in range(2):  # twice: the spread between rounds is the machine's
            base = gemv.time_configs(ws, [None], lambda w, c: small_ops.silu_mul(F.linear(x, w), paired=True))[None]
            gemm = gemv.time_configs(ws, [None], lambda w, c: F.linear(x, w))[None]
            print(
                f"M={rows}: cuBLAS + SiLU·mul {base:.1f} us (GEMM alone {gemm:.1f} us, "
                f"{flops / gemm / 1e6:.0f} TFLOP/s)",
                flush=True,
            )
            for name in filter(None, args.variants.split(",")):
                flags = VARIANTS[name]
                times = gemv.time_configs(ws, configs, lambda w, c, f=flags: swiglu_variant(x, w, c, *f))
                for c, us in sorted(times.items(), key=lambda kv: kv[1])[:4]:
                    err = (swiglu_variant(x, ws[0], c, *flags).float() - ref.float()).abs().max().item()
                    print(
                        f"  {name} {c}: {us:.1f} us ({flops / us / 1e6:.0f} TFLOP/s, {us - base:+.1f} us against "
                        f"cuBLAS + SiLU·mul; max |diff| {err:.2e})",
                        flush=True,
                    )
                if len(times) < len(configs):
                    print(f"  ({name}: {len(configs) - len(times)} configs did not run)", flush=True)
            for tma in () if args.no_plain else (True, False):
                times = gemv.time_configs(ws, configs, lambda w, c, tma=tma: gemm_swiglu(x, w, c, tma=tma))
                for c, us in sorted(times.items(), key=lambda kv: kv[1])[:6]:
                    err = (gemm_swiglu(x, ws[0], c, tma=tma).float() - ref.float()).abs().max().item()
                    print(
                        f"  fused {'TMA' if tma else 'ptr'} {c}: {us:.1f} us ({flops / us / 1e6:.0f} TFLOP/s, "
                        f"{us - base:+.1f} us against cuBLAS + SiLU·mul; max |diff| {err:.2e})",
                        flush=True,
                    )
                missing = [c for c in configs if c not in times]
                if missing:
                    print(f"  ({'TMA' if tma else 'ptr'}: did not run {missing})", flush=True)


if __name__ == "__main__":
    main()
