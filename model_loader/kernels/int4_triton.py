"""Triton kernels for 4-bit AWQ weights in our row-packed layout (awq.RowPackedInt4).

Decoding reads every weight once per token, so a single-token GEMV on packed ints is where 4-bit pays off:
  int4_gemv      out[n] = sum_k x[k] * (q[n,k] - z[n,k/G]) * s[n,k/G]. Each program requests all of its
                 weights at once (up to 4 [blocks, rows, ints] tiles) and, on Hopper, before the previous kernel
                 has finished (programmatic dependent launch); K is split across programs only when that
                 doesn't cover it (fp32 partials, summed by the last split to finish). At batch 1 on a big GPU
                 the time goes on latency and instruction issue, so the arithmetic is cut to a shift per two
                 weights, an and-or and an FMA per weight. For the MLP's gate/up weight (rows stored in pairs)
                 it outputs SiLU(gate) * up directly.
                 The layout (awq.RowPackedInt4) makes every load a contiguous vector: the packed ints, and
                 per nibble a run of activations; a packed block lies inside one group, so scales and zeros
                 are read once per row and block.
Prefill multiplies many rows by the same weights; there cuBLAS on a dense copy wins by far, so
  int4_dequantize      writes W as bf16/fp16 into a reusable scratch buffer (one write of W per linear);
  int4pack_dequantize  does the same from torch's int4 tile layout (torch's int4 decode path),
                       once int4pack_dequantize_matches has checked it against torch's kernel on the GPU.

Ints become floats with exponent tricks, not int->float conversions (a fraction of an FMA's throughput):
the GEMV puts nibbles under the exponents of 16.0f and 256.0f (16 + q, 256 + q: one and-or each, see
_int4_dot_blocks); the dequantiser uses q | 0x4B000000 = 2**23 + q, exact.
"""

from __future__ import annotations

import torch
import triton

from model_loader.awq import RowPackedInt4
from model_loader.kernels.jit_int4 import _int4_dequantize_kernel, _int4_gemv_kernel, _int4pack_dequantize_kernel
from model_loader.kernels.precompile import launch
from model_loader.kernels import gemv
from model_loader.kernels.features import pdl_launch_args
from model_loader.kernels.gemv import MAX_ROW_BLOCKS, split_counters, time_configs

# The bits of 16.0f and 256.0f, passed to the GEMV as run-time arguments: with two constants,
# (q & mask) | bits compiles to two logic ops; with one in a register, ptxas makes it one three-input LOP3.
SIXTEEN_BITS, TWO_FIFTY_SIX_BITS = 0x41800000, 0x43800000


# (BLOCK_N rows, NB blocks per tile, num_warps, CHUNKS tiles per program): tried for each weight shape at
# warm-up (int4_gemv_autotune); K is split into as many programs as it takes to cover it. From a sweep
# (benchmarks/profile_int4.py --sweep): the best few per shape of the R1-1.5B model.
INT4_GEMV_CONFIGS = ((32, 4, 4, 3), (64, 8, 8, 1), (32, 4, 4, 4), (64, 4, 8, 3), (64, 2, 4, 1), (64, 4, 4, 3))
DEFAULT_INT4_GEMV = (32, 4, 4, 3)  # int4_gemv's default (Linears uses int4_gemv_candidates' first when untuned)
# Each configuration is its own compiled kernel, and compiling them all is most of the 4-bit model's first start.
# So for the weight uses already measured (N, K, SiLU output) only the configurations within 7% of the best are
# tried (`python -m benchmarks.profile_int4 --shapes 1.5b,7b`; docs/BENCHMARKS.md, '4-bit (AWQ)'); the 1.5B's qkv,
# o and down have one clear winner each. Any other shape tries all of INT4_GEMV_CONFIGS.
INT4_GEMV_MEASURED = {
    # DeepSeek-R1-Distill-Qwen-1.5B / Qwen2.5-1.5B: qkv, o, gate/up (SiLU output), down
    (2048, 1536, False): ((32, 4, 4, 3),),
    (1536, 1536, False): ((32, 4, 4, 3),),
    (17920, 1536, True): ((32, 4, 4, 3), (64, 4, 4, 3)),
    (1536, 8960, False): ((64, 8, 8, 1),),
    # DeepSeek-R1-Distill-Qwen-7B / Qwen2.5-7B
    (4608, 3584, False): ((64, 8, 8, 1), (64, 2, 4, 1), (32, 4, 4, 3), (64, 4, 8, 3)),
    (3584, 3584, False): ((64, 8, 8, 1),),
    (37888, 3584, True): ((64, 2, 4, 1), (32, 4, 4, 4)),
    (3584, 18944, False): ((64, 4, 4, 3), (32, 4, 4, 3), (32, 4, 4, 4), (64, 8, 8, 1)),
}


MEASURED_ON = {"capability_major": 9, "group_size": 128}  # the H200's generation (Hopper), AWQ's usual groups


def _measured_here(w: RowPackedInt4) -> bool:
    device = w.qweight.device
    return (
        device.type == "cuda"
        and w.group_size == MEASURED_ON["group_size"]
        and torch.cuda.get_device_capability(device)[0] == MEASURED_ON["capability_major"]
    )


def int4_gemv_candidates(w: RowPackedInt4, silu_output: bool) -> tuple:
    """The GEMV configurations the warm-up tries (and compiles) for this weight's use, best known first (the
    one used untuned). The measured lists apply where they were measured: Hopper, group size 128."""
    if _measured_here(w):
        return INT4_GEMV_MEASURED.get((*w.shape, silu_output), INT4_GEMV_CONFIGS)
    return INT4_GEMV_CONFIGS


def int4_gemv(
    x: torch.Tensor,
    w: RowPackedInt4,
    config: tuple = DEFAULT_INT4_GEMV,
    silu_output: bool = False,
    maxnreg: int | None = None,
) -> torch.Tensor:
    """x [1, K] -> x @ W.T [1, N] in x's dtype. silu_output (the MLP's gate/up weight, stored in pairs by
    awq.pair_gate_up): -> SiLU(gate) * up [1, N/2], what kernels.*.silu_mul makes of [gate | up].
    maxnreg: a register cap per thread (for experiments; 96, 80 and 64 are slower or equal: docs/BENCHMARKS.md,
    'Tried and rejected')."""
    n, k = w.shape
    if x.shape[-1] != k:
        raise ValueError(f"int4 GEMV: input width {x.shape[-1]} for a weight of {k} inputs")
    if silu_output != w.gate_up_pairs:
        raise ValueError("int4 GEMV: SiLU(gate) * up output needs (and a paired gate/up weight gives) rows in pairs")
    block_n, nb, warps, chunks = config
    blocks = k // (8 * w.interleave)
    splits = triton.cdiv(blocks, nb * chunks)
    if triton.cdiv(n, block_n) > MAX_ROW_BLOCKS:
        raise ValueError(f"int4 GEMV: {n} outputs in blocks of {block_n} exceed {MAX_ROW_BLOCKS} row blocks")
    out = torch.empty((1, n // 2 if silu_output else n), dtype=x.dtype, device=x.device)
    partials = torch.empty((splits, n), dtype=torch.float32, device=x.device) if splits > 1 else out
    launch(_int4_gemv_kernel, (triton.cdiv(n, block_n), splits))(
        x,
        w.qweight,
        w.scales,
        w.zeros,
        out,
        partials,
        split_counters(x.device),
        n,
        k // 8,
        w.scales.shape[1],
        blocks,
        splits,
        SIXTEEN_BITS,
        TWO_FIFTY_SIX_BITS,
        GROUP=w.group_size,
        IB=w.interleave,
        BLOCK_N=block_n,
        NB=nb,
        CHUNKS=chunks,
        EVEN=blocks % (nb * chunks) == 0 and n % block_n == 0,
        SILU_OUTPUT=silu_output,
        W_EVICT=gemv.GEMV_WEIGHT_EVICTION,
        num_warps=warps,
        **pdl_launch_args(x.device),
        **({"maxnreg": maxnreg} if maxnreg else {}),
    )
    return out


def int4_dequantize(w: RowPackedInt4, out: torch.Tensor) -> torch.Tensor:
    """Write W [N, K] into out (a buffer with at least N*K elements, in the activations' dtype)."""
    n, k = w.shape
    dense = out.view(-1)[: n * k].view(n, k)
    block_n = 16
    launch(_int4_dequantize_kernel, (triton.cdiv(n, block_n), k // (8 * w.interleave)))(
        w.qweight,
        w.scales,
        w.zeros,
        dense,
        n,
        k,
        w.scales.shape[1],
        GROUP=w.group_size,
        IB=w.interleave,
        BLOCK_N=block_n,
        GATE_UP_PAIRS=w.gate_up_pairs,
        num_warps=4,
    )
    return dense


def int4pack_dequantize(w, out: torch.Tensor) -> torch.Tensor:
    """W [N, K] of an awq.Int4Weight (torch's CUDA int4 layout) into out, a buffer of at least N*K elements."""
    n, k = w.out_features, w.in_features
    dense = out.view(-1)[: n * k].view(n, k)
    block_n, block_k = 16, 128
    launch(_int4pack_dequantize_kernel, (triton.cdiv(n, block_n), triton.cdiv(k, block_k)))(
        w.packed,
        w.scales_and_zeros,
        dense,
        n,
        k,
        w.packed.shape[1],
        w.packed.shape[3],
        GROUP=w.group_size,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=4,
    )
    return dense


def int4pack_dequantize_matches(w, scratch: torch.Tensor, reference_linear) -> bool:
    """Does int4pack_dequantize reproduce reference_linear (torch's int4 kernel) on this weight? Runs the
    kernel on rows of the identity (giving W's first columns) and accepts differences below half a
    quantisation step (rounding), which any misplaced nibble exceeds."""
    rows = min(w.in_features, 256)  # spans every lane, nibble and inner k-tile of the layout
    eye = torch.zeros(rows, w.in_features, device=scratch.device, dtype=scratch.dtype)
    eye.fill_diagonal_(1.0)  # the first rows of the identity, without building all of it
    expected = reference_linear(eye, w).float()  # [rows, N] = W[:, :rows].T
    got = int4pack_dequantize(w, scratch)[:, :rows].float().t()
    step = w.scales_and_zeros[..., 0].float().repeat_interleave(w.group_size, dim=0)[:rows].abs()
    return bool(((got - expected).abs() <= 0.5 * step).all())


def int4_gemv_autotune(weights_by_use: dict, dtype, configs=None) -> dict:
    """weights_by_use: {(shape, silu_output): [RowPackedInt4, ...]}. For each, the fastest GEMV config on this
    GPU (gemv.time_configs) among `configs` (default: int4_gemv_candidates for the use), timed on the call
    the decoder makes. Returns {"choice": {(shape, silu_output): config}, "timings_us": {(shape, silu_output):
    {config: us}}}."""
    choice, timings = {}, {}
    for (shape, silu), ws in weights_by_use.items():
        x = torch.randn(1, shape[1], device=ws[0].qweight.device, dtype=dtype)
        tried = configs if configs is not None else int4_gemv_candidates(ws[0], silu)
        results = time_configs(ws, tried, lambda w, config: int4_gemv(x, w, config, silu_output=silu))
        choice[(shape, silu)] = min(results, key=results.get) if results else tried[0]
        timings[(shape, silu)] = results
    return {"choice": choice, "timings_us": timings}
