"""The Triton kernels of small_ops (add+RMSNorm, bias+RoPE+cache write, SiLU·mul, the token commit), by
themselves: this module imports Triton and nothing else (no torch; jit_common, the helpers the kernel modules
share, is Triton's too), so a first start's compile worker processes (compile_workers) can load them in a fraction
of a second. The host-side wrappers, launch shapes and buffers are in small_ops."""

from __future__ import annotations

import triton
import triton.language as tl

from model_loader.kernels.jit_common import _pdl_start, _v_offsets


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
    # (256 bytes) per program leaves a long prefill latency-bound.
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
