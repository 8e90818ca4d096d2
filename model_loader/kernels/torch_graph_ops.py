"""Plain PyTorch ops that read every position on the device, so that a GPU without Triton (no C compiler for its
launchers, no kernel store for this GPU) still runs its decode step and fresh prefills as CUDA graphs.

reference.py takes positions as host ints, which a captured graph would freeze at their capture-time values.
Here the new rows' positions come from a device tensor (pos_t) and the decode attention reads a fixed span of
the cache (a depth bucket, chosen by the host per step as the Triton path's depth buckets are), masked past
the position: one graph per span serves every step whose context fits in it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model_loader.kernels.reference import (
    add_rms_norm,
    cached_kv,
    quantize_fp8_rows,
    rms_norm,
    rotated_qkv,
    silu_mul,
)

__all__ = ["add_rms_norm", "rms_norm", "silu_mul", "rope_bias_cache", "decode_attention_span", "decode_spans"]

# Spans of cache the decode attention reads: the smallest that holds the context. Finer than the Triton path's
# depth buckets because here a step's attention reads the whole span (its masked tail included).
SPANS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def decode_spans(max_ctx: int) -> list[int]:
    """The spans a context of max_ctx tokens needs graphs for, the last one max_ctx itself."""
    return [s for s in SPANS if s < max_ctx] + [max_ctx]


def _write_rows(cache: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor) -> None:
    """cache[:, positions] = rows ([Hkv, T, D] into [Hkv, max_ctx, D]) by index_copy_, which reads the positions on
    the device. An fp8 cache is written through a byte view (index_copy_ has no float8 kernel)."""
    if cache.dtype == torch.float8_e4m3fn:
        cache, rows = cache.view(torch.uint8), rows.view(torch.uint8)
    cache.index_copy_(1, positions, rows)


def rope_bias_cache(
    qkv, bias, cos, sin, k_cache, v_cache, pos_t, start: int | None, num_heads: int, num_kv_heads: int, scales=None
):
    """reference.rope_bias_cache with the T new rows at positions pos_t..pos_t+T-1 read on the device (start, the
    same position on the host, is not used: a graph replays with other positions). Returns q rotated [T, Hq, D]."""
    positions = pos_t.long() + torch.arange(qkv.shape[0], device=qkv.device)
    c, s = cos.index_select(0, positions), sin.index_select(0, positions)
    q, k, v = rotated_qkv(qkv, bias, c, s, num_heads, num_kv_heads)
    if scales is not None:
        for rows, cache, scale in ((k, k_cache, scales[0]), (v, v_cache, scales[1])):
            data, row_scale = quantize_fp8_rows(rows.transpose(0, 1))
            _write_rows(cache, positions, data)
            scale.index_copy_(1, positions, row_scale)
        return q
    _write_rows(k_cache, positions, k.to(qkv.dtype).transpose(0, 1))
    _write_rows(v_cache, positions, v.to(qkv.dtype).transpose(0, 1))
    return q


def decode_attention_span(q, k_cache, v_cache, pos_t, span: int, scale: float, scales=None):
    """One query token at position pos_t (a [1] device tensor) against the cache's first `span` positions, those
    past pos_t masked off. q: [Hq, D] -> [Hq, D]. Each KV head's group of query heads goes in as that head's rows
    (all at the same position), so no K/V is repeated or upcast: SDPA's memory-efficient kernel takes the mask and
    keeps its scores in fp32. (reference.decode_attention upcasts the context to fp32 instead: in a graph that
    makes the decode markedly slower and agrees no better with the eager path, docs/BENCHMARKS.md "Without
    Triton".)"""
    hq, d = q.shape
    hkv = k_cache.shape[0]
    k, v = cached_kv(k_cache, v_cache, span, q.dtype, scales)
    visible = torch.arange(span, device=q.device) <= pos_t.to(torch.int64)
    out = F.scaled_dot_product_attention(
        q.view(1, hkv, hq // hkv, d), k[None], v[None], attn_mask=visible.view(1, 1, 1, span), scale=scale
    )
    return out.reshape(hq, d)
