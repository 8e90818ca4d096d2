"""Triton kernels for 4-bit AWQ weights in our row-packed layout (awq.RowPackedInt4).

Decoding reads every weight once per token, so a single-token GEMV on packed ints is where 4-bit pays off:
  int4_gemv      out[n] = sum_k x[k] * (q[n,k] - z[n,k/G]) * s[n,k/G], optionally split along K across
                 programs (fp32 partials + a small reduce) so short, wide matrices still fill the GPU.
                 The layout (awq.RowPackedInt4) makes every load a contiguous vector: the packed ints, and
                 per nibble a run of activations; scales and zeros are read once per row and group.
Prefill multiplies many rows by the same weights; there cuBLAS on a dense copy wins by far, so
  int4_dequantize writes W as bf16/fp16 into a reusable scratch buffer (cost: one write of W per linear).

Ints become floats with the exponent trick (q | 0x4B000000 is the float 2**23 + q), not an int->float
conversion, whose throughput is a fraction of an FMA's: per weight that leaves a shift, a logic op, a
subtract and an FMA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_loader.awq import RowPackedInt4
from model_loader.kernels.triton_ops import _graph_time_us

MAGIC = tl.constexpr(8388608.0)  # 2**23: the float whose mantissa holds a small int exactly


@triton.jit
def _int4_gemv_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, N, K, GROUPS, K_PER_SPLIT,
                      GROUP: tl.constexpr, IB: tl.constexpr, BLOCK_N: tl.constexpr, PARTIAL: tl.constexpr):
    # Program (r, c) owns rows r*BLOCK_N.. over the K range c*K_PER_SPLIT.. (a whole number of 8*IB blocks).
    # Per block: one [BLOCK_N, IB] tile of packed ints; nibble j pairs with the contiguous activations
    # x[k0 + j*IB : k0 + (j+1)*IB]. Within a group, sum (q - z) * s * x = s * (sum q*x - z * sum x), so the
    # scale and zero are applied once per row and group, not per weight.
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    i = tl.arange(0, IB)
    k_begin = tl.program_id(1) * K_PER_SPLIT
    k_end = tl.minimum(k_begin + K_PER_SPLIT, K)
    acc = tl.zeros([BLOCK_N, IB], tl.float32)
    for k0 in range(k_begin, k_end, 8 * IB):
        packed = tl.load(qw_ptr + rows[:, None] * (K // 8) + (k0 // 8 + i)[None, :], mask=row_mask[:, None],
                         other=0)
        a = tl.zeros([BLOCK_N, IB], tl.float32)
        xs = tl.zeros([IB], tl.float32)
        for j in tl.static_range(8):
            xj = tl.load(x_ptr + k0 + j * IB + i).to(tl.float32)
            qj = (((packed >> (4 * j)) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - MAGIC
            a += qj * xj[None, :]
            xs += xj
            if ((j + 1) * IB) % GROUP == 0 or j == 7:  # a group ends here (or the block does): apply s and z
                g = (k0 + j * IB) // GROUP
                s = tl.load(s_ptr + rows * GROUPS + g, mask=row_mask, other=0.0).to(tl.float32)
                z = tl.load(z_ptr + rows * GROUPS + g, mask=row_mask, other=0).to(tl.float32)
                acc += s[:, None] * (a - z[:, None] * xs[None, :])
                a = tl.zeros([BLOCK_N, IB], tl.float32)
                xs = tl.zeros([IB], tl.float32)
    total = tl.sum(acc, axis=1)
    if PARTIAL:
        tl.store(out_ptr + tl.program_id(1) * N + rows, total, mask=row_mask)
    else:
        tl.store(out_ptr + rows, total.to(out_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def _sum_splits_kernel(part_ptr, out_ptr, N, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    total = tl.zeros([BLOCK], tl.float32)
    for i in tl.static_range(SPLITS):
        total += tl.load(part_ptr + i * N + cols, mask=mask, other=0.0)
    tl.store(out_ptr + cols, total.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _int4_dequantize_kernel(qw_ptr, s_ptr, z_ptr, w_ptr, N, K, GROUPS,
                            GROUP: tl.constexpr, IB: tl.constexpr, BLOCK_N: tl.constexpr):
    # One packed block of BLOCK_N rows -> 8 contiguous runs of IB outputs per row.
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    i = tl.arange(0, IB)
    k0 = tl.program_id(1) * 8 * IB
    packed = tl.load(qw_ptr + rows[:, None] * (K // 8) + (k0 // 8 + i)[None, :], mask=row_mask[:, None], other=0)
    for j in tl.static_range(8):
        g = (k0 + j * IB) // GROUP
        s = tl.load(s_ptr + rows * GROUPS + g, mask=row_mask, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + rows * GROUPS + g, mask=row_mask, other=0).to(tl.float32)
        q = (((packed >> (4 * j)) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True)
        w = (q - (z + MAGIC)[:, None]) * s[:, None]
        tl.store(w_ptr + rows[:, None] * K + (k0 + j * IB + i)[None, :], w.to(w_ptr.dtype.element_ty),
                 mask=row_mask[:, None])


# (BLOCK_N, num_warps, splits along K): tried for each weight shape at warm-up (int4_gemv_autotune)
INT4_GEMV_CONFIGS = (
    (8, 4, 1), (16, 4, 1), (32, 4, 1), (64, 8, 1),
    (16, 4, 2), (32, 4, 2), (16, 4, 4), (32, 4, 4), (32, 8, 8),
)
DEFAULT_INT4_GEMV = (16, 4, 1)


def int4_gemv(x: torch.Tensor, w: RowPackedInt4, config: tuple[int, int, int] = DEFAULT_INT4_GEMV
              ) -> torch.Tensor:
    """x [1, K] -> x @ W.T [1, N] in x's dtype."""
    n, k = w.shape
    block_n, warps, splits = config
    block_k = 8 * w.interleave
    # every split covers a whole number of packed blocks; a split past K would do nothing
    k_per_split = triton.cdiv(triton.cdiv(k, splits), block_k) * block_k
    splits = triton.cdiv(k, k_per_split)
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    target = out if splits == 1 else torch.empty((splits, n), dtype=torch.float32, device=x.device)
    _int4_gemv_kernel[(triton.cdiv(n, block_n), splits)](
        x, w.qweight, w.scales, w.zeros, target, n, k, w.scales.shape[1], k_per_split,
        GROUP=w.group_size, IB=w.interleave, BLOCK_N=block_n, PARTIAL=splits > 1, num_warps=warps)
    if splits > 1:
        _sum_splits_kernel[(triton.cdiv(n, 1024),)](target, out, n, SPLITS=splits, BLOCK=1024, num_warps=4)
    return out


def int4_dequantize(w: RowPackedInt4, out: torch.Tensor) -> torch.Tensor:
    """Write W [N, K] into out (a buffer with at least N*K elements, in the activations' dtype)."""
    n, k = w.shape
    dense = out.view(-1)[: n * k].view(n, k)
    block_n = 16
    _int4_dequantize_kernel[(triton.cdiv(n, block_n), k // (8 * w.interleave))](
        w.qweight, w.scales, w.zeros, dense, n, k, w.scales.shape[1],
        GROUP=w.group_size, IB=w.interleave, BLOCK_N=block_n, num_warps=4)
    return dense


def int4_gemv_autotune(weights_by_shape: dict[tuple[int, int], list[RowPackedInt4]], dtype) -> dict:
    """For each weight shape, the fastest GEMV config on this GPU, timed in a CUDA graph over the model's own
    weights of that shape (so reads come from HBM, as when decoding). Returns {"choice": {shape: config},
    "timings_us": {shape: {config: us}}}."""
    choice, timings = {}, {}
    for shape, ws in weights_by_shape.items():
        x = torch.randn(1, shape[1], device=ws[0].qweight.device, dtype=dtype)

        def run(config):
            def fn():
                for w in ws:
                    int4_gemv(x, w, config)
            return fn

        results = {}
        for config in INT4_GEMV_CONFIGS:
            try:
                results[config] = _graph_time_us(run(config), len(ws))
            except Exception:  # a config this GPU can't run (shared memory, registers): skip it
                continue
        choice[shape] = min(results, key=results.get) if results else DEFAULT_INT4_GEMV
        timings[shape] = results
    return {"choice": choice, "timings_us": timings}
