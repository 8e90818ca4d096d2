"""The Triton kernels of int4_triton, by themselves: this module imports Triton and nothing else (no torch),
so a first start's compile worker processes (precompile) can load them in a fraction of a second. The layout,
the host-side wrappers and the tuning are in int4_triton, which re-exports these names."""

from __future__ import annotations

import triton
import triton.language as tl

from model_loader.kernels.jit_gemv import _finish_rows


MAGIC = tl.constexpr(8388608.0)  # 2**23: the float whose mantissa holds a small int exactly


@triton.jit
def _int4_load_blocks(
    qw_ptr,
    s_ptr,
    z_ptr,
    rows,
    row_mask,
    blk,
    i,
    KP,
    GROUPS,
    NUM_BLOCKS,
    GROUP: tl.constexpr,
    IB: tl.constexpr,
    EVEN: tl.constexpr,
    W_EVICT: tl.constexpr = "",
):
    # The [NB, BLOCK_N, IB] packed ints of blocks blk for these rows, and each (block, row)'s scale and zero.
    # W_EVICT: their L2 policy (as the dense GEMV's, jit_gemv._gemv_kernel).
    w_ptrs = qw_ptr + rows[None, :, None] * KP + (blk * IB)[:, None, None] + i[None, None, :]
    sz_ptrs = rows[None, :] * GROUPS + ((blk * 8 * IB) // GROUP)[:, None]
    if EVEN:
        packed = tl.load(w_ptrs, eviction_policy=W_EVICT)
        s = tl.load(s_ptr + sz_ptrs, eviction_policy=W_EVICT).to(tl.float32)
        z = tl.load(z_ptr + sz_ptrs, eviction_policy=W_EVICT).to(tl.float32)
    else:
        tile_mask = (blk < NUM_BLOCKS)[:, None] & row_mask[None, :]  # [NB, BLOCK_N]
        packed = tl.load(w_ptrs, mask=tile_mask[:, :, None], other=0, eviction_policy=W_EVICT)
        s = tl.load(s_ptr + sz_ptrs, mask=tile_mask, other=0.0, eviction_policy=W_EVICT).to(tl.float32)
        z = tl.load(z_ptr + sz_ptrs, mask=tile_mask, other=0.0, eviction_policy=W_EVICT).to(tl.float32)
    return packed, s, z


@triton.jit
def _int4_dot_blocks(
    packed,
    s,
    z,
    x_ptr,
    blk,
    i,
    NUM_BLOCKS,
    SIXTEEN_BITS,
    TWO_FIFTY_SIX_BITS,
    IB: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NB: tl.constexpr,
    EVEN: tl.constexpr,
):
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
def _int4_gemv_kernel(
    x_ptr,
    qw_ptr,
    s_ptr,
    z_ptr,
    out_ptr,
    part_ptr,
    count_ptr,
    N,
    KP,
    GROUPS,
    NUM_BLOCKS,
    SPLITS,
    SIXTEEN_BITS,
    TWO_FIFTY_SIX_BITS,
    GROUP: tl.constexpr,
    IB: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NB: tl.constexpr,
    CHUNKS: tl.constexpr,
    EVEN: tl.constexpr,
    SILU_OUTPUT: tl.constexpr,
    PDL: tl.constexpr,
    W_EVICT: tl.constexpr = "",
):
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
    # the next kernel start early. Nothing is written before the wait. W_EVICT: the weights' L2 policy
    # (gemv.GEMV_WEIGHT_EVICTION).
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    i = tl.arange(0, IB)
    blk0 = tl.program_id(1) * (CHUNKS * NB) + tl.arange(0, NB)
    packed0, s0, z0 = _int4_load_blocks(
        qw_ptr, s_ptr, z_ptr, rows, row_mask, blk0, i, KP, GROUPS, NUM_BLOCKS, GROUP, IB, EVEN, W_EVICT
    )
    if CHUNKS > 1:
        packed1, s1, z1 = _int4_load_blocks(
            qw_ptr, s_ptr, z_ptr, rows, row_mask, blk0 + NB, i, KP, GROUPS, NUM_BLOCKS, GROUP, IB, EVEN, W_EVICT
        )
    if CHUNKS > 2:
        packed2, s2, z2 = _int4_load_blocks(
            qw_ptr, s_ptr, z_ptr, rows, row_mask, blk0 + 2 * NB, i, KP, GROUPS, NUM_BLOCKS, GROUP, IB, EVEN, W_EVICT
        )
    if CHUNKS > 3:
        packed3, s3, z3 = _int4_load_blocks(
            qw_ptr, s_ptr, z_ptr, rows, row_mask, blk0 + 3 * NB, i, KP, GROUPS, NUM_BLOCKS, GROUP, IB, EVEN, W_EVICT
        )
    if PDL:
        tl.extra.cuda.gdc_wait()
    per_block = _int4_dot_blocks(
        packed0, s0, z0, x_ptr, blk0, i, NUM_BLOCKS, SIXTEEN_BITS, TWO_FIFTY_SIX_BITS, IB, BLOCK_N, NB, EVEN
    )
    if CHUNKS > 1:
        per_block += _int4_dot_blocks(
            packed1, s1, z1, x_ptr, blk0 + NB, i, NUM_BLOCKS, SIXTEEN_BITS, TWO_FIFTY_SIX_BITS, IB, BLOCK_N, NB, EVEN
        )
    if CHUNKS > 2:
        per_block += _int4_dot_blocks(
            packed2,
            s2,
            z2,
            x_ptr,
            blk0 + 2 * NB,
            i,
            NUM_BLOCKS,
            SIXTEEN_BITS,
            TWO_FIFTY_SIX_BITS,
            IB,
            BLOCK_N,
            NB,
            EVEN,
        )
    if CHUNKS > 3:
        per_block += _int4_dot_blocks(
            packed3,
            s3,
            z3,
            x_ptr,
            blk0 + 3 * NB,
            i,
            NUM_BLOCKS,
            SIXTEEN_BITS,
            TWO_FIFTY_SIX_BITS,
            IB,
            BLOCK_N,
            NB,
            EVEN,
        )
    _finish_rows(
        out_ptr, part_ptr, count_ptr, tl.sum(per_block, axis=0), rows, row_mask, N, SPLITS, BLOCK_N, SILU_OUTPUT
    )


@triton.jit
def _int4_dequantize_kernel(
    qw_ptr,
    s_ptr,
    z_ptr,
    w_ptr,
    N,
    K,
    GROUPS,
    GROUP: tl.constexpr,
    IB: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GATE_UP_PAIRS: tl.constexpr,
):
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
        tl.store(
            w_ptr + dense_rows[:, None] * K + (k0 + j * IB + i)[None, :],
            w.to(w_ptr.dtype.element_ty),
            mask=row_mask[:, None],
        )


@triton.jit
def _int4pack_dequantize_kernel(
    packed_ptr, sz_ptr, w_ptr, N, K, K_OUTER, IKT2, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr
):
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
