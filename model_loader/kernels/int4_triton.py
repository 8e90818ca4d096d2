"""Triton kernels for 4-bit AWQ weights in our row-packed layout (awq.RowPackedInt4).

Decoding reads every weight once per token, so a single-token GEMV on packed ints is where 4-bit pays off:
  int4_gemv      out[n] = sum_k x[k] * (q[n,k] - z[n,k/G]) * s[n,k/G]. Each program requests all of its
                 weights at once (up to 4 [blocks, rows, ints] tiles) and, on Hopper, before the previous kernel
                 has finished (programmatic dependent launch); K is split across programs only when that
                 doesn't cover it (fp32 partials, summed by the last split to finish). At batch 1 on a big GPU
                 the time goes on latency and instruction issue, so the arithmetic is cut to a shift per two
                 weights, an and-or and an FMA per weight (3.5-4.2 instructions per weight in all by config,
                 against 7.0 for the previous version; Nsight Compute, H200). For the MLP's gate/up weight (rows stored in
                 pairs) it outputs SiLU(gate) * up directly.
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
import triton.language as tl

from model_loader.awq import RowPackedInt4
from model_loader.kernels.precompile import launch
from model_loader.kernels.triton_ops import pdl_launch_args, time_configs

MAGIC = tl.constexpr(8388608.0)  # 2**23: the float whose mantissa holds a small int exactly
# The bits of 16.0f and 256.0f, passed to the GEMV as run-time arguments: with two constants,
# (q & mask) | bits compiles to two logic ops; with one in a register, ptxas makes it one three-input LOP3.
SIXTEEN_BITS, TWO_FIFTY_SIX_BITS = 0x41800000, 0x43800000


@triton.jit
def _store_rows(out_ptr, total, rows, row_mask, BLOCK_N: tl.constexpr, SILU_OUTPUT: tl.constexpr):
    # total [BLOCK_N] fp32 -> out. SILU_OUTPUT: rows come in (gate, up) pairs (awq.pair_gate_up); store
    # SiLU(gate) * up at the pair's index, each rounded to the output dtype first as the separate kernels would.
    if SILU_OUTPUT:
        gate, up = tl.split(tl.reshape(total.to(out_ptr.dtype.element_ty).to(tl.float32), [BLOCK_N // 2, 2]))
        pair_rows = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        pair_mask = tl.max(tl.reshape(row_mask.to(tl.int32), [BLOCK_N // 2, 2]), axis=1) > 0
        tl.store(out_ptr + pair_rows, (gate / (1.0 + tl.exp(-gate)) * up).to(out_ptr.dtype.element_ty),
                 mask=pair_mask)
    else:
        tl.store(out_ptr + rows, total.to(out_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def _int4_load_blocks(qw_ptr, s_ptr, z_ptr, rows, row_mask, blk, i, KP, GROUPS, NUM_BLOCKS,
                      GROUP: tl.constexpr, IB: tl.constexpr, EVEN: tl.constexpr):
    # The [NB, BLOCK_N, IB] packed ints of blocks blk for these rows, and each (block, row)'s scale and zero.
    w_ptrs = qw_ptr + rows[None, :, None] * KP + (blk * IB)[:, None, None] + i[None, None, :]
    sz_ptrs = rows[None, :] * GROUPS + ((blk * 8 * IB) // GROUP)[:, None]
    if EVEN:
        packed = tl.load(w_ptrs)
        s = tl.load(s_ptr + sz_ptrs).to(tl.float32)
        z = tl.load(z_ptr + sz_ptrs).to(tl.float32)
    else:
        tile_mask = (blk < NUM_BLOCKS)[:, None] & row_mask[None, :]  # [NB, BLOCK_N]
        packed = tl.load(w_ptrs, mask=tile_mask[:, :, None], other=0)
        s = tl.load(s_ptr + sz_ptrs, mask=tile_mask, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + sz_ptrs, mask=tile_mask, other=0.0).to(tl.float32)
    return packed, s, z


@triton.jit
def _int4_dot_blocks(packed, s, z, x_ptr, blk, i, NUM_BLOCKS, SIXTEEN_BITS, TWO_FIFTY_SIX_BITS,
                     IB: tl.constexpr, BLOCK_N: tl.constexpr, NB: tl.constexpr, EVEN: tl.constexpr):
    # -> [NB, BLOCK_N]: each row's dot product with x over each block, scale and zero applied.
    # One shift serves two nibbles: nibble j lands under the exponent of 16.0f, giving the float 16 + q[j], and
    # nibble j-1 four bits lower, under the exponent of 256.0f: 256 + q[j-1]; each is one and-or (LOP3) away.
    # So one accumulator per (block, row, int) gets sum q*x + 16*sum x_odd + 256*sum x_even, and per row and
    # block  sum (q - z) * s * x = s * (sum over the block's ints - known - z * sum x),  with known and sum x
    # the same for every row: nothing but the shift, the and-ors and the FMAs is done per weight. (The sums
    # carry the 256s, so about 15 bits of each product sum survive: far below bf16/fp16 output rounding.)
    x_runs = x_ptr + (blk * 8 * IB)[:, None] + i[None, :]  # [NB, IB]: nibble j's activations at + j*IB
    a = tl.zeros([NB, BLOCK_N, IB], tl.float32)
    x_odd = tl.zeros([NB, IB], tl.float32)
    x_even = tl.zeros([NB, IB], tl.float32)
    for p in tl.static_range(4):
        j = 2 * p + 1  # nibbles j and j - 1
        if EVEN:
            x_j = tl.load(x_runs + j * IB).to(tl.float32)
            x_before = tl.load(x_runs + (j - 1) * IB).to(tl.float32)
        else:
            x_mask = (blk < NUM_BLOCKS)[:, None]
            x_j = tl.load(x_runs + j * IB, mask=x_mask, other=0.0).to(tl.float32)
            x_before = tl.load(x_runs + (j - 1) * IB, mask=x_mask, other=0.0).to(tl.float32)
        if j * 4 <= 19:
            moved = packed << (19 - 4 * j)
        else:
            moved = packed >> (4 * j - 19)  # arithmetic for nibble 7 (the sign bit): the masks drop the copies
        q_j = ((moved & 0x00780000) | SIXTEEN_BITS).to(tl.float32, bitcast=True)  # 16 + q[j]
        q_before = ((moved & 0x00078000) | TWO_FIFTY_SIX_BITS).to(tl.float32, bitcast=True)  # 256 + q[j-1]
        a += q_j * x_j[:, None, :]
        a += q_before * x_before[:, None, :]
        x_odd += x_j
        x_even += x_before
    known = tl.sum(16.0 * x_odd + 256.0 * x_even, axis=1)  # [NB]
    x_sum = tl.sum(x_odd + x_even, axis=1)
    return s * (tl.sum(a, axis=2) - (known[:, None] + z * x_sum[:, None]))


@triton.jit
def _int4_gemv_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, part_ptr, count_ptr, N, KP, GROUPS, NUM_BLOCKS,
                      SPLITS, SIXTEEN_BITS, TWO_FIFTY_SIX_BITS, GROUP: tl.constexpr, IB: tl.constexpr,
                      BLOCK_N: tl.constexpr, NB: tl.constexpr, CHUNKS: tl.constexpr, EVEN: tl.constexpr,
                      SILU_OUTPUT: tl.constexpr, PDL: tl.constexpr):
    # Program (r, c) owns rows r*BLOCK_N.. over the CHUNKS*NB packed blocks from c*CHUNKS*NB (one block =
    # 8*IB inputs, IB ints per row, inside one group), as CHUNKS [NB, BLOCK_N, IB] tiles, and requests all of
    # them before any arithmetic: at batch 1 the time goes on latency and instruction issue, not DRAM
    # bandwidth. This dimension order makes Triton give each thread one block of many rows (4 ints = a 16-byte
    # load per row), so the activations a thread converts and sums serve all its rows. Nibble j of block b
    # pairs with the contiguous activations x[8*IB*b + j*IB : ... + IB]. KP = K/8 is its own argument so
    # Triton sees it divisible by 16 (16-byte vector loads). EVEN: whole tiles, no masks. Chunks (up to 4,
    # written out: Triton has no lists of tiles) let one program cover a K that isn't a power of two of blocks
    # (1536 = 3 x 512) without a split. Splits along K (c > 0): fp32 partial sums, added up by the last split.
    # PDL (programmatic dependent launch, sm90+): the grid may start while the previous kernel still runs; it
    # requests its weights, scales and zeros (never written by anyone) at once and waits for the previous
    # kernel only before reading x, so their DRAM latency overlaps the previous kernel's tail. It also lets
    # the next kernel start early. Nothing is written before the wait.
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    i = tl.arange(0, IB)
    blk0 = tl.program_id(1) * (CHUNKS * NB) + tl.arange(0, NB)
    packed0, s0, z0 = _int4_load_blocks(qw_ptr, s_ptr, z_ptr, rows, row_mask, blk0, i, KP, GROUPS, NUM_BLOCKS,
                                        GROUP, IB, EVEN)
    if CHUNKS > 1:
        packed1, s1, z1 = _int4_load_blocks(qw_ptr, s_ptr, z_ptr, rows, row_mask, blk0 + NB, i, KP, GROUPS,
                                            NUM_BLOCKS, GROUP, IB, EVEN)
    if CHUNKS > 2:
        packed2, s2, z2 = _int4_load_blocks(qw_ptr, s_ptr, z_ptr, rows, row_mask, blk0 + 2 * NB, i, KP, GROUPS,
                                            NUM_BLOCKS, GROUP, IB, EVEN)
    if CHUNKS > 3:
        packed3, s3, z3 = _int4_load_blocks(qw_ptr, s_ptr, z_ptr, rows, row_mask, blk0 + 3 * NB, i, KP, GROUPS,
                                            NUM_BLOCKS, GROUP, IB, EVEN)
    if PDL:
        tl.extra.cuda.gdc_wait()
    per_block = _int4_dot_blocks(packed0, s0, z0, x_ptr, blk0, i, NUM_BLOCKS, SIXTEEN_BITS, TWO_FIFTY_SIX_BITS,
                                 IB, BLOCK_N, NB, EVEN)
    if CHUNKS > 1:
        per_block += _int4_dot_blocks(packed1, s1, z1, x_ptr, blk0 + NB, i, NUM_BLOCKS, SIXTEEN_BITS,
                                      TWO_FIFTY_SIX_BITS, IB, BLOCK_N, NB, EVEN)
    if CHUNKS > 2:
        per_block += _int4_dot_blocks(packed2, s2, z2, x_ptr, blk0 + 2 * NB, i, NUM_BLOCKS, SIXTEEN_BITS,
                                      TWO_FIFTY_SIX_BITS, IB, BLOCK_N, NB, EVEN)
    if CHUNKS > 3:
        per_block += _int4_dot_blocks(packed3, s3, z3, x_ptr, blk0 + 3 * NB, i, NUM_BLOCKS, SIXTEEN_BITS,
                                      TWO_FIFTY_SIX_BITS, IB, BLOCK_N, NB, EVEN)
    total = tl.sum(per_block, axis=0)
    if SPLITS > 1:
        # Split along K: each split leaves fp32 partial sums; the last split of a row block to finish (an
        # atomic arrival count) adds them up in a fixed order and resets the count. No second kernel launch.
        tl.store(part_ptr + tl.program_id(1) * N + rows, total, mask=row_mask)
        tl.debug_barrier()  # every thread's partials are written before the arrival is counted
        arrived = tl.atomic_add(count_ptr + tl.program_id(0), 1, sem="acq_rel")
        if arrived == SPLITS - 1:
            total = tl.zeros([BLOCK_N], tl.float32)
            for c in range(0, SPLITS):
                total += tl.load(part_ptr + c * N + rows, mask=row_mask, other=0.0, cache_modifier=".cg")
            _store_rows(out_ptr, total, rows, row_mask, BLOCK_N, SILU_OUTPUT)
            tl.atomic_xchg(count_ptr + tl.program_id(0), 0)
    else:
        _store_rows(out_ptr, total, rows, row_mask, BLOCK_N, SILU_OUTPUT)


@triton.jit
def _int4_dequantize_kernel(qw_ptr, s_ptr, z_ptr, w_ptr, N, K, GROUPS,
                            GROUP: tl.constexpr, IB: tl.constexpr, BLOCK_N: tl.constexpr, GATE_UP_PAIRS: tl.constexpr):
    # One packed block of BLOCK_N rows -> 8 contiguous runs of IB outputs per row. GATE_UP_PAIRS: stored rows
    # (gate i, up i) go back to rows i and N/2 + i of the dense [gate; up] weight.
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    if GATE_UP_PAIRS:
        dense_rows = rows // 2 + (rows % 2) * (N // 2)
    else:
        dense_rows = rows
    i = tl.arange(0, IB)
    k0 = tl.program_id(1) * 8 * IB
    packed = tl.load(qw_ptr + rows[:, None] * (K // 8) + (k0 // 8 + i)[None, :], mask=row_mask[:, None], other=0)
    for j in tl.static_range(8):
        g = (k0 + j * IB) // GROUP
        s = tl.load(s_ptr + rows * GROUPS + g, mask=row_mask, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + rows * GROUPS + g, mask=row_mask, other=0).to(tl.float32)
        q = (((packed >> (4 * j)) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True)
        w = (q - (z + MAGIC)[:, None]) * s[:, None]
        tl.store(w_ptr + dense_rows[:, None] * K + (k0 + j * IB + i)[None, :], w.to(w_ptr.dtype.element_ty),
                 mask=row_mask[:, None])


# (BLOCK_N rows, NB blocks per tile, num_warps, CHUNKS tiles per program): tried for each weight shape at
# warm-up (int4_gemv_autotune); K is split into as many programs as it takes to cover it. From an H200 sweep
# (benchmarks/profile_int4.py --sweep): the best few per shape of the R1-1.5B model.
INT4_GEMV_CONFIGS = ((32, 4, 4, 3), (64, 8, 8, 1), (32, 4, 4, 4), (64, 4, 8, 3), (64, 2, 4, 1), (64, 4, 4, 3))
DEFAULT_INT4_GEMV = (32, 4, 4, 3)  # int4_gemv's default (Linears uses int4_gemv_candidates' first when untuned)
# Each configuration is its own compiled kernel, 1-2 s of a first start each on the H200's host (18 of them were
# most of the 4-bit model's first start). For the weight uses measured on the H200 (N, K, SiLU output) only the
# configurations within 7% of the best there are tried (`python benchmarks/profile_int4.py --shapes 1.5b,7b`,
# 2026-12-03, docs/BENCHMARKS.md; the runner-ups of the 1.5B's qkv, o and down were 13-31% slower); any other
# shape tries all of INT4_GEMV_CONFIGS.
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
    return (device.type == "cuda" and w.group_size == MEASURED_ON["group_size"]
            and torch.cuda.get_device_capability(device)[0] == MEASURED_ON["capability_major"])


def int4_gemv_candidates(w: RowPackedInt4, silu_output: bool) -> tuple:
    """The GEMV configurations the warm-up tries (and compiles) for this weight's use, best known first (the
    one used untuned). The measured lists apply where they were measured: Hopper, group size 128."""
    if _measured_here(w):
        return INT4_GEMV_MEASURED.get((*w.shape, silu_output), INT4_GEMV_CONFIGS)
    return INT4_GEMV_CONFIGS


def int4_gemv(x: torch.Tensor, w: RowPackedInt4, config: tuple = DEFAULT_INT4_GEMV,
              silu_output: bool = False, maxnreg: int | None = None) -> torch.Tensor:
    """x [1, K] -> x @ W.T [1, N] in x's dtype. silu_output (the MLP's gate/up weight, stored in pairs by
    awq.pair_gate_up): -> SiLU(gate) * up [1, N/2], what kernels.*.silu_mul makes of [gate | up].
    maxnreg: a register cap per thread (for experiments; benchmarks/int4_registers.py found none that helps)."""
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
        x, w.qweight, w.scales, w.zeros, out, partials, split_counters(x.device), n, k // 8, w.scales.shape[1],
        blocks, splits, SIXTEEN_BITS, TWO_FIFTY_SIX_BITS, GROUP=w.group_size, IB=w.interleave, BLOCK_N=block_n,
        NB=nb, CHUNKS=chunks, EVEN=blocks % (nb * chunks) == 0 and n % block_n == 0, SILU_OUTPUT=silu_output,
        num_warps=warps, **pdl_launch_args(x.device), **({"maxnreg": maxnreg} if maxnreg else {}))
    return out


_COUNTERS: dict = {}
MAX_ROW_BLOCKS = 1 << 16


def split_counters(device) -> torch.Tensor:
    """Arrival counts for the split GEMV, one per row block, zero between calls (the last split resets its
    own). Made once per device, before any CUDA-graph capture uses it (Linears does so at load); kernels on
    one stream run one at a time, so every GEMV can share it."""
    device = torch.device(device)
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros(MAX_ROW_BLOCKS, dtype=torch.int32, device=device)
    return _COUNTERS[device]


def int4_dequantize(w: RowPackedInt4, out: torch.Tensor) -> torch.Tensor:
    """Write W [N, K] into out (a buffer with at least N*K elements, in the activations' dtype)."""
    n, k = w.shape
    dense = out.view(-1)[: n * k].view(n, k)
    block_n = 16
    launch(_int4_dequantize_kernel, (triton.cdiv(n, block_n), k // (8 * w.interleave)))(
        w.qweight, w.scales, w.zeros, dense, n, k, w.scales.shape[1],
        GROUP=w.group_size, IB=w.interleave, BLOCK_N=block_n, GATE_UP_PAIRS=w.gate_up_pairs, num_warps=4)
    return dense


@triton.jit
def _int4pack_dequantize_kernel(packed_ptr, sz_ptr, w_ptr, N, K, K_OUTER, IKT2,
                                GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # Dense W [N, K] from torch's CUDA int4 tile layout (see awq.cuda_int4pack_layout): each output element
    # finds its int32 and nibble; the 8 rows of a tile and their k bytes are spread over the 32 lanes.
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (n < N)[:, None] & (k < K)[None, :]
    kb = k // 2  # the byte of the [n, k/2] matrix torch packed from
    chunk = kb // 16  # 16 bytes = two k-tiles = one int32 per lane
    lane = (n % 8)[:, None] * 4 + (kb % 4)[None, :]
    word = (((n // 8)[:, None] * K_OUTER + (chunk // IKT2)[None, :]) * 32 + lane) * IKT2 + (chunk % IKT2)[None, :]
    shift = (((kb % 16) // 4) * 4 + (k % 2) * 16)[None, :]  # even k: high nibble -> bits 4i; odd: bits 16 + 4i
    q = (tl.load(packed_ptr + word, mask=mask, other=0) >> shift) & 0xF
    sz = sz_ptr + ((k // GROUP)[None, :] * N + n[:, None]) * 2
    s = tl.load(sz, mask=mask, other=0.0).to(tl.float32)
    zero = tl.load(sz + 1, mask=mask, other=0.0).to(tl.float32)
    w = (q.to(tl.float32) - 8.0) * s + zero  # torch's int4 kernel: (q - 8) * scale + zero
    tl.store(w_ptr + n[:, None] * K + k[None, :], w.to(w_ptr.dtype.element_ty), mask=mask)


def int4pack_dequantize(w, out: torch.Tensor) -> torch.Tensor:
    """W [N, K] of an awq.Int4Weight (torch's CUDA int4 layout) into out, a buffer of at least N*K elements."""
    n, k = w.out_features, w.in_features
    dense = out.view(-1)[: n * k].view(n, k)
    block_n, block_k = 16, 128
    launch(_int4pack_dequantize_kernel, (triton.cdiv(n, block_n), triton.cdiv(k, block_k)))(
        w.packed, w.scales_and_zeros, dense, n, k, w.packed.shape[1], w.packed.shape[3],
        GROUP=w.group_size, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4)
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
    GPU (triton_ops.time_configs) among `configs` (default: int4_gemv_candidates for the use), timed on the call
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
