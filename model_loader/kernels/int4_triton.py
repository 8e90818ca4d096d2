"""Triton kernels for 4-bit AWQ weights in our row-packed layout (awq.RowPackedInt4).

Decoding reads every weight once per token, so a single-token GEMV on packed ints is where 4-bit pays off:
  int4_gemv      out[n] = sum_k x[k] * (q[n,k] - z[n,k/G]) * s[n,k/G], optionally split along K across
                 programs (fp32 partials, summed by the last split to finish) so short, wide matrices still
                 fill the GPU. Each program loads its weights in one go ([rows, blocks, ints] tiles) and, on
                 Hopper, before the previous kernel has finished (programmatic dependent launch): at batch 1
                 the time goes on latency, not arithmetic. For the MLP's gate/up weight (rows stored in
                 pairs) it outputs SiLU(gate) * up directly.
                 The layout (awq.RowPackedInt4) makes every load a contiguous vector: the packed ints, and
                 per nibble a run of activations; scales and zeros are read once per row and group.
Prefill multiplies many rows by the same weights; there cuBLAS on a dense copy wins by far, so
  int4_dequantize      writes W as bf16/fp16 into a reusable scratch buffer (one write of W per linear);
  int4pack_dequantize  does the same from torch's int4 tile layout (the default decode path on sm80+), once
                       int4pack_dequantize_matches has checked it against torch's kernel on the GPU.

Ints become floats with exponent tricks, not int->float conversions (a fraction of an FMA's throughput):
the GEMV moves each nibble under the exponent of 1.0f (1 + q/16: a shift, an and-or, then the FMA); the
dequantiser uses q | 0x4B000000 = 2**23 + q, exact.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_loader.awq import RowPackedInt4
from model_loader.kernels.triton_ops import pdl_launch_args, time_configs

MAGIC = tl.constexpr(8388608.0)  # 2**23: the float whose mantissa holds a small int exactly
# The bits of 1.0f, passed to the GEMV as a run-time argument: with two constants, (q & mask) | 0x3F800000
# compiles to two logic ops; with one in a register, ptxas makes it a single three-input LOP3.
ONE_BITS = 0x3F800000


@triton.jit
def _int4_gemv_blocks(acc, packed, blk, b_end, rows, row_mask, i, x_ptr, s_ptr, z_ptr, GROUPS, one_bits,
                      GROUP: tl.constexpr, IB: tl.constexpr, BLOCK_N: tl.constexpr, NB: tl.constexpr):
    # packed: the [BLOCK_N, NB, IB] ints of blocks blk (those at or past b_end are masked to 0) -> acc with
    # their products added.
    in_split = blk < b_end
    x_runs = x_ptr + (blk * 8 * IB)[:, None] + i[None, :]  # [NB, IB]: nibble j's activations at + j*IB
    x_mask = in_split[:, None]
    sz_ptrs = rows[:, None] * GROUPS + ((blk * 8 * IB) // GROUP)[None, :]  # [BLOCK_N, NB]: the block's group
    sz_mask = row_mask[:, None] & in_split[None, :]
    a = tl.zeros([BLOCK_N, NB, IB], tl.float32)
    xs = tl.zeros([NB, IB], tl.float32)
    for j in tl.static_range(8):
        if j == 0 or (j * IB) % GROUP == 0:  # a group starts: request its scale and zero now, use them at its end
            s = tl.load(s_ptr + sz_ptrs + (j * IB) // GROUP, mask=sz_mask, other=0.0).to(tl.float32)
            z = tl.load(z_ptr + sz_ptrs + (j * IB) // GROUP, mask=sz_mask, other=0.0).to(tl.float32)
        xj = tl.load(x_runs + j * IB, mask=x_mask, other=0.0).to(tl.float32)
        # nibble j moved to the top four mantissa bits of 1.0f: the float 1 + q/16, in one shift and one and-or;
        # its product with x keeps full precision (16a - 16xs recovers sum q*x below)
        if j <= 4:
            moved = packed << (19 - 4 * j)
        else:
            moved = packed >> (4 * j - 19)
        qj = ((moved & 0x00780000) | one_bits).to(tl.float32, bitcast=True)
        a += qj * xj[None, :, :]
        xs += xj
        if ((j + 1) * IB) % GROUP == 0 or j == 7:  # a group ends here (or the block does): apply s and z
            # sum (q - z) * s * x = 16s * sum (1 + q/16) * x - s * (16 + z) * sum x
            acc += (16.0 * s)[:, :, None] * a - (s * (16.0 + z))[:, :, None] * xs[None, :, :]
            a = tl.zeros([BLOCK_N, NB, IB], tl.float32)
            xs = tl.zeros([NB, IB], tl.float32)
    return acc


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
def _int4_gemv_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, part_ptr, count_ptr, N, KP, GROUPS, BLOCKS_PER_SPLIT,
                      NUM_BLOCKS, SPLITS, ONE_BITS, GROUP: tl.constexpr, IB: tl.constexpr, BLOCK_N: tl.constexpr,
                      NB: tl.constexpr, CHUNKED: tl.constexpr, SILU_OUTPUT: tl.constexpr,
                      PDL: tl.constexpr):
    # Program (r, c) owns rows r*BLOCK_N.. over packed blocks c*BLOCKS_PER_SPLIT.. (one block = 8*IB inputs,
    # IB ints per row), NB blocks at a time: one [BLOCK_N, NB, IB] load of packed ints, issued whole, so each
    # program keeps many bytes in flight (a single token's GEMV is bound by memory latency, not arithmetic:
    # one block per load left the H200 waiting on round trips). Nibble j of block b pairs with the contiguous
    # activations x[8*IB*b + j*IB : ... + IB]. Within a group, sum (q - z) * s * x = s * (sum q*x - z * sum x),
    # so the scale and zero are applied once per row and group, not per weight. KP = K/8 is its own argument
    # so Triton sees it divisible by 16 and the tile loads become 16-byte vector loads. CHUNKED: the split
    # spans more than NB blocks, so it loops, requesting the next NB blocks before working on these.
    # PDL (programmatic dependent launch, sm90+): the grid may start while the previous kernel still runs; it
    # requests its weights (never written by anyone) at once and waits for the previous kernel only before
    # reading x, so the weights' DRAM latency overlaps the previous kernel's tail. It also lets the next
    # kernel start early. Nothing is written before the wait.
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    nb = tl.arange(0, NB)
    i = tl.arange(0, IB)
    b_begin = tl.program_id(1) * BLOCKS_PER_SPLIT
    b_end = tl.minimum(b_begin + BLOCKS_PER_SPLIT, NUM_BLOCKS)
    acc = tl.zeros([BLOCK_N, NB, IB], tl.float32)
    w_rows = qw_ptr + rows[:, None, None] * KP + i[None, None, :]
    blk = b_begin + nb
    packed = tl.load(w_rows + (blk * IB)[None, :, None], mask=row_mask[:, None, None] & (blk < b_end)[None, :, None],
                     other=0)
    if PDL:
        # the first chunk's scales and zeros, requested before the wait too (read again, cached, per group;
        # adding 0 * their sum keeps the compiler from dropping this load)
        g0 = (b_begin * 8 * IB) // GROUP
        gn = tl.arange(0, NB * ((8 * IB + GROUP - 1) // GROUP))
        g_mask = row_mask[:, None] & (g0 + gn < tl.cdiv(b_end * 8 * IB, GROUP))[None, :]
        early = tl.load(s_ptr + rows[:, None] * GROUPS + g0 + gn[None, :], mask=g_mask, other=0.0).to(tl.float32)
        early += tl.load(z_ptr + rows[:, None] * GROUPS + g0 + gn[None, :], mask=g_mask, other=0.0).to(tl.float32)
        tl.extra.cuda.gdc_wait()
    if CHUNKED:
        for c in range(b_begin, b_end, NB):
            blk = c + nb
            ahead = blk + NB  # the next NB blocks are requested before these are worked on
            upcoming = tl.load(w_rows + (ahead * IB)[None, :, None],
                               mask=row_mask[:, None, None] & (ahead < b_end)[None, :, None], other=0)
            acc = _int4_gemv_blocks(acc, packed, blk, b_end, rows, row_mask, i, x_ptr, s_ptr, z_ptr, GROUPS,
                                    ONE_BITS, GROUP, IB, BLOCK_N, NB)
            packed = upcoming
    else:  # straight-line code, so every load of the program can be issued before any arithmetic
        acc = _int4_gemv_blocks(acc, packed, blk, b_end, rows, row_mask, i, x_ptr, s_ptr, z_ptr, GROUPS,
                                ONE_BITS, GROUP, IB, BLOCK_N, NB)
    total = tl.sum(tl.sum(acc, axis=2), axis=1)
    if PDL:
        total += 0.0 * tl.sum(early, axis=1)
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


# (BLOCK_N rows, NB blocks per load, num_warps, splits along K): tried for each weight shape at warm-up
# (int4_gemv_autotune). warps = 2 * NB keeps the activations' [NB, IB] tile below the thread count, so Triton
# loads it directly in the layout the products use (otherwise it goes through shared memory). The per-shape
# winners on an H200 of `python benchmarks/profile_int4.py --sweep` (77 configs then, 15 of them with a
# paired-nibble variant that never won and was dropped).
INT4_GEMV_CONFIGS = (
    (16, 4, 8, 1), (32, 4, 8, 1), (32, 2, 4, 1), (32, 1, 2, 6), (64, 2, 4, 3), (16, 1, 2, 18), (64, 2, 4, 18),
    (8, 2, 4, 3),
)
DEFAULT_INT4_GEMV = (32, 2, 4, 1)  # when warm-up did not tune (no CUDA graphs)


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
    block_n, nb, warps, splits = config
    blocks = k // (8 * w.interleave)
    per_split = triton.cdiv(blocks, splits)  # every split covers whole packed blocks; none is left empty
    splits = triton.cdiv(blocks, per_split)
    if triton.cdiv(n, block_n) > MAX_ROW_BLOCKS:
        raise ValueError(f"int4 GEMV: {n} outputs in blocks of {block_n} exceed {MAX_ROW_BLOCKS} row blocks")
    out = torch.empty((1, n // 2 if silu_output else n), dtype=x.dtype, device=x.device)
    partials = torch.empty((splits, n), dtype=torch.float32, device=x.device) if splits > 1 else out
    _int4_gemv_kernel[(triton.cdiv(n, block_n), splits)](
        x, w.qweight, w.scales, w.zeros, out, partials, split_counters(x.device), n, k // 8, w.scales.shape[1],
        per_split, blocks, splits, ONE_BITS, GROUP=w.group_size, IB=w.interleave, BLOCK_N=block_n, NB=nb,
        CHUNKED=per_split > nb, SILU_OUTPUT=silu_output, num_warps=warps, **pdl_launch_args(x.device),
        **({"maxnreg": maxnreg} if maxnreg else {}))
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
    _int4_dequantize_kernel[(triton.cdiv(n, block_n), k // (8 * w.interleave))](
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
    _int4pack_dequantize_kernel[(triton.cdiv(n, block_n), triton.cdiv(k, block_k))](
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


def int4_gemv_autotune(weights_by_use: dict, dtype, configs=INT4_GEMV_CONFIGS) -> dict:
    """weights_by_use: {(shape, silu_output): [RowPackedInt4, ...]}. For each, the fastest GEMV config on this
    GPU (triton_ops.time_configs), timed on the call the decoder makes. Returns {"choice": {(shape, silu_output):
    config}, "timings_us": {(shape, silu_output): {config: us}}}."""
    choice, timings = {}, {}
    for (shape, silu), ws in weights_by_use.items():
        x = torch.randn(1, shape[1], device=ws[0].qweight.device, dtype=dtype)
        results = time_configs(ws, configs, lambda w, config: int4_gemv(x, w, config, silu_output=silu))
        choice[(shape, silu)] = min(results, key=results.get) if results else DEFAULT_INT4_GEMV
        timings[(shape, silu)] = results
    return {"choice": choice, "timings_us": timings}
