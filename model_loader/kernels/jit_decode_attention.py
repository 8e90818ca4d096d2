"""The decode attention's Triton kernels (the split kernel and the reduce), by themselves: this module imports
Triton and nothing else (no torch; jit_common, the helpers the kernel modules share, is Triton's too), so a first
start's compile worker processes (compile_workers) can load them in a fraction of a second. The host-side wrapper,
its configurations and buffers are in decode_attention."""

from __future__ import annotations

import triton
import triton.language as tl

from model_loader.kernels.jit_common import (
    LN_2,
    LOG2_E,
    _kv_scales,
    _online_softmax_block,
    _online_softmax_block_exp2,
    _pdl_start,
    _v_offsets,
)


@triton.jit
def _decode_block(
    q,
    k,
    v,
    visible,
    m_i,
    l_i,
    acc,
    scale,
    IEEE: tl.constexpr,
    MASKED: tl.constexpr,
    ks,
    vs,
    KV_FP8: tl.constexpr,
    V_T: tl.constexpr,
    EXP2: tl.constexpr,
):
    """One K/V tile into the decode kernel's running state. EXP2: through exp2 with m_i in log2
    units (_online_softmax_block_exp2: a multiply less a score, and the rescaled accumulator goes into the P.V
    dot); else through _online_softmax_block, in natural units (fp32 models, IEEE; a row-major 8-bit V, whose
    rows past the end it zeroes). _decode_lse reads m_i back."""
    if not EXP2:
        m_i, l_i, acc = _online_softmax_block(
            q,
            k,
            v,
            visible,
            m_i,
            l_i,
            acc,
            scale,
            IEEE,
            MASKED=MASKED,
            k_scale=ks,
            v_scale=vs,
            KV_SCALED=KV_FP8,
            V_ROW_MASK=KV_FP8 and not V_T,
        )
    else:
        m_i, l_i, acc = _online_softmax_block_exp2(
            q, k, v, visible, m_i, l_i, acc, scale * LOG2_E, MASKED=MASKED, k_scale=ks, v_scale=vs, KV_SCALED=KV_FP8
        )
    return m_i, l_i, acc


@triton.jit
def _decode_lse(m_i, l_i, EXP2: tl.constexpr):
    """The split's log-sum-exp in natural units (what the reduce reads) from _decode_block's state."""
    if not EXP2:
        lse = m_i + tl.log(l_i)
    else:
        lse = (m_i + tl.log2(l_i)) * LN_2
    return lse


@triton.jit
def _decode_tile(
    q,
    k_ptr,
    v_ptr,
    k_scale_ptr,
    v_scale_ptr,
    kvh,
    n0,
    end,
    d,
    max_ctx,
    v_rows,
    m_i,
    l_i,
    acc,
    scale,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    IEEE: tl.constexpr,
    KV_FP8: tl.constexpr,
    V_T: tl.constexpr,
    WHOLE: tl.constexpr,
    EXP2: tl.constexpr,
):
    """The decode loop's step: the tile of tokens n0.. (those from `end` on masked out, unless WHOLE: every
    token of it is below end, and nothing is masked) read and taken into the running state."""
    n = n0 + tl.arange(0, BLOCK_N)
    n_mask = n < end  # unused (and compiled out) for a whole tile
    k, v = _kv_tile(
        k_ptr,
        v_ptr,
        (kvh * max_ctx + n[:, None]) * D + d[None, :],
        _v_offsets(kvh, n[:, None], d[None, :], max_ctx, v_rows, D, V_T),
        n_mask,
        V_T=V_T,
        WHOLE=WHOLE,
    )
    ks, vs = _kv_scales(k_scale_ptr, v_scale_ptr, kvh * max_ctx + n, n_mask, KV_FP8, WHOLE=WHOLE)
    return _decode_block(q, k, v, n_mask[None, :], m_i, l_i, acc, scale, IEEE, not WHOLE, ks, vs, KV_FP8, V_T, EXP2)


@triton.jit
def _decode_chunk(length, MAX_SPLITS, MIN_CHUNK, ALIGN):
    # Tokens per split, from the depth read on the device: short contexts use few splits of MIN_CHUNK tokens,
    # long ones all MAX_SPLITS splits. One captured graph so serves every depth with no host sync. ALIGN: a
    # split's tokens are a multiple of it (the loop step, or fewer so that all MAX_SPLITS splits get work at
    # depths like 32,768 that a loop-step multiple would leave to 64 of 66 splits).
    chunk = tl.cdiv(tl.cdiv(length, MAX_SPLITS), ALIGN) * ALIGN
    return tl.maximum(chunk, MIN_CHUNK)


@triton.jit
def _kv_tile(
    k_ptr,
    v_ptr,
    k_offs,
    v_offs,
    rows,
    F16: tl.constexpr = False,
    V_T: tl.constexpr = False,
    WHOLE: tl.constexpr = False,
):
    """A tile of cached keys and values (rows: which of its tokens to read; the rest are 0; WHOLE: all of them,
    read with no mask). F16: upcast at once (an 8-bit cache's early tile: the branch that may re-read it then
    carries fp16 pairs, not one fp8 byte a register, which spilled). V_T (a transposed value cache,
    _v_offsets): V is read whole, 16 tokens a load (a mask per token would cut the loads to single bytes, and a
    select over the tile took the kernel from 770 to 1,286 instructions a tile: benchmarks/decode_kernel_sass.py);
    the rows past `rows` get zero weight and are finite (the cache writer never stores a NaN: _store_fp8_rows;
    zeros past max_ctx)."""
    if WHOLE:
        k = tl.load(k_ptr + k_offs)
    else:
        k = tl.load(k_ptr + k_offs, mask=rows[:, None], other=0.0)
    if V_T or WHOLE:
        v = tl.load(v_ptr + v_offs)
    else:
        v = tl.load(v_ptr + v_offs, mask=rows[:, None], other=0.0)
    if F16:
        k, v = k.to(tl.float16), v.to(tl.float16)
    return k, v


@triton.jit
def _decode_attn_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    mid_o_ptr,
    mid_lse_ptr,
    max_ctx,
    scale,
    k_scale_ptr,
    v_scale_ptr,
    v_rows,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    MIN_CHUNK: tl.constexpr,
    CHUNK_ALIGN: tl.constexpr,
    PDL: tl.constexpr,
    IEEE: tl.constexpr,
    LATE_LAUNCH: tl.constexpr,
    EARLY_TILE: tl.constexpr,
    KV_FP8: tl.constexpr = False,
    V_T: tl.constexpr = False,
    WHOLE_TILES: tl.constexpr = False,
):
    # One program per (KV head, split): the KV head's GROUP query heads share every K/V tile it loads.
    # LATE_LAUNCH: let the next kernels launch (programmatic dependent launch) only once this one has read its
    # K/V, so the weight requests of the GEMVs queued behind it don't compete with a long cache read.
    # EARLY_TILE: request the split's first K/V tile before waiting for the kernel ahead (which writes q and the
    # current token's K/V row), so the cache read's first DRAM round trip overlaps that kernel's end instead of
    # following it. Only rows of earlier tokens are read early: earlier graph launches wrote them (and the
    # position, which the step advances as its last operation), whereas the kernels ahead in this launch may
    # still be running. The tile holding the current token's row is read again after the wait.
    # V_T: the value cache is stored transposed (_v_offsets); with CHUNK_ALIGN a multiple of 16 every tile then
    # starts on 16 tokens, so V comes in 16 bytes a load along its tokens, ready for the P.V dot (_kv_tile).
    # WHOLE_TILES (with EARLY_TILE, over a 16-bit cache): the early tile is the split's part tile, so the loop's
    # tiles are whole and unmasked; and 16-bit models take the exp2 softmax (not over a row-major 8-bit V, whose
    # rows past the end only _online_softmax_block zeroes). See DecodeAttnConfig.whole_tiles.
    EXP2: tl.constexpr = WHOLE_TILES and not IEEE and not (KV_FP8 and not V_T)
    WHOLE: tl.constexpr = EARLY_TILE and WHOLE_TILES and not KV_FP8
    if PDL:
        if not LATE_LAUNCH:
            tl.extra.cuda.gdc_launch_dependents()
        if not EARLY_TILE:
            tl.extra.cuda.gdc_wait()
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    length = tl.load(pos_ptr) + 1  # the current token is already in the cache
    chunk = _decode_chunk(length, MAX_SPLITS, MIN_CHUNK, CHUNK_ALIGN)
    start = split * chunk
    if start < length:  # splits past the depth do nothing; the reduce only reads the active ones
        end = tl.minimum(start + chunk, length)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, D)
        g_mask = g < GROUP
        base = kvh * max_ctx * D
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, D], tl.float32)
        first = start
        if EARLY_TILE:  # the first tile by itself, ahead of the loop (without it the kernel is the plain loop)
            n = start + tl.arange(0, BLOCK_N)
            offs = base + n[:, None] * D + d[None, :]
            v_offs = _v_offsets(kvh, n[:, None], d[None, :], max_ctx, v_rows, D, V_T)
            if WHOLE:
                # As many tokens as leave a whole number of tiles to the split's end (1 to BLOCK_N): the loop's
                # tiles are then whole and run with no mask (the loop is bound by its instructions, and the
                # mask cost a compare and a select a token). Not over an 8-bit cache, whose transposed V tiles
                # must start on 16 tokens (_kv_tile), nor without the early tile, where this part tile would be
                # one more DRAM round trip outside the pipelined loop.
                first = end - (end - start - 1) // BLOCK_N * BLOCK_N
                n_mask = n < first
                older = n < tl.minimum(first, length - 1)
                ek, ev = _kv_tile(k_ptr, v_ptr, offs, v_offs, older, F16=KV_FP8, V_T=V_T)
                ks, vs = _kv_scales(k_scale_ptr, v_scale_ptr, kvh * max_ctx + n, older, KV_FP8)
                if PDL:
                    tl.extra.cuda.gdc_wait()
                if first >= length:  # the tile reaches the current token's row: read it whole now
                    ek, ev = _kv_tile(k_ptr, v_ptr, offs, v_offs, n_mask, F16=KV_FP8, V_T=V_T)
                    ks, vs = _kv_scales(k_scale_ptr, v_scale_ptr, kvh * max_ctx + n, n_mask, KV_FP8)
            else:  # a whole tile, as far as the split goes (written apart: the short-context shape, which has no
                # whole tiles, then compiles to the same machine code as before them; sharing these lines with
                # the branch above changed its registers and uniform instructions, sm_90)
                n_mask = n < end
                older = n < tl.minimum(end, length - 1)
                ek, ev = _kv_tile(k_ptr, v_ptr, offs, v_offs, older, F16=KV_FP8, V_T=V_T)
                ks, vs = _kv_scales(k_scale_ptr, v_scale_ptr, kvh * max_ctx + n, older, KV_FP8)
                if PDL:
                    tl.extra.cuda.gdc_wait()
                if start + BLOCK_N >= length:  # the tile reaches the current token's row: read it whole now
                    ek, ev = _kv_tile(k_ptr, v_ptr, offs, v_offs, n_mask, F16=KV_FP8, V_T=V_T)
                    ks, vs = _kv_scales(k_scale_ptr, v_scale_ptr, kvh * max_ctx + n, n_mask, KV_FP8)
                first = start + BLOCK_N
        q = tl.load(q_ptr + (kvh * GROUP + g[:, None]) * D + d[None, :], mask=g_mask[:, None], other=0.0)
        if EARLY_TILE:
            m_i, l_i, acc = _decode_block(
                q, ek, ev, n_mask[None, :], m_i, l_i, acc, scale, IEEE, True, ks, vs, KV_FP8, V_T, EXP2
            )
        if WHOLE:  # whole tiles from `first` on (see the early tile above)
            for n0 in range(first, end, BLOCK_N):
                m_i, l_i, acc = _decode_tile(
                    q,
                    k_ptr,
                    v_ptr,
                    k_scale_ptr,
                    v_scale_ptr,
                    kvh,
                    n0,
                    end,
                    d,
                    max_ctx,
                    v_rows,
                    m_i,
                    l_i,
                    acc,
                    scale,
                    BLOCK_N,
                    D,
                    IEEE,
                    KV_FP8,
                    V_T,
                    True,
                    EXP2,
                )
        else:
            for n0 in range(first, end, BLOCK_N):
                m_i, l_i, acc = _decode_tile(
                    q,
                    k_ptr,
                    v_ptr,
                    k_scale_ptr,
                    v_scale_ptr,
                    kvh,
                    n0,
                    end,
                    d,
                    max_ctx,
                    v_rows,
                    m_i,
                    l_i,
                    acc,
                    scale,
                    BLOCK_N,
                    D,
                    IEEE,
                    KV_FP8,
                    V_T,
                    False,
                    EXP2,
                )
        heads = kvh * GROUP + g
        out_base = heads * MAX_SPLITS + split
        tl.store(mid_o_ptr + out_base[:, None] * D + d[None, :], acc / l_i[:, None], mask=g_mask[:, None])
        tl.store(mid_lse_ptr + out_base, _decode_lse(m_i, l_i, EXP2), mask=g_mask)
    if PDL:
        if LATE_LAUNCH:
            tl.extra.cuda.gdc_launch_dependents()


# Not specialized on its integer arguments: the split shapes' 1, 66 and multiples of 16 would each make a variant
# of their own (one more compile on a first start) for arithmetic done once per program.
@triton.jit(do_not_specialize=["chunk_align", "max_splits", "min_chunk"])
def _decode_attn_reduce_kernel(
    mid_o_ptr,
    mid_lse_ptr,
    out_ptr,
    pos_ptr,
    chunk_align,
    max_splits,
    min_chunk,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PDL: tl.constexpr,
):
    # Combines the active splits of one query head for BLOCK_D of its dimensions (online log-sum-exp, BLOCK_S
    # splits at a time): heads x D/BLOCK_D programs, so the combine is not a dozen long serial programs. The
    # split shape comes as plain ints, so configurations share a compiled reduce unless Triton specializes them
    # apart (an int of 1 or one divisible by 16 is a different variant to it).
    _pdl_start(PDL)
    head = tl.program_id(0)
    length = tl.load(pos_ptr) + 1
    active = tl.cdiv(length, _decode_chunk(length, max_splits, min_chunk, chunk_align))
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    m = tl.max(tl.full([BLOCK_S], float("-inf"), tl.float32), axis=0)
    total = tl.sum(tl.zeros([BLOCK_S], tl.float32), axis=0)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for s0 in range(0, active, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        s_mask = s < active
        lse = tl.load(mid_lse_ptr + head * max_splits + s, mask=s_mask, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(lse, axis=0))
        alpha = tl.exp(m - m_new)
        w = tl.exp(lse - m_new)  # masked splits: exp(-inf) = 0
        o = tl.load(mid_o_ptr + (head * max_splits + s[:, None]) * D + d[None, :], mask=s_mask[:, None], other=0.0)
        acc = acc * alpha + tl.sum(o * w[:, None], axis=0)
        total = total * alpha + tl.sum(w, axis=0)
        m = m_new
    tl.store(out_ptr + head * D + d, (acc / total).to(out_ptr.dtype.element_ty))
