"""The @triton.jit helpers and constants the kernel modules share (jit_small_ops, jit_decode_attention,
jit_prefill_attention): the start of programmatic dependent launch, the value cache's element offsets, and flash
attention's online-softmax step over a K/V tile (natural units and exp2) with an 8-bit cache's upcast and scales.
Like them, this module imports Triton and nothing else (no torch)."""

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
def _v_offsets(head, n, d, max_ctx, v_rows, D: tl.constexpr, V_T: tl.constexpr):
    """Element offsets of value entries (token n, dimension d; broadcast shapes) of KV head `head` in a value
    cache of max_ctx rows: [Hkv, max_ctx, D] row after row, or with V_T transposed, [Hkv, D, v_rows] (each
    dimension's tokens contiguous, v_rows >= max_ctx rows a head; kv_cache.py says why an 8-bit cache does)."""
    if V_T:
        return (head * D + d) * v_rows + n
    return (head * max_ctx + n) * D + d


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
