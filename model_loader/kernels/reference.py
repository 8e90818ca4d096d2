"""Plain PyTorch versions of the fused kernels: the CPU path, the fallback where Triton can't run,
and the reference the Triton kernels are tested against. Shapes match the Triton wrappers exactly (small_ops,
decode_attention, prefill_attention).

Positions come in as host ints here (no CUDA graph on this path); the Triton kernels read them on the device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def keep_off_cudnn() -> None:
    """r1desk runs no cuDNN kernel: no convolutions, and attention is SDPA's flash / memory-efficient / math
    kernels or Triton. cuDNN's attention, which torch may prefer on Hopper, lives in ~466 MB of cuDNN engine
    libraries that the GPU release leaves out (packaging/exclusions.py); with it off a pip install and the
    release run the same kernels and give the same greedy tokens (docs/BENCHMARKS.md, 'Tried and rejected'), for a
    slightly slower TTFT (measured) than where torch chooses cuDNN. Process-wide, set once at load: no per-call
    context on the per-token path. (It does not keep torch from loading libcudnn_graph, which therefore ships.)"""
    torch.backends.cudnn.enabled = False
    torch.backends.cuda.enable_cudnn_sdp(False)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """residual <- x + residual (in place; x itself when residual is None); returns (norm(residual), residual)."""
    # x, residual: [T, H]
    if residual is None:
        residual = x.clone()
    else:
        residual.add_(x)
    h = residual.float()
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.float()).to(x.dtype), residual


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def rotated_qkv(qkv, bias, cos_rows, sin_rows, num_heads: int, num_kv_heads: int):
    """The QKV rows with their bias, q and k rotated by the rows' cos/sin [T, D/2]: (q [T, Hq, D] in qkv's dtype,
    k and v [T, Hkv, D] in fp32, for the cache writer to round or quantize)."""
    t = qkv.shape[0]
    d = qkv.shape[1] // (num_heads + 2 * num_kv_heads)
    x = (qkv.float() + bias.float()).view(t, num_heads + 2 * num_kv_heads, d)
    c, s = cos_rows[:, None, :], sin_rows[:, None, :]

    def rotate(v):
        v1, v2 = v[..., : d // 2], v[..., d // 2 :]
        return torch.cat((v1 * c - v2 * s, v2 * c + v1 * s), dim=-1)

    q = rotate(x[:, :num_heads]).to(qkv.dtype)
    return q, rotate(x[:, num_heads : num_heads + num_kv_heads]), x[:, num_heads + num_kv_heads :]


def rope_bias_cache(
    qkv, bias, cos, sin, k_cache, v_cache, pos_t, start: int, num_heads: int, num_kv_heads: int, scales=None
):
    """Add the QKV bias, rotate q and k, write k and v into the cache at start..start+T-1.

    qkv: [T, (Hq + 2*Hkv) * D]; cos/sin: [max_ctx, D/2] fp32; k_cache/v_cache: [Hkv, max_ctx, D]; scales:
    (k_scale, v_scale) [Hkv, max_ctx] fp32 of an 8-bit cache (kv_cache.py), else None.
    Returns q rotated: [T, Hq, D].
    """
    t = qkv.shape[0]
    q, k, v = rotated_qkv(qkv, bias, cos[start : start + t], sin[start : start + t], num_heads, num_kv_heads)
    if scales is not None:
        for rows, cache, scale in ((k, k_cache, scales[0]), (v, v_cache, scales[1])):
            data, row_scale = quantize_fp8_rows(rows.transpose(0, 1))
            cache[:, start : start + t] = data
            scale[:, start : start + t] = row_scale
        return q
    k_cache[:, start : start + t] = k.to(qkv.dtype).transpose(0, 1)
    v_cache[:, start : start + t] = v.to(qkv.dtype).transpose(0, 1)
    return q


FP8_MAX = 448.0  # the largest finite float8_e4m3fn value


def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] (fp32) -> (float8_e4m3fn [..., D], fp32 scales [...]): each row scaled so its largest
    magnitude is FP8_MAX (an all-zero row gets a tiny scale), as the Triton cache writer does; a value that is not
    finite after scaling (a row with NaN or inf in it) becomes the code 0, so the cache never holds e4m3's NaN
    (kernels read a transposed value cache's tiles whole: kv_cache.value_cache)."""
    scale = x.abs().amax(-1).clamp_min(1e-30) / FP8_MAX
    scaled = x * (1.0 / scale)[..., None]
    return torch.where(scaled.isfinite(), scaled, 0.0).to(torch.float8_e4m3fn), scale


def cached_kv(k_cache, v_cache, length: int, dtype, scales=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The first `length` positions of a layer's K and V [Hkv, length, D] in `dtype`, dequantized where the
    cache is 8-bit (scales: (k_scale, v_scale) [Hkv, max_ctx]), then row-major: an 8-bit cache's V is stored
    transposed (kv_cache.value_cache), and SDPA given a V whose last dimension is not contiguous leaves its flash
    kernel for the math one (measured: a fresh long prefill over the 8-bit cache takes over twice as long)."""
    k, v = k_cache[:, :length], v_cache[:, :length]
    if scales is None:
        return k, v
    return (
        (k.float() * scales[0][:, :length, None]).to(dtype).contiguous(),
        (v.float() * scales[1][:, :length, None]).to(dtype).contiguous(),
    )


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [T, 2I] -> silu(gate) * up: [T, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return (F.silu(gate.float()) * up.float()).to(gate_up.dtype)


def decode_attention(q, k_cache, v_cache, pos_t, length: int, scale: float, scales=None):
    """One query token against the first `length` cached positions. q: [Hq, D] -> [Hq, D]."""
    hq, d = q.shape
    hkv = k_cache.shape[0]
    k, v = cached_kv(k_cache, v_cache, length, q.dtype, scales)
    k = k.repeat_interleave(hq // hkv, dim=0)
    v = v.repeat_interleave(hq // hkv, dim=0)
    out = F.scaled_dot_product_attention(q[:, None, :].float(), k.float(), v.float(), scale=scale)
    return out[:, 0].to(q.dtype)


def prefill_attention(q, k_cache, v_cache, start: int, scale: float, scales=None):
    """T new queries at positions start..start+T-1 against cache keys 0..start+T-1, causal (query i sees keys
    <= start+i). q: [T, Hq, D] -> [T, Hq*D]."""
    t, hq, d = q.shape
    hkv = k_cache.shape[0]
    length = start + t
    k, v = cached_kv(k_cache, v_cache, length, q.dtype, scales)
    k = k.repeat_interleave(hq // hkv, dim=0)[None]
    v = v.repeat_interleave(hq // hkv, dim=0)[None]
    mask = torch.arange(length, device=q.device)[None, :] <= (torch.arange(t, device=q.device)[:, None] + start)
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k, v, attn_mask=mask, scale=scale)
    return out[0].transpose(0, 1).reshape(t, -1)
