"""The prefill attention's Triton kernels (the attention and the split reduce), by themselves: this module
imports Triton and nothing else (no torch; jit_common, the helpers the kernel modules share, is Triton's too), so a
first start's compile worker processes (compile_workers) can load them in a fraction of a second. The host-side
wrapper, its tile shapes and buffers are in prefill_attention."""

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
)


@triton.jit
def _prefill_kv_tile(
    k_ptr,
    v_ptr,
    base,
    n0,
    n,
    d,
    hi,
    v_base,
    v_rows,
    D: tl.constexpr,
    MASKED: tl.constexpr,
    TMA: tl.constexpr,
    V_T: tl.constexpr,
):
    """The K and V tiles of keys n = n0 + [0, BLOCK_N) of one KV head (base: its first element; with TMA its
    first row). MASKED: keys from hi on are zeros. A descriptor reads whole tiles (rows past the tensor come back
    as zeros), so a masked tile's rows from hi on are whatever the cache holds there: K's scores are masked by the
    caller, and V's rows were zeroed by this prefill's _rope_bias_cache_kernel (STALE_V_ROWS; a NaN left there by
    an earlier reply that overflowed would survive a zero weight). Zeroing them here instead (tl.where) takes V
    through registers and costs the TMA loads their gain (docs/BENCHMARKS.md, 'Tried and rejected', the prefill
    kernels; prefill_attention_tma.py, in git history). V_T (a transposed value cache, _v_offsets; v_base:
    its KV head's first element): V is read whole likewise, 16 tokens a load."""
    if V_T:
        v = tl.load(v_ptr + v_base + d[None, :] * v_rows + n[:, None])
    if TMA:
        row = base // D + n0
        k = k_ptr.load([row, 0])
        v = v_ptr.load([row, 0])
    elif MASKED:
        k = tl.load(k_ptr + base + n[:, None] * D + d[None, :], mask=(n < hi)[:, None], other=0.0)
        if not V_T:
            v = tl.load(v_ptr + base + n[:, None] * D + d[None, :], mask=(n < hi)[:, None], other=0.0)
    else:
        k = tl.load(k_ptr + base + n[:, None] * D + d[None, :])
        if not V_T:
            v = tl.load(v_ptr + base + n[:, None] * D + d[None, :])
    return k, v


@triton.jit(do_not_specialize=["n_tokens", "splits"])
def _prefill_attn_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    mid_o_ptr,
    mid_lse_ptr,
    start_ptr,
    n_tokens,
    max_ctx,
    scale,
    splits,
    k_scale_ptr,
    v_scale_ptr,
    v_rows,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    IEEE: tl.constexpr,
    PDL: tl.constexpr,
    TMA: tl.constexpr = False,
    PACK_GQA: tl.constexpr = False,
    KV_FP8: tl.constexpr = False,
    V_T: tl.constexpr = False,
):
    # Causal attention of n_tokens new queries at positions start.. over the cache's keys 0..start+n_tokens-1,
    # bottom-right aligned (query i sees keys <= start+i). `start` is read on the device, so one captured graph
    # per length bucket serves any cached prefix; no mask tensor and no repeated K/V (the KV head is indexed).
    # SPLIT (few queries, long prefix): the keys are cut into `splits` ranges whose partial results
    # _prefill_attn_reduce_kernel combines, so short prefills still fill the GPU. The split count is a plain
    # int so that every bucket shares two compiled variants (split or not).
    # TMA (Hopper and newer, 16-bit, not split): k_ptr and v_ptr are tensor descriptors of the caches as
    # [Hkv * max_ctx, D] with [BLOCK_N, D] blocks, so the K/V tiles come in through the tensor memory accelerator
    # instead of per-thread address arithmetic and loads, which measured faster for every follow-up prefill shape
    # (with a V guard TMA loses instead: docs/BENCHMARKS.md, 'Tried and rejected').
    # PACK_GQA: a program holds the GROUP query heads of one KV head for BLOCK_M // GROUP tokens (row r: token
    # r // GROUP, head r % GROUP of the group; the last BLOCK_M % GROUP rows idle), so each K/V tile it reads
    # serves every query head that shares it, instead of being read once per query head.
    _pdl_start(PDL)
    mblock = tl.num_programs(0) - 1 - tl.program_id(0)  # the last rows see the most keys: start them first
    split = tl.program_id(2)
    start = tl.load(start_ptr)
    r = tl.arange(0, BLOCK_M)
    if PACK_GQA:
        kvh = tl.program_id(1)
        block_tokens = BLOCK_M // GROUP
        rows = mblock * block_tokens + r // GROUP  # each row's token
        head = kvh * GROUP + r % GROUP  # and query head
        row_mask = (r < block_tokens * GROUP) & (rows < n_tokens)
        head_col = head[:, None]
    else:
        head = tl.program_id(1)
        kvh = head // GROUP
        block_tokens = BLOCK_M
        rows = mblock * BLOCK_M + r
        row_mask = rows < n_tokens
        head_col = head
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (rows[:, None] * NUM_HEADS + head_col) * D + d[None, :], mask=row_mask[:, None], other=0.0)
    visible = start + rows  # last key each row may see
    hi = tl.minimum(start + (mblock + 1) * block_tokens, start + n_tokens)  # keys this block needs
    chunk = tl.cdiv(tl.cdiv(start + n_tokens, splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(hi, lo + chunk)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    base = kvh * max_ctx * D
    v_base = kvh * D * v_rows  # V_T only
    # Keys below start + the block's first row are visible to every row of the block: whole key blocks there
    # need no mask (most of the work of a long prefill); the rest, up to the diagonal, are masked.
    open_blocks = tl.maximum(tl.minimum(start + mblock * block_tokens, hi) - lo, 0) // BLOCK_N
    qk_scale = scale * LOG2_E  # 16-bit inputs: m_i in log2 units (_online_softmax_block_exp2)
    for i in range(0, open_blocks):
        n = lo + i * BLOCK_N + tl.arange(0, BLOCK_N)
        k, v = _prefill_kv_tile(
            k_ptr, v_ptr, base, lo + i * BLOCK_N, n, d, hi, v_base, v_rows, D, MASKED=False, TMA=TMA, V_T=V_T
        )
        ks, vs = _kv_scales(k_scale_ptr, v_scale_ptr, kvh * max_ctx + n, n >= 0, KV_FP8)
        if IEEE:
            m_i, l_i, acc = _online_softmax_block(
                q, k, v, None, m_i, l_i, acc, scale, IEEE, MASKED=False, k_scale=ks, v_scale=vs, KV_SCALED=KV_FP8
            )
        else:
            m_i, l_i, acc = _online_softmax_block_exp2(
                q, k, v, None, m_i, l_i, acc, qk_scale, MASKED=False, k_scale=ks, v_scale=vs, KV_SCALED=KV_FP8
            )
    for n_start in range(lo + open_blocks * BLOCK_N, hi, BLOCK_N):
        n = n_start + tl.arange(0, BLOCK_N)
        k, v = _prefill_kv_tile(k_ptr, v_ptr, base, n_start, n, d, hi, v_base, v_rows, D, MASKED=True, TMA=TMA, V_T=V_T)
        ks, vs = _kv_scales(k_scale_ptr, v_scale_ptr, kvh * max_ctx + n, n < hi, KV_FP8)
        visible_mask = (n[None, :] <= visible[:, None]) & (n[None, :] < hi)
        if IEEE:
            m_i, l_i, acc = _online_softmax_block(
                q, k, v, visible_mask, m_i, l_i, acc, scale, IEEE, k_scale=ks, v_scale=vs, KV_SCALED=KV_FP8
            )
        else:
            m_i, l_i, acc = _online_softmax_block_exp2(
                q, k, v, visible_mask, m_i, l_i, acc, qk_scale, k_scale=ks, v_scale=vs, KV_SCALED=KV_FP8
            )
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    if not SPLIT:
        tl.store(
            out_ptr + (rows[:, None] * NUM_HEADS + head_col) * D + d[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=row_mask[:, None],
        )
    else:  # partial result of this key range; a row that saw none of it gets weight 0 (lse -inf)
        mid = (split * n_tokens + rows) * NUM_HEADS + head
        tl.store(mid_o_ptr + mid[:, None] * D + d[None, :], o, mask=row_mask[:, None])
        if IEEE:
            lse = m_i + tl.log(l_safe)
        else:  # back to natural units, as the reduce kernel reads them
            lse = (m_i + tl.log2(l_safe)) * LN_2
        tl.store(mid_lse_ptr + mid, tl.where(l_i > 0, lse, float("-inf")), mask=row_mask)


@triton.jit(do_not_specialize=["n_rows", "splits"])
def _prefill_attn_reduce_kernel(
    mid_o_ptr, mid_lse_ptr, out_ptr, n_rows, splits, D: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr
):
    # ROWS (token, head) rows per program, over the splits in use only (one row per program over all
    # MAX_SPLITS slots makes the reduce a large part of a long prefill's attention).
    _pdl_start(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # token * NUM_HEADS + head
    live = rows < n_rows
    d = tl.arange(0, D)
    m = tl.full([ROWS], float("-inf"), tl.float32)
    for s in range(0, splits):
        m = tl.maximum(m, tl.load(mid_lse_ptr + s * n_rows + rows, mask=live, other=float("-inf")))
    m = tl.where(m == float("-inf"), 0.0, m)  # every live row sees key 0, so some split is finite
    acc = tl.zeros([ROWS, D], tl.float32)
    total = tl.zeros([ROWS], tl.float32)
    for s in range(0, splits):
        w = tl.exp(tl.load(mid_lse_ptr + s * n_rows + rows, mask=live, other=float("-inf")) - m)
        o = tl.load(mid_o_ptr + (s * n_rows + rows)[:, None] * D + d[None, :], mask=live[:, None], other=0.0)
        acc += tl.where(w[:, None] > 0, o, 0.0) * w[:, None]  # a split a row saw nothing of holds no values
        total += w
    total = tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + rows[:, None] * D + d[None, :],
        (acc / total[:, None]).to(out_ptr.dtype.element_ty),
        mask=live[:, None],
    )
