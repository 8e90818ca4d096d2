"""The Triton kernels of triton_ops, by themselves: this module imports Triton and nothing else (no torch),
so a first start's compile worker processes (precompile) can load them in a fraction of a second. The host-side
wrappers, launch shapes and buffers are in triton_ops, which re-exports these names."""

from __future__ import annotations

import triton
import triton.language as tl

LOG2_E = tl.constexpr(1.4426950408889634)  # the prefill attention's scores go through exp2
LN_2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _pdl_start(PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, n_cols, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    _pdl_start(PDL)
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        x += tl.load(res_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(res_ptr + row * n_cols + cols, x.to(res_ptr.dtype.element_ty), mask=mask)
    # Normalise the rounded residual, exactly what the reference (and HF) sees.
    x = x.to(res_ptr.dtype.element_ty).to(tl.float32)
    var = tl.sum(x * x, axis=0) / n_cols
    y = x * tl.rsqrt(var + eps) * w
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


STALE_V_ROWS = tl.constexpr(128)  # at least the prefill attention's key tile height (PrefillAttention.SHAPES)


@triton.jit
def _v_offsets(head, n, d, max_ctx, v_rows, D: tl.constexpr, V_T: tl.constexpr):
    """Element offsets of value entries (token n, dimension d; broadcast shapes) of KV head `head` in a value
    cache of max_ctx rows: [Hkv, max_ctx, D] row after row, or with V_T transposed, [Hkv, D, v_rows] (each
    dimension's tokens contiguous, v_rows >= max_ctx rows a head; kv_cache.py says why an 8-bit cache does)."""
    if V_T:
        return (head * D + d) * v_rows + n
    return (head * max_ctx + n) * D + d


@triton.jit(do_not_specialize=["n_tokens"])
def _rope_bias_cache_kernel(
    qkv_ptr,
    bias_ptr,
    cos_ptr,
    sin_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    pos_ptr,
    n_tokens,
    max_ctx,
    k_scale_ptr,
    v_scale_ptr,
    v_rows,
    NUM_HEADS: tl.constexpr,
    NUM_KV: tl.constexpr,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PDL: tl.constexpr,
    KV_FP8: tl.constexpr = False,
    V_T: tl.constexpr = False,
):
    # BLOCK_T tokens of one head per program: 1 for a decode step; a prefill takes blocks, as one token's head
    # (256 bytes) per program left a 2,048-token prefill latency-bound (H200: 40 us a layer instead of ~5).
    # A prefill also zeroes the STALE_V_ROWS value rows after its tokens (within the head's max_ctx rows): the
    # prefill attention's last key tile reads them whole through TMA (_prefill_kv_tile), and a stale NaN there
    # would survive its zero weight. Nothing valid lives there: the sequence ends at the last new token.
    # KV_FP8: the cache holds K and V in fp8 (e4m3) with one fp32 scale per (KV head, token) row (kv_cache.py).
    # V_T: the value cache is stored transposed (_v_offsets; v_rows a head's row length).
    _pdl_start(PDL)
    if BLOCK_T > 1:
        if (tl.program_id(1) >= NUM_HEADS + NUM_KV) & (tl.program_id(0) == tl.num_programs(0) - 1):
            stale = tl.load(pos_ptr) + n_tokens + tl.arange(0, STALE_V_ROWS)
            vh = tl.program_id(1) - NUM_HEADS - NUM_KV
            dst = v_cache_ptr + _v_offsets(vh, stale[:, None], tl.arange(0, D)[None, :], max_ctx, v_rows, D, V_T)
            tl.store(dst, tl.zeros([STALE_V_ROWS, D], v_cache_ptr.dtype.element_ty), mask=(stale < max_ctx)[:, None])
            if KV_FP8:  # a NaN scale would make the zeroed rows NaN again
                tl.store(v_scale_ptr + vh * max_ctx + stale, tl.zeros([STALE_V_ROWS], tl.float32), mask=stale < max_ctx)
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    head = tl.program_id(1)  # 0..Hq-1: q heads, then Hkv k heads, then Hkv v heads
    live = (tok < n_tokens)[:, None]
    pos = (tl.load(pos_ptr) + tok)[:, None]
    half = tl.arange(0, D // 2)[None, :]
    row = qkv_ptr + tok[:, None] * (NUM_HEADS + 2 * NUM_KV) * D + head * D
    x1 = tl.load(row + half, mask=live).to(tl.float32) + tl.load(bias_ptr + head * D + half).to(tl.float32)
    x2 = tl.load(row + D // 2 + half, mask=live).to(tl.float32) + tl.load(bias_ptr + head * D + D // 2 + half).to(
        tl.float32
    )
    if head < NUM_HEADS + NUM_KV:
        c = tl.load(cos_ptr + pos * (D // 2) + half, mask=live)
        s = tl.load(sin_ptr + pos * (D // 2) + half, mask=live)
        y1 = x1 * c - x2 * s
        y2 = x2 * c + x1 * s
    else:
        y1 = x1
        y2 = x2
    if head < NUM_HEADS:
        dst = q_ptr + tok[:, None] * NUM_HEADS * D + head * D
        tl.store(dst + half, y1.to(q_ptr.dtype.element_ty), mask=live)
        tl.store(dst + D // 2 + half, y2.to(q_ptr.dtype.element_ty), mask=live)
    else:
        if head < NUM_HEADS + NUM_KV:
            kvh = head - NUM_HEADS
            cache_ptr, scale_ptr = k_cache_ptr, k_scale_ptr
            first = (kvh * max_ctx + pos) * D + half
            second = first + D // 2
        else:
            kvh = head - NUM_HEADS - NUM_KV
            cache_ptr, scale_ptr = v_cache_ptr, v_scale_ptr
            first = _v_offsets(kvh, pos, half, max_ctx, v_rows, D, V_T)
            second = _v_offsets(kvh, pos, D // 2 + half, max_ctx, v_rows, D, V_T)
        if KV_FP8:
            _store_fp8_rows(cache_ptr, scale_ptr, kvh * max_ctx + pos, first, second, y1, y2, live)
        else:
            tl.store(cache_ptr + first, y1.to(cache_ptr.dtype.element_ty), mask=live)
            tl.store(cache_ptr + second, y2.to(cache_ptr.dtype.element_ty), mask=live)


FP8_MAX = tl.constexpr(448.0)  # the largest finite e4m3 value


@triton.jit
def _store_fp8_rows(cache_ptr, scale_ptr, row, first, second, y1, y2, live):
    """Rows [T, D] (as halves y1, y2, fp32) into an fp8 cache at element offsets first / second (each half's),
    each row scaled so that its largest magnitude lands on FP8_MAX, the scale kept at scale_ptr + row [T, 1] (an
    all-zero row gets a tiny scale). A value not finite after scaling (a row that overflowed) is stored as 0:
    the cache never holds e4m3's NaN, so the attention may read a transposed value cache's tiles whole, rows
    past the depth included (_kv_tile), where a stale NaN would survive its zero weight."""
    amax = tl.maximum(tl.max(tl.abs(y1), axis=1), tl.max(tl.abs(y2), axis=1))
    scale = tl.maximum(amax, 1e-30) / FP8_MAX
    inv = (1.0 / scale)[:, None]
    tl.store(cache_ptr + first, _finite_e4m3(y1 * inv).to(cache_ptr.dtype.element_ty), mask=live)
    tl.store(cache_ptr + second, _finite_e4m3(y2 * inv).to(cache_ptr.dtype.element_ty), mask=live)
    tl.store(scale_ptr + row, scale[:, None], mask=live)


@triton.jit
def _finite_e4m3(x):
    """_round_to_e4m3 of x (|x| <= ~448 where finite), with NaN and inf as 0."""
    return tl.where(tl.abs(x) < float("inf"), _round_to_e4m3(x), 0.0)


@triton.jit
def _round_to_e4m3(x):
    """fp32 x (|x| <= ~448) rounded to the nearest e4m3 value, ties to even, still in fp32, so that the conversion
    after it is exact. The GPU's conversion rounds the same way by itself; Triton's interpreter (the CPU tests)
    does not carry a mantissa that rounds up into the exponent (31.9 became 16) and rounds ties away from zero.
    The step is read from x's exponent bits (no log2 approximation): 2^(e - 3), e4m3's 3 mantissa bits, and
    2^-9 below the smallest normal exponent (-6), where e4m3 is subnormal."""
    bits = x.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)
    step = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)
    q = tl.abs(x) / step  # exact: a power of two
    fl = tl.floor(q)
    frac = q - fl
    odd = fl - 2.0 * tl.floor(fl * 0.5)
    r = fl + tl.where((frac > 0.5) | ((frac == 0.5) & (odd == 1.0)), 1.0, 0.0)
    return tl.where(x < 0, -r * step, r * step)


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr, PAIRED: tl.constexpr, PDL: tl.constexpr):
    # x: [gate | up] per row, or PAIRED: (gate 0, up 0, gate 1, ...) as a paired gate/up weight outputs it
    _pdl_start(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    if PAIRED:
        both = tl.load(
            x_ptr + row * 2 * n_cols + 2 * cols[:, None] + tl.arange(0, 2)[None, :], mask=mask[:, None], other=0.0
        ).to(tl.float32)
        g, u = tl.split(both)
    else:
        g = tl.load(x_ptr + row * 2 * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + row * 2 * n_cols + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _online_softmax_block(
    q,
    k,
    v,
    visible,
    m_i,
    l_i,
    acc,
    scale,
    IEEE: tl.constexpr,
    MASKED: tl.constexpr = True,
    k_scale=None,
    v_scale=None,
    KV_SCALED: tl.constexpr = False,
    V_ROW_MASK: tl.constexpr = False,
):
    """One block of keys into flash attention's running state: m_i [M] the running max, l_i [M] the running sum
    of exp, acc [M, D] the running weighted sum of values. visible: which (row, key) pairs count. A row that has
    seen no visible key yet keeps m_i = -inf and l_i = 0. IEEE (fp32 models): tl.dot on fp32 inputs defaults to
    TF32 (10-bit mantissa), which made fp32 greedy decoding drift from transformers' fp32 after a few dozen
    tokens; bf16/fp16 inputs are exact either way. KV_SCALED: k and v are an 8-bit cache's fp8 tiles and
    k_scale / v_scale [N] their rows' scales (_kv_scales). V_ROW_MASK (8-bit, visible a [1, N] key mask: the
    decode kernel's): V's rows of keys not visible are zeroed after the upcast."""
    if KV_SCALED:
        if IEEE:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        else:
            q, k, v = _upcast_kv(k, v, q)
        # V's rows past the end to 0 after the upcast: a transposed value cache's tile was read whole (_kv_tile),
        # and in a row-major one the select keeps the fp16 tile in registers, so it reaches the dot through an
        # fp16 shared buffer (ldmatrix.trans) instead of 128 byte loads a thread
        if V_ROW_MASK:
            v = tl.where(tl.trans(visible), v, 0.0)
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    else:
        s = tl.dot(q, tl.trans(k)) * scale
    if KV_SCALED:
        s = s * k_scale[None, :]
    if MASKED:  # else every (row, key) pair of the block counts, so every row's max is finite
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = m_new
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    pw = p * v_scale[None, :] if KV_SCALED else p  # each value row's scale goes into its weight
    if IEEE:
        pv = tl.dot(pw.to(v.dtype), v, input_precision="ieee")
    else:
        pv = tl.dot(pw.to(v.dtype), v)
    return m_new, l_i * alpha + tl.sum(p, axis=1), acc * alpha[:, None] + pv


@triton.jit
def _upcast_kv(k, v, q):
    """(q, k, v) as fp16 dot operands for a 16-bit model over an 8-bit cache's fp8 K and V tiles: every e4m3
    value is an fp16 value, and the GPU converts e4m3 pairs to fp16 in one instruction, which bf16 lacks (measured:
    decode through bf16 is markedly slower). The rows' scales are applied to the scores and the value weights
    instead (per key row), so no multiply over the tile stands between its load and the dot (dequantizing the tile
    first measured slower, most at long contexts). fp32 models upcast to fp32 (_online_softmax_block's IEEE
    path)."""
    return q.to(tl.float16), k.to(tl.float16), v.to(tl.float16)


@triton.jit
def _kv_scales(k_scale_ptr, v_scale_ptr, scale_rows, rows, FP8: tl.constexpr, WHOLE: tl.constexpr = False):
    """The K and V scales of an 8-bit cache's rows (masked rows: 0; WHOLE: every row, no mask); 0.0
    placeholders for a 16-bit cache."""
    if FP8 and WHOLE:
        ks = tl.load(k_scale_ptr + scale_rows)
        vs = tl.load(v_scale_ptr + scale_rows)
    elif FP8:
        ks = tl.load(k_scale_ptr + scale_rows, mask=rows, other=0.0)
        vs = tl.load(v_scale_ptr + scale_rows, mask=rows, other=0.0)
    else:
        ks = 0.0
        vs = 0.0
    return ks, vs


@triton.jit
def _online_softmax_block_exp2(
    q,
    k,
    v,
    visible,
    m_i,
    l_i,
    acc,
    qk_scale,
    MASKED: tl.constexpr = True,
    k_scale=None,
    v_scale=None,
    KV_SCALED: tl.constexpr = False,
):
    """_online_softmax_block for 16-bit inputs, with the running max m_i in log2 units: each score is scaled by
    qk_scale = scale * log2(e) and has the max taken off in one multiply-add, then goes through exp2 (exp of a
    scaled score costs two more float operations a score: the scale and exp's own log2(e)). Inputs that need IEEE
    fp32 keep _online_softmax_block. KV_SCALED: as there."""
    if KV_SCALED:
        q, k, v = _upcast_kv(k, v, q)
    s = tl.dot(q, tl.trans(k))
    if KV_SCALED:
        s = s * k_scale[None, :]
    if MASKED:
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
        m_off = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
    else:  # every row sees every key of the block: its max is finite
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
        m_off = m_new
    alpha = tl.math.exp2(m_i - m_off)
    p = tl.math.exp2(s * qk_scale - m_off[:, None])
    pw = p * v_scale[None, :] if KV_SCALED else p  # each value row's scale goes into its weight
    # The rescaled accumulator goes into the dot as its accumulator: no separate [M, D] product and add.
    acc = tl.dot(pw.to(v.dtype), v, acc * alpha[:, None])
    return m_new, l_i * alpha + tl.sum(p, axis=1), acc


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
    an earlier reply that overflowed would survive a zero weight). Zeroing them here instead (tl.where) took V
    through registers and cost the TMA loads their gain (H200: 512 + 2,048 tokens 68 us a layer either way,
    against 57 without; prefill_attention_tma.py, in git history). V_T (a transposed value cache, _v_offsets; v_base:
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
    # MAX_SPLITS slots took 100 us a layer for a 2,048-token prefill on the H200).
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


@triton.jit
def _gemv_chunk(x_ptr, w_chunk, k0, K, BLOCK_K: tl.constexpr):
    cols = k0 + tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
    return w_chunk.to(tl.float32) * x[None, :]


@triton.jit
def _gemv_w(w_ptr, rows, row_mask, k0, K, BLOCK_K: tl.constexpr, W_EVICT: tl.constexpr = ""):
    cols = k0 + tl.arange(0, BLOCK_K)
    return tl.load(
        w_ptr + rows[:, None] * K + cols[None, :],
        mask=row_mask[:, None] & (cols < K)[None, :],
        other=0.0,
        eviction_policy=W_EVICT,
    )


@triton.jit
def _store_rows(out_ptr, total, rows, row_mask, BLOCK_N: tl.constexpr, SILU_OUTPUT: tl.constexpr):
    # total [BLOCK_N] fp32 -> out. SILU_OUTPUT: rows come in (gate, up) pairs (awq.pair_gate_up,
    # linears.pair_gate_up_rows); store SiLU(gate) * up at the pair's index, each rounded to the output dtype first
    # as the separate kernels would (the GEMV's output, then _silu_mul_kernel's reads of it).
    if SILU_OUTPUT:
        gate, up = tl.split(tl.reshape(total.to(out_ptr.dtype.element_ty).to(tl.float32), [BLOCK_N // 2, 2]))
        pair_rows = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        pair_mask = tl.max(tl.reshape(row_mask.to(tl.int32), [BLOCK_N // 2, 2]), axis=1) > 0
        tl.store(out_ptr + pair_rows, (gate / (1.0 + tl.exp(-gate)) * up).to(out_ptr.dtype.element_ty), mask=pair_mask)
    else:
        tl.store(out_ptr + rows, total.to(out_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def _finish_rows(
    out_ptr, part_ptr, count_ptr, total, rows, row_mask, N, splits, BLOCK_N: tl.constexpr, SILU_OUTPUT: tl.constexpr
):
    # A GEMV program's row sums -> out. Split along K (splits > 1, program_id(1) = the split): each split leaves
    # fp32 partial sums; the last split of a row block to finish (an atomic arrival count) adds them up in a
    # fixed order and resets the count. No second kernel launch.
    if splits > 1:
        tl.store(part_ptr + tl.program_id(1) * N + rows, total, mask=row_mask)
        tl.debug_barrier()  # every thread's partials are written before the arrival is counted
        arrived = tl.atomic_add(count_ptr + tl.program_id(0), 1, sem="acq_rel")
        if arrived == splits - 1:
            total = tl.zeros([BLOCK_N], tl.float32)
            for c in range(0, splits):
                total += tl.load(part_ptr + c * N + rows, mask=row_mask, other=0.0, cache_modifier=".cg")
            _store_rows(out_ptr, total, rows, row_mask, BLOCK_N, SILU_OUTPUT)
            tl.atomic_xchg(count_ptr + tl.program_id(0), 0)
    else:
        _store_rows(out_ptr, total, rows, row_mask, BLOCK_N, SILU_OUTPUT)


# splits is a plain int: 1 (no split) and the split counts share one compiled kernel per shape of tile.
@triton.jit(do_not_specialize=["splits"])
def _gemv_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    part_ptr,
    count_ptr,
    N,
    K,
    K_SPLIT,
    splits,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    EARLY: tl.constexpr,
    SILU_OUTPUT: tl.constexpr,
    W_EVICT: tl.constexpr = "",
):
    # One token: out[n] = sum_k x[k] * W[n, k]. Program (r, c) owns BLOCK_N rows of W over columns c*K_SPLIT..
    # (K_SPLIT a multiple of BLOCK_K; one split: all of K) and streams them once; partial products stay in
    # registers and are reduced once at the end. EARLY (0-3): the first EARLY chunks of BLOCK_K columns are
    # requested before the wait for the kernel ahead (programmatic dependent launch): nothing ever writes the
    # weights, so their DRAM latency can overlap that kernel's end (as the int4 GEMV does); only x must wait.
    # The host keeps EARLY chunks within K_SPLIT. SILU_OUTPUT: the MLP's gate/up weight with its rows in pairs:
    # out gets SiLU(gate) * up (no separate kernel, no [gate | up] round trip through memory). W_EVICT: the L2
    # policy of the weight loads ("" or "evict_first": a weight is read once a step, so it need not stay).
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    k_begin = tl.program_id(1) * K_SPLIT
    if EARLY > 0:
        w0 = _gemv_w(w_ptr, rows, row_mask, k_begin, K, BLOCK_K, W_EVICT)
    if EARLY > 1:
        w1 = _gemv_w(w_ptr, rows, row_mask, k_begin + BLOCK_K, K, BLOCK_K, W_EVICT)
    if EARLY > 2:
        w2 = _gemv_w(w_ptr, rows, row_mask, k_begin + 2 * BLOCK_K, K, BLOCK_K, W_EVICT)
    if PDL:
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    if EARLY > 0:
        acc += _gemv_chunk(x_ptr, w0, k_begin, K, BLOCK_K)
    if EARLY > 1:
        acc += _gemv_chunk(x_ptr, w1, k_begin + BLOCK_K, K, BLOCK_K)
    if EARLY > 2:
        acc += _gemv_chunk(x_ptr, w2, k_begin + 2 * BLOCK_K, K, BLOCK_K)
    for k0 in range(k_begin + EARLY * BLOCK_K, tl.minimum(k_begin + K_SPLIT, K), BLOCK_K):
        acc += _gemv_chunk(x_ptr, _gemv_w(w_ptr, rows, row_mask, k0, K, BLOCK_K, W_EVICT), k0, K, BLOCK_K)
    _finish_rows(out_ptr, part_ptr, count_ptr, tl.sum(acc, axis=1), rows, row_mask, N, splits, BLOCK_N, SILU_OUTPUT)


@triton.jit
def _commit_token_kernel(next_ptr, token_ptr, pos_ptr, state_ptr, queue_ptr, ring_ptr, RING: tl.constexpr):
    # The decode step's last kernel: the next step's input token and position (model_loader.forced_tokens).
    # queue = [forced tokens queued, the tokens]: host memory the host writes while steps run ("stop thinking"),
    # read across the bus, volatile. state = [forced tokens taken, reasoning closed by the model, </think> id or
    # -1]: written only by this kernel, in stream order. ring: host memory the committed token is also written to,
    # at its position modulo RING, for the host to read once the step's event has completed.
    queued = tl.load(queue_ptr, volatile=True)
    taken = tl.load(state_ptr)
    closed = tl.load(state_ptr + 1)
    close_id = tl.load(state_ptr + 2)
    nxt = tl.load(next_ptr)
    # The model closing its reasoning before any forced token was taken turns the forcing off: the close tag
    # must not come twice.
    closed = closed | ((nxt == close_id) & (taken == 0)).to(tl.int32)
    take = (taken < queued) & (closed == 0)
    forced = tl.load(queue_ptr + 1 + taken, mask=take, other=0, volatile=True)
    chosen = tl.where(take, forced, nxt)
    pos = tl.load(pos_ptr)
    tl.store(token_ptr, chosen)
    tl.store(ring_ptr + pos % RING, chosen)
    tl.store(state_ptr, taken + take.to(tl.int32))
    tl.store(state_ptr + 1, closed)
    tl.store(pos_ptr, pos + 1)
