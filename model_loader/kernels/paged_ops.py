"""Triton kernels for a batch of sequences over the paged KV cache (model_loader.paged_model): what the batched
decode step launches instead of the single-sequence engine's cache writer and decode attention.

  paged_rope_write   QKV bias + RoPE at each row's own position + K/V written to each row's own cache slot
  paged_decode_attention   split-K flash decoding for B sequences at once, each over its own blocks and length

Cache layout [KV heads, slots, head_dim] per layer, slot = block * block_size + offset; an 8-bit cache (KV_FP8)
holds fp8 e4m3 rows, K and V both row-major, with an fp32 scale per (KV head, slot) row beside them
(kv_cache.py), written as the single-sequence writer writes its rows. Everything that changes between steps
(positions, slots, block tables, lengths) is read from device tensors, so one CUDA graph per batch size serves
every step. Shapes and results match paged_model's PyTorch path, which the tests compare against.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_loader.kernels.features import pdl_launch_args
from model_loader.kernels.jit_common import _pdl_start
from model_loader.kernels.jit_small_ops import _store_fp8_rows
from model_loader.kernels.precompile import launch

LOG2_E = tl.constexpr(1.4426950408889634)


@triton.jit
def _paged_rope_write_kernel(
    qkv_ptr,
    bias_ptr,
    cos_ptr,
    sin_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,
    v_scale_ptr,
    pos_ptr,
    slot_ptr,
    n_rows,
    n_slots,
    NUM_HEADS: tl.constexpr,
    NUM_KV: tl.constexpr,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    KV_FP8: tl.constexpr,
    PDL: tl.constexpr,
):
    # BLOCK_T rows of one head per program; head 0..Hq-1: q, then Hkv k heads, then Hkv v heads. A row whose slot
    # is negative (a padding row of a captured batch) writes nothing to the cache.
    _pdl_start(PDL)
    row = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    head = tl.program_id(1)
    live = row < n_rows
    pos = tl.load(pos_ptr + row, mask=live, other=0)[:, None]
    half = tl.arange(0, D // 2)[None, :]
    src = qkv_ptr + row[:, None] * (NUM_HEADS + 2 * NUM_KV) * D + head * D
    x1 = tl.load(src + half, mask=live[:, None]).to(tl.float32) + tl.load(bias_ptr + head * D + half).to(tl.float32)
    x2 = tl.load(src + D // 2 + half, mask=live[:, None]).to(tl.float32) + tl.load(
        bias_ptr + head * D + D // 2 + half
    ).to(tl.float32)
    if head < NUM_HEADS + NUM_KV:
        c = tl.load(cos_ptr + pos * (D // 2) + half, mask=live[:, None])
        s = tl.load(sin_ptr + pos * (D // 2) + half, mask=live[:, None])
        y1 = x1 * c - x2 * s
        y2 = x2 * c + x1 * s
    else:
        y1 = x1
        y2 = x2
    if head < NUM_HEADS:
        dst = q_ptr + row[:, None] * NUM_HEADS * D + head * D
        tl.store(dst + half, y1.to(q_ptr.dtype.element_ty), mask=live[:, None])
        tl.store(dst + D // 2 + half, y2.to(q_ptr.dtype.element_ty), mask=live[:, None])
    else:
        slot = tl.load(slot_ptr + row, mask=live, other=-1)
        keep = (live & (slot >= 0))[:, None]
        if head < NUM_HEADS + NUM_KV:
            cache_ptr, scale_ptr = k_cache_ptr, k_scale_ptr
            kvh = head - NUM_HEADS
        else:
            cache_ptr, scale_ptr = v_cache_ptr, v_scale_ptr
            kvh = head - NUM_HEADS - NUM_KV
        cache_row = kvh * n_slots + slot[:, None]
        if KV_FP8:
            _store_fp8_rows(
                cache_ptr, scale_ptr, cache_row, cache_row * D + half, cache_row * D + D // 2 + half, y1, y2, keep
            )
        else:
            tl.store(cache_ptr + cache_row * D + half, y1.to(cache_ptr.dtype.element_ty), mask=keep)
            tl.store(cache_ptr + cache_row * D + D // 2 + half, y2.to(cache_ptr.dtype.element_ty), mask=keep)


def paged_rope_write(
    qkv, bias, cos, sin, k_cache, v_cache, positions, slots, num_heads, num_kv_heads, q_out=None, scales=None
):
    """qkv [T, (Hq + 2 Hkv) D]; positions, slots [T] int (slot < 0: don't write); k_cache/v_cache [Hkv, S, D];
    scales: (k_scale, v_scale) [Hkv, S] of an 8-bit cache, else None -> q [T, Hq, D] rotated (q_out if given)."""
    t = qkv.shape[0]
    d = k_cache.shape[-1]
    q = torch.empty((t, num_heads, d), dtype=qkv.dtype, device=qkv.device) if q_out is None else q_out
    block_t = 1 if t == 1 else 16
    launch(_paged_rope_write_kernel, (triton.cdiv(t, block_t), num_heads + 2 * num_kv_heads))(
        qkv,
        bias,
        cos,
        sin,
        q,
        k_cache,
        v_cache,
        *(scales if scales is not None else (k_cache, v_cache)),  # unread without KV_FP8
        positions,
        slots,
        t,
        k_cache.shape[1],
        NUM_HEADS=num_heads,
        NUM_KV=num_kv_heads,
        D=d,
        BLOCK_T=block_t,
        KV_FP8=scales is not None,
        num_warps=1 if t == 1 else 4,
        **pdl_launch_args(qkv.device),
    )
    return q


@triton.jit
def _paged_decode_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    k_scale_ptr,
    v_scale_ptr,
    table_ptr,
    len_ptr,
    mid_o_ptr,
    mid_lse_ptr,
    n_slots,
    table_width,
    scale,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SPLITS: tl.constexpr,
    IEEE: tl.constexpr,
    KV_FP8: tl.constexpr,
    PDL: tl.constexpr,
):
    # One program: sequence b, KV head h, split s of b's context. Its GROUP query heads attend together (GQA: each
    # K/V tile is read once for all of them). A tile of BLOCK_N tokens lies inside one cache block (BLOCK_N divides
    # BLOCK_SIZE), found through b's block table. Writes each query head's partial output and log-sum-exp.
    _pdl_start(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    length = tl.load(len_ptr + b)
    chunk = tl.cdiv(tl.cdiv(length, SPLITS), BLOCK_N) * BLOCK_N
    lo = s * chunk
    hi = tl.minimum(lo + chunk, length)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, D)
    heads = h * GROUP + g
    q = tl.load(
        q_ptr + (b * GROUP * tl.num_programs(1) + heads[:, None]) * D + d[None, :], mask=(g < GROUP)[:, None], other=0.0
    )
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    qk_scale = scale * LOG2_E
    for n0 in range(lo, hi, BLOCK_N):
        block = tl.load(table_ptr + b * table_width + n0 // BLOCK_SIZE).to(tl.int64)
        n = n0 + tl.arange(0, BLOCK_N)
        rows = block * BLOCK_SIZE + n0 % BLOCK_SIZE + tl.arange(0, BLOCK_N)
        offs = (h * n_slots + rows[:, None]) * D + d[None, :]
        visible = n < hi
        k = tl.load(k_ptr + offs, mask=visible[:, None], other=0.0)
        v = tl.load(v_ptr + offs, mask=visible[:, None], other=0.0)
        if KV_FP8:  # e4m3 goes into the model's dtype exactly; each row's scale applies to its score and its weight
            k = k.to(q.dtype)
            v = v.to(q.dtype)
        if IEEE:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        scale_rows = h * n_slots + rows  # an 8-bit cache's scales: one per (KV head, slot)
        if KV_FP8:
            scores = scores * tl.load(k_scale_ptr + scale_rows, mask=visible, other=0.0)[None, :]
        scores = tl.where(visible[None, :], scores * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        weights = p
        if KV_FP8:
            weights = p * tl.load(v_scale_ptr + scale_rows, mask=visible, other=0.0)[None, :]
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(weights, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(weights.to(v.dtype), v)
        m_i = m_new
    hq = tl.num_programs(1) * GROUP
    mid = (b * hq + heads) * SPLITS + s
    live = g < GROUP
    has = l_i > 0
    tl.store(mid_o_ptr + mid[:, None] * D + d[None, :], acc / tl.where(has, l_i, 1.0)[:, None], mask=live[:, None])
    # log2 of the split's softmax mass (in units where exp2 of it is the sum): -inf for an empty split
    tl.store(mid_lse_ptr + mid, tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf")), mask=live)


@triton.jit
def _paged_decode_reduce_kernel(
    mid_o_ptr, mid_lse_ptr, out_ptr, D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr
):
    # One program per (sequence, query head): the splits' partial outputs weighed by their softmax mass.
    _pdl_start(PDL)
    row = tl.program_id(0)  # b * Hq + head
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, D)
    lse = tl.load(mid_lse_ptr + row * SPLITS + s, mask=s < SPLITS, other=float("-inf"))
    top = tl.max(lse, 0)
    w = tl.where(lse > float("-inf"), tl.exp2(lse - top), 0.0)
    o = tl.load(mid_o_ptr + (row * SPLITS + s[:, None]) * D + d[None, :], mask=(s < SPLITS)[:, None], other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.sum(w, 0)
    tl.store(out_ptr + row * D + d, out.to(out_ptr.dtype.element_ty))


class PagedDecodeAttention:
    """Split-K decoding for up to max_batch sequences, its scratch preallocated (it must outlive graph capture)."""

    BLOCK_N = 64

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, max_batch: int, device, dtype
    ):
        if block_size % self.BLOCK_N and self.BLOCK_N % block_size:
            raise ValueError(f"KV blocks of {block_size} tokens don't tile by {self.BLOCK_N}")
        self.block_n = min(self.BLOCK_N, block_size)
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.block_size = block_size
        props = torch.cuda.get_device_properties(device) if torch.device(device).type == "cuda" else None
        self.sms = props.multi_processor_count if props is not None else 8
        self.max_splits = self.splits_for(1)
        # flat: a batch of b sequences with s splits uses the first b * Hq * s rows, contiguous
        self.mid_o = torch.empty(max_batch * num_heads * self.max_splits * head_dim, device=device, dtype=torch.float32)
        self.mid_lse = torch.empty(max_batch * num_heads * self.max_splits, device=device, dtype=torch.float32)
        self.out = torch.empty((max_batch, num_heads, head_dim), device=device, dtype=dtype)

    def splits_for(self, batch: int) -> int:
        """Splits of each sequence's context: enough programs to fill the GPU's SMs about twice, at most 32, and a
        power of two: SPLITS is compiled in, so any batch size takes one of six kernels (all compiled when the
        decode graphs are captured), not a compile the first time a step has, say, 5 decoding sequences."""
        fill = max(1, 2 * self.sms // (batch * self.num_kv_heads))
        return min(32, 1 << (fill.bit_length() - 1))

    def __call__(self, q, k_cache, v_cache, tables, lengths, scale, scales=None):
        """q [B, Hq, D]; k_cache/v_cache [Hkv, S, D]; tables [B, W] int32 block ids; lengths [B] int32; scales:
        (k_scale, v_scale) [Hkv, S] of an 8-bit cache, else None -> [B, Hq, D] (a reused buffer)."""
        b = q.shape[0]
        splits = self.splits_for(b)
        group = self.num_heads // self.num_kv_heads
        rows = b * self.num_heads * splits
        mid_o, mid_lse = self.mid_o[: rows * self.head_dim], self.mid_lse[:rows]
        pdl = pdl_launch_args(q.device)  # each waits for the kernel before it to finish before reading anything
        launch(_paged_decode_split_kernel, (b, self.num_kv_heads, splits))(
            q,
            k_cache,
            v_cache,
            *(scales if scales is not None else (k_cache, v_cache)),  # unread without KV_FP8
            tables,
            lengths,
            mid_o,
            mid_lse,
            k_cache.shape[1],
            tables.shape[1],
            scale,
            GROUP=group,
            BLOCK_G=max(16, triton.next_power_of_2(group)),
            D=self.head_dim,
            BLOCK_N=self.block_n,
            BLOCK_SIZE=self.block_size,
            SPLITS=splits,
            IEEE=q.dtype == torch.float32,
            KV_FP8=scales is not None,
            num_warps=4,
            num_stages=2,
            **pdl,
        )
        out = self.out[:b]
        launch(_paged_decode_reduce_kernel, (b * self.num_heads,))(
            mid_o,
            mid_lse,
            out,
            D=self.head_dim,
            SPLITS=splits,
            BLOCK_S=max(2, triton.next_power_of_2(splits)),
            num_warps=2,
            **pdl,
        )
        return out
