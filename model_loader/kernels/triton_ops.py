"""Triton kernels that fuse the small per-layer ops of a decode step (design.md §3: at batch 1 on a fast
GPU the kernel count, not the FLOPs, sets the speed). Each one replaces several PyTorch launches:

  add_rms_norm        residual add + RMSNorm (fp32 math)                      2-6 launches -> 1
  rope_bias_cache     QKV bias + RoPE on q and k + KV-cache write             ~12 launches -> 1
  silu_mul            SiLU(gate) * up                                         3 launches -> 1
  decode_attention    split-K flash decoding over the cache, GQA-aware        SDPA + mask -> 2

Positions are read from a device tensor (pos_t), never baked in, so one captured CUDA graph serves every
step. Shapes and semantics are those of kernels.reference, which the tests compare against.
On Hopper (sm90+) every kernel here and in int4_triton is launched with programmatic dependent launch (pdl_launch_args):
a kernel's grid is set up while the previous one finishes, which at ~10 small kernels per layer is a large
share of a decode step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from model_loader.kernels import precompile
from model_loader.kernels.precompile import launch
from model_loader.kernels.side_stream import side_stream

_PDL_OK: dict = {}


def pdl_supported(device) -> bool:
    """Programmatic dependent launch: Hopper or newer, a Triton that exposes it, not the CPU interpreter.
    R1DESK_NO_PDL=1 turns it off (to rule it out when chasing a problem)."""
    device = torch.device(device)
    if device not in _PDL_OK:
        _PDL_OK[device] = (device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"
                           and os.environ.get("R1DESK_NO_PDL") != "1"
                           and torch.cuda.get_device_capability(device) >= (9, 0)
                           and hasattr(getattr(tl.extra, "cuda", None), "gdc_wait"))
    return _PDL_OK[device]


def pdl_launch_args(device) -> dict:
    """Launch arguments for programmatic dependent launch: each decode kernel lets the next one start as soon as
    it has started itself, and waits for the previous one before reading what it wrote (weights and tables,
    never written, may be read before). Where pdl_supported is false: plain launches."""
    return {"PDL": True, "launch_pdl": True} if pdl_supported(device) else {"PDL": False}


@triton.jit
def _pdl_start(PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, n_cols, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr,
                         PDL: tl.constexpr):
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


def add_rms_norm(x, residual, weight, eps, out=None, residual_out=None):
    """See reference.add_rms_norm. residual None -> a new residual buffer holding x."""
    t, h = x.shape
    has_res = residual is not None
    if residual is None:
        residual = residual_out if residual_out is not None else torch.empty_like(x)
    out = torch.empty_like(x) if out is None else out
    launch(_add_rms_norm_kernel, (t,))(x, residual, weight, out, h, eps, HAS_RES=has_res,
                               BLOCK=triton.next_power_of_2(h), num_warps=4, **pdl_launch_args(x.device))
    return out, residual


def rms_norm(x, weight, eps):
    out = torch.empty_like(x)
    scratch = torch.empty_like(x)
    # With no residual, the kernel's residual store is just a copy of x into scratch.
    launch(_add_rms_norm_kernel, (x.shape[0],))(x, scratch, weight, out, x.shape[1], eps, HAS_RES=False,
                                        BLOCK=triton.next_power_of_2(x.shape[1]), num_warps=4, **pdl_launch_args(x.device))
    return out


@triton.jit(do_not_specialize=["n_tokens"])
def _rope_bias_cache_kernel(qkv_ptr, bias_ptr, cos_ptr, sin_ptr, q_ptr, k_cache_ptr, v_cache_ptr, pos_ptr,
                            n_tokens, max_ctx, NUM_HEADS: tl.constexpr, NUM_KV: tl.constexpr, D: tl.constexpr,
                            BLOCK_T: tl.constexpr, PDL: tl.constexpr):
    # BLOCK_T tokens of one head per program: 1 for a decode step; a prefill takes blocks, as one token's head
    # (256 bytes) per program left a 2,048-token prefill latency-bound (H200: 40 us a layer instead of ~5).
    _pdl_start(PDL)
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    head = tl.program_id(1)  # 0..Hq-1: q heads, then Hkv k heads, then Hkv v heads
    live = (tok < n_tokens)[:, None]
    pos = (tl.load(pos_ptr) + tok)[:, None]
    half = tl.arange(0, D // 2)[None, :]
    row = qkv_ptr + tok[:, None] * (NUM_HEADS + 2 * NUM_KV) * D + head * D
    x1 = tl.load(row + half, mask=live).to(tl.float32) + tl.load(bias_ptr + head * D + half).to(tl.float32)
    x2 = tl.load(row + D // 2 + half, mask=live).to(tl.float32) + tl.load(bias_ptr + head * D + D // 2 + half).to(tl.float32)
    if head < NUM_HEADS + NUM_KV:
        c = tl.load(cos_ptr + pos * (D // 2) + half, mask=live)
        s = tl.load(sin_ptr + pos * (D // 2) + half, mask=live)
        y1 = x1 * c - x2 * s
        y2 = x2 * c + x1 * s
        if head < NUM_HEADS:
            dst = q_ptr + tok[:, None] * NUM_HEADS * D + head * D
        else:
            dst = k_cache_ptr + ((head - NUM_HEADS) * max_ctx + pos) * D
    else:
        y1 = x1
        y2 = x2
        dst = v_cache_ptr + ((head - NUM_HEADS - NUM_KV) * max_ctx + pos) * D
    tl.store(dst + half, y1.to(q_ptr.dtype.element_ty), mask=live)
    tl.store(dst + D // 2 + half, y2.to(q_ptr.dtype.element_ty), mask=live)


def rope_bias_cache(qkv, bias, cos, sin, k_cache, v_cache, pos_t, start, num_heads, num_kv_heads, q_out=None):
    t = qkv.shape[0]
    d = k_cache.shape[-1]
    q = torch.empty((t, num_heads, d), dtype=qkv.dtype, device=qkv.device) if q_out is None else q_out
    block_t = 1 if t == 1 else 16
    launch(_rope_bias_cache_kernel, (triton.cdiv(t, block_t), num_heads + 2 * num_kv_heads))(
        qkv, bias, cos, sin, q, k_cache, v_cache, pos_t, t, k_cache.shape[1],
        NUM_HEADS=num_heads, NUM_KV=num_kv_heads, D=d, BLOCK_T=block_t, num_warps=1 if t == 1 else 4,
        **pdl_launch_args(qkv.device))
    return q


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr, PDL: tl.constexpr):
    _pdl_start(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(x_ptr + row * 2 * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * 2 * n_cols + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up, out=None):
    t, two_i = gate_up.shape
    i = two_i // 2
    out = torch.empty((t, i), dtype=gate_up.dtype, device=gate_up.device) if out is None else out
    block = 1024
    launch(_silu_mul_kernel, (t, triton.cdiv(i, block)))(gate_up, out, i, BLOCK=block, num_warps=4, **pdl_launch_args(gate_up.device))
    return out


@triton.jit
def _online_softmax_block(q, k, v, visible, m_i, l_i, acc, scale, IEEE: tl.constexpr, MASKED: tl.constexpr = True):
    """One block of keys into flash attention's running state: m_i [M] the running max, l_i [M] the running sum
    of exp, acc [M, D] the running weighted sum of values. visible: which (row, key) pairs count. A row that has
    seen no visible key yet keeps m_i = -inf and l_i = 0. IEEE (fp32 models): tl.dot on fp32 inputs defaults to
    TF32 (10-bit mantissa), which made fp32 greedy decoding drift from transformers' fp32 after a few dozen
    tokens; bf16/fp16 inputs are exact either way."""
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    else:
        s = tl.dot(q, tl.trans(k)) * scale
    if MASKED:  # else every (row, key) pair of the block counts
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    if IEEE:
        pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l_i * alpha + tl.sum(p, axis=1), acc * alpha[:, None] + pv


@triton.jit
def _decode_chunk(length, MAX_SPLITS, MIN_CHUNK, BLOCK_N):
    # Tokens per split, from the depth read on the device: short contexts use few splits of MIN_CHUNK tokens,
    # long ones all MAX_SPLITS splits. One captured graph so serves every depth with no host sync.
    chunk = tl.cdiv(tl.cdiv(length, MAX_SPLITS), BLOCK_N) * BLOCK_N
    return tl.maximum(chunk, MIN_CHUNK)


@triton.jit
def _decode_attn_split_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, mid_o_ptr, mid_lse_ptr, max_ctx, scale,
                              GROUP: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr,
                              BLOCK_N: tl.constexpr, MAX_SPLITS: tl.constexpr, MIN_CHUNK: tl.constexpr,
                              PDL: tl.constexpr, IEEE: tl.constexpr, LATE_LAUNCH: tl.constexpr):
    # One program per (KV head, split): the KV head's GROUP query heads share every K/V tile it loads.
    # LATE_LAUNCH: let the next kernels launch (programmatic dependent launch) only once this one has read its
    # K/V, so the weight requests of the GEMVs queued behind it don't compete with a long cache read.
    if PDL:
        if not LATE_LAUNCH:
            tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    length = tl.load(pos_ptr) + 1  # the current token is already in the cache
    chunk = _decode_chunk(length, MAX_SPLITS, MIN_CHUNK, BLOCK_N)
    start = split * chunk
    if start < length:  # splits past the depth do nothing; the reduce only reads the active ones
        end = tl.minimum(start + chunk, length)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, D)
        g_mask = g < GROUP
        q = tl.load(q_ptr + (kvh * GROUP + g[:, None]) * D + d[None, :], mask=g_mask[:, None], other=0.0)
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, D], tl.float32)
        base = kvh * max_ctx * D
        for n0 in range(start, end, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            n_mask = n < end
            k = tl.load(k_ptr + base + n[:, None] * D + d[None, :], mask=n_mask[:, None], other=0.0)
            v = tl.load(v_ptr + base + n[:, None] * D + d[None, :], mask=n_mask[:, None], other=0.0)
            m_i, l_i, acc = _online_softmax_block(q, k, v, n_mask[None, :], m_i, l_i, acc, scale, IEEE)
        heads = kvh * GROUP + g
        out_base = heads * MAX_SPLITS + split
        tl.store(mid_o_ptr + out_base[:, None] * D + d[None, :], acc / l_i[:, None], mask=g_mask[:, None])
        tl.store(mid_lse_ptr + out_base, m_i + tl.log(l_i), mask=g_mask)
    if PDL:
        if LATE_LAUNCH:
            tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _decode_attn_reduce_kernel(mid_o_ptr, mid_lse_ptr, out_ptr, pos_ptr, block_n, max_splits, min_chunk,
                               D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr):
    # Combines the active splits of one query head for BLOCK_D of its dimensions (online log-sum-exp, BLOCK_S
    # splits at a time): heads x D/BLOCK_D programs, so the combine is not a dozen long serial programs. The
    # split shape comes as plain ints so one compiled reduce serves every split kernel configuration.
    _pdl_start(PDL)
    head = tl.program_id(0)
    length = tl.load(pos_ptr) + 1
    active = tl.cdiv(length, _decode_chunk(length, max_splits, min_chunk, block_n))
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


@dataclass(frozen=True)
class DecodeAttnConfig:
    """How the decode attention splits the cache: up to max_splits programs per KV head, each at least min_chunk
    tokens (a multiple of block_n), block_n tokens per loop step."""

    max_splits: int
    min_chunk: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2
    late_launch: bool = False  # the next kernels launch only after the K/V reads (see the split kernel)

    def __str__(self) -> str:
        return (f"{self.max_splits} splits x >={self.min_chunk} tokens, block {self.block_n}, {self.num_warps} warps, "
                f"{self.num_stages} stages" + (", late launch" if self.late_launch else ""))


# Candidates for each depth bucket, timed at warm-up inside the whole decode step (engine.DecodeStep.tune). The
# first is the default where nothing was tuned (CPU interpreter, reference runs). From H200 measurements
# (2026-12-03): attention alone (benchmarks/decode_attention_depths.py, 108 shapes) gave the first two; the whole
# step (benchmarks/decode_step_by_attention.py) showed the second best for bf16 at every depth, the first best for
# 4-bit up to ~1k tokens, and the second with late_launch best for 4-bit from 4k to 32k (its GEMVs request their
# weights early, which competed with long cache reads). 128 splits of >= 256 tokens won nowhere by over 0.5%.
DECODE_ATTN_CONFIGS = (
    DecodeAttnConfig(32, 32, 32, 4, 2),
    DecodeAttnConfig(64, 128, 128, 4, 3),
    DecodeAttnConfig(64, 128, 128, 4, 3, late_launch=True),
)


def decode_attention_candidates(device) -> tuple:
    """The DECODE_ATTN_CONFIGS that differ on this device: late_launch changes nothing without programmatic
    dependent launch, so there it would only be one more compile and a coin toss in the tuning."""
    pdl = pdl_supported(device)
    return tuple(c for c in DECODE_ATTN_CONFIGS if pdl or not c.late_launch)


def decode_splits(config: DecodeAttnConfig, length: int) -> int:
    """How many splits the kernels use at this depth (what _decode_chunk computes on the device)."""
    chunk = -(-(-(-length // config.max_splits)) // config.block_n) * config.block_n
    chunk = max(chunk, config.min_chunk)
    return -(-length // chunk)


class DecodeAttention:
    """Split-K flash decoding with its scratch buffers preallocated (they must outlive graph capture). The
    number of splits follows the depth on the device (_decode_chunk); `config` picks the kernel shape and can be
    switched between graph captures (one decode graph per depth bucket, engine.DecodeStep)."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, device, dtype,
                 configs=DECODE_ATTN_CONFIGS):
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.group = num_heads // num_kv_heads
        self.config = configs[0]
        self.max_splits = max(c.max_splits for c in configs)
        self.mid_o = torch.empty((num_heads, self.max_splits, head_dim), device=device, dtype=torch.float32)
        self.mid_lse = torch.empty((num_heads, self.max_splits), device=device, dtype=torch.float32)
        self.out = torch.empty((num_heads, head_dim), device=device, dtype=dtype)

    def __call__(self, q, k_cache, v_cache, pos_t, length, scale, config: DecodeAttnConfig | None = None):
        # q: [Hq, D]; k_cache/v_cache: [Hkv, max_ctx, D]; returns [Hq, D] (a reused buffer)
        c = config or self.config
        assert c.max_splits <= self.max_splits
        pdl = pdl_launch_args(q.device)
        launch(_decode_attn_split_kernel, (self.num_kv_heads, c.max_splits))(
            q, k_cache, v_cache, pos_t, self.mid_o, self.mid_lse, k_cache.shape[1], scale,
            GROUP=self.group, BLOCK_G=max(16, triton.next_power_of_2(self.group)), D=self.head_dim,
            BLOCK_N=c.block_n, MAX_SPLITS=c.max_splits, MIN_CHUNK=c.min_chunk, IEEE=q.dtype == torch.float32,
            LATE_LAUNCH=c.late_launch, num_warps=c.num_warps, num_stages=c.num_stages, **pdl)
        block_d = min(32, self.head_dim)
        launch(_decode_attn_reduce_kernel, (self.num_heads, self.head_dim // block_d))(
            self.mid_o, self.mid_lse, self.out, pos_t, c.block_n, c.max_splits, c.min_chunk, D=self.head_dim,
            BLOCK_D=block_d, BLOCK_S=32, num_warps=2, **pdl)
        return self.out


@triton.jit(do_not_specialize=["n_tokens", "splits"])
def _prefill_attn_kernel(q_ptr, k_ptr, v_ptr, out_ptr, mid_o_ptr, mid_lse_ptr, start_ptr, n_tokens, max_ctx, scale,
                         splits, NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, IEEE: tl.constexpr,
                         PDL: tl.constexpr):
    # Causal attention of n_tokens new queries at positions start.. over the cache's keys 0..start+n_tokens-1,
    # bottom-right aligned (query i sees keys <= start+i). `start` is read on the device, so one captured graph
    # per length bucket serves any cached prefix; no mask tensor and no repeated K/V (the KV head is indexed).
    # SPLIT (few queries, long prefix): the keys are cut into `splits` ranges whose partial results
    # _prefill_attn_reduce_kernel combines, so short prefills still fill the GPU. The split count is a plain
    # int so that every bucket shares two compiled variants (split or not).
    _pdl_start(PDL)
    mblock = tl.num_programs(0) - 1 - tl.program_id(0)  # the last rows see the most keys: start them first
    head = tl.program_id(1)
    split = tl.program_id(2)
    kvh = head // GROUP
    start = tl.load(start_ptr)
    rows = mblock * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_tokens
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (rows[:, None] * NUM_HEADS + head) * D + d[None, :], mask=row_mask[:, None], other=0.0)
    visible = start + rows  # last key each row may see
    hi = tl.minimum(start + (mblock + 1) * BLOCK_M, start + n_tokens)  # keys this block needs
    chunk = tl.cdiv(tl.cdiv(start + n_tokens, splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(hi, lo + chunk)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    base = kvh * max_ctx * D
    # Keys below start + the block's first row are visible to every row of the block: whole key blocks there
    # need no mask (most of the work of a long prefill); the rest, up to the diagonal, are masked.
    open_blocks = tl.maximum(tl.minimum(start + mblock * BLOCK_M, hi) - lo, 0) // BLOCK_N
    for i in range(0, open_blocks):
        n = lo + i * BLOCK_N + tl.arange(0, BLOCK_N)
        k = tl.load(k_ptr + base + n[:, None] * D + d[None, :])
        v = tl.load(v_ptr + base + n[:, None] * D + d[None, :])
        m_i, l_i, acc = _online_softmax_block(q, k, v, None, m_i, l_i, acc, scale, IEEE, MASKED=False)
    for n_start in range(lo + open_blocks * BLOCK_N, hi, BLOCK_N):
        n = n_start + tl.arange(0, BLOCK_N)
        k = tl.load(k_ptr + base + n[:, None] * D + d[None, :], mask=(n < hi)[:, None], other=0.0)
        v = tl.load(v_ptr + base + n[:, None] * D + d[None, :], mask=(n < hi)[:, None], other=0.0)
        visible_mask = (n[None, :] <= visible[:, None]) & (n[None, :] < hi)
        m_i, l_i, acc = _online_softmax_block(q, k, v, visible_mask, m_i, l_i, acc, scale, IEEE)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    if not SPLIT:
        tl.store(out_ptr + (rows[:, None] * NUM_HEADS + head) * D + d[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=row_mask[:, None])
    else:  # partial result of this key range; a row that saw none of it gets weight 0 (lse -inf)
        mid = (split * n_tokens + rows) * NUM_HEADS + head
        tl.store(mid_o_ptr + mid[:, None] * D + d[None, :], o, mask=row_mask[:, None])
        tl.store(mid_lse_ptr + mid, tl.where(l_i > 0, m_i + tl.log(l_safe), float("-inf")), mask=row_mask)


@triton.jit(do_not_specialize=["n_rows", "splits"])
def _prefill_attn_reduce_kernel(mid_o_ptr, mid_lse_ptr, out_ptr, n_rows, splits, D: tl.constexpr,
                                ROWS: tl.constexpr, PDL: tl.constexpr):
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
    tl.store(out_ptr + rows[:, None] * D + d[None, :], (acc / total[:, None]).to(out_ptr.dtype.element_ty),
             mask=live[:, None])


class PrefillAttention:
    """Causal attention for a prefill over a cached prefix (or none), start read from a device tensor. The
    split scratch is allocated once for the largest prefill (PREFILL_CHUNK tokens) it is asked to split."""

    # (up to this many new tokens, (BLOCK_M, BLOCK_N, num_warps, num_stages)), from the H200 sweep
    # (benchmarks/prefill_attention_sweep.py, 2026-12-03, with unmasked blocks below the diagonal): per layer,
    # 4,096 cached + 1,024 new 101 us with (128, 64, 4, 2), the earlier (128, 128, 8, 3) over 117;
    # 4,096 + 2,048 259 us with (64, 32, 4, 2) against 279; 8,192 + 2,048 431 against 479.
    SHAPES = ((256, (64, 64, 4, 3)), (1024, (128, 64, 4, 2)), (None, (64, 32, 4, 2)))
    # Smaller tiles, one pipeline stage: where a shape above needs more shared memory than the GPU has (fp32
    # models: 393 KB for 128 x 128 at head dim 128; fp16 on a 64 KB Turing card), the first of these that fits.
    FALLBACKS = ((64, 64, 4, 1), (32, 32, 4, 1), (16, 16, 2, 1))
    MAX_SPLITS = 16
    REDUCE_ROWS = 16  # (token, head) rows per program of the split reduce

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, device, max_tokens: int):
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.group = num_heads // num_kv_heads
        self.device = torch.device(device)
        self.sms = (torch.cuda.get_device_properties(self.device).multi_processor_count
                    if self.device.type == "cuda" else 8)
        self.working: dict[tuple, tuple] = {}  # tuned shape -> the shape that compiled for this GPU and dtype
        # Allocated now for the most any prefill of up to max_tokens splits into: it must exist before graph
        # capture (and stays the same memory for every graph). A fallback shape has smaller row blocks, so it
        # splits into no more than this.
        rows = max(self.splits_for(t) * t for t in range(1, max_tokens + 1)) * num_heads
        self.mid_o = torch.empty((rows, head_dim), device=self.device, dtype=torch.float32)
        self.mid_lse = torch.empty((rows,), device=self.device, dtype=torch.float32)

    def _tuned(self, n_tokens: int) -> tuple[int, int, int, int]:
        return next(shape for upto, shape in self.SHAPES if upto is None or n_tokens <= upto)

    def shape_for(self, n_tokens: int) -> tuple[int, int, int, int]:
        """The tile shape a prefill of n_tokens runs with here (the tuned one, or the fallback that fit)."""
        tuned = self._tuned(n_tokens)
        return self.working.get(tuned, tuned)

    def splits_for(self, n_tokens: int, shape: tuple | None = None) -> int:
        """Key splits so that the programs fill every SM once: 1 for long prefills (a 2,048-token one has 192
        programs for the H200's 132 SMs: splitting it only added the reduce), up to MAX_SPLITS for short ones."""
        programs = triton.cdiv(n_tokens, (shape or self.shape_for(n_tokens))[0]) * self.num_heads
        splits = 1
        while splits < self.MAX_SPLITS and programs * splits < self.sms:
            splits *= 2
        return splits

    def __call__(self, q, k_cache, v_cache, start_t, scale, splits: int | None = None):
        # q: [T, Hq, D] (contiguous); k_cache/v_cache: [Hkv, max_ctx, D]; start_t: [1] int32 -> [T, Hq*D]
        t = q.shape[0]
        out = torch.empty((t, self.num_heads * self.head_dim), device=q.device, dtype=q.dtype)
        pdl = pdl_launch_args(q.device)
        tuned = self._tuned(t)
        if tuned in self.working:
            candidates = [self.working[tuned]]
        else:
            candidates = [tuned] + [f for f in self.FALLBACKS if f[0] <= tuned[0] and f != tuned]
        from triton.runtime.errors import OutOfResources

        for shape in candidates:
            n_splits = splits or self.splits_for(t, shape)
            if n_splits * t * self.num_heads > self.mid_lse.numel():
                raise ValueError(f"a {t}-token prefill in {n_splits} splits needs more scratch than was allocated")
            block_m, block_n, warps, stages = shape
            try:  # a shape too big for this GPU's shared memory fails here, before anything runs
                launch(_prefill_attn_kernel, (triton.cdiv(t, block_m), self.num_heads, n_splits))(
                    q, k_cache, v_cache, out, self.mid_o, self.mid_lse, start_t, t, k_cache.shape[1], scale,
                    n_splits, NUM_HEADS=self.num_heads, GROUP=self.group, D=self.head_dim, BLOCK_M=block_m,
                    BLOCK_N=block_n, SPLIT=n_splits > 1, IEEE=q.dtype == torch.float32, num_warps=warps,
                    num_stages=stages, **pdl)
            except OutOfResources:
                if shape == candidates[-1]:
                    raise
                continue
            if not precompile.active():  # a compile-only pass proves nothing about shared memory
                self.working[tuned] = shape
            splits = n_splits
            break
        if splits > 1:
            rows = t * self.num_heads
            launch(_prefill_attn_reduce_kernel, (triton.cdiv(rows, self.REDUCE_ROWS),))(
                self.mid_o, self.mid_lse, out, rows, splits, D=self.head_dim, ROWS=self.REDUCE_ROWS, num_warps=4,
                **pdl)
        return out


# Depth buckets of the decode graphs: each gets the attention configuration that was fastest for its depths.
DEPTH_BUCKETS = (1024, 4096, 16384, 32768)


def depth_buckets(max_ctx: int) -> list[int]:
    """Upper depths of the buckets a context of max_ctx tokens needs (the last one is max_ctx)."""
    return [b for b in DEPTH_BUCKETS if b < max_ctx] + [max_ctx]


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, out_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    # One token: out[n] = sum_k x[k] * W[n, k]. Each program owns BLOCK_N rows of W and streams them once;
    # partial products stay in registers and are reduced once at the end.
    _pdl_start(PDL)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        col_mask = cols < K
        x = tl.load(x_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + rows[:, None] * K + cols[None, :], mask=row_mask[:, None] & col_mask[None, :],
                    other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    tl.store(out_ptr + rows, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=row_mask)


# (BLOCK_N, BLOCK_K, num_warps) tried against cuBLAS for each weight shape at warm-up (see gemv_autotune)
GEMV_CONFIGS = ((4, 512, 4), (8, 256, 4), (16, 256, 8))


def gemv(x: torch.Tensor, w: torch.Tensor, config: tuple[int, int, int]) -> torch.Tensor:
    """x [1, K] @ W[N, K].T -> [1, N] (what F.linear computes, for a single token)."""
    n, k = w.shape
    block_n, block_k, warps = config
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    launch(_gemv_kernel, (triton.cdiv(n, block_n),))(x, w, out, n, k, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
                                             **pdl_launch_args(x.device))
    return out


def _graph_time_us(fn, calls: int) -> float:
    """GPU time of one call, from a CUDA graph of `calls` calls (no launch overhead in the measurement)."""
    stream = side_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / (5 * calls)


def time_configs(ws: list, configs, call) -> dict:
    """GPU microseconds per call of call(w, config) for each config, timed in a CUDA graph over all the weights
    ws (one per layer, so each read comes from HBM as in decoding, not from L2). Configs this GPU can't run
    (shared memory, registers) are left out."""
    results = {}
    for config in configs:
        def fn(config=config):
            for w in ws:
                call(w, config)
        try:
            results[config] = _graph_time_us(fn, len(ws))
        except Exception:
            continue
    return results


def gemv_autotune(weights_by_shape: dict[tuple[int, int], list[torch.Tensor]]) -> dict:
    """For each weight shape, the fastest of cuBLAS (config None) and our GEMV configs on this GPU.
    Returns {shape: config or None (cuBLAS)} and the timings, for the log."""
    import torch.nn.functional as F

    choice, timings = {}, {}
    for shape, ws in weights_by_shape.items():
        x = torch.randn(1, shape[1], device=ws[0].device, dtype=ws[0].dtype)
        results = time_configs(ws, (None,) + GEMV_CONFIGS,
                               lambda w, config: F.linear(x, w) if config is None else gemv(x, w, config))
        choice[shape] = min(results, key=results.get)
        timings[shape] = results
    return {"choice": choice, "timings_us": timings}
