"""Triton kernels that fuse the small per-layer ops of a decode step (design.md §3: at batch 1 on a fast
GPU the kernel count, not the FLOPs, sets the speed). Each one replaces several PyTorch launches:

  add_rms_norm        residual add + RMSNorm (fp32 math)                      2-6 launches -> 1
  rope_bias_cache     QKV bias + RoPE on q and k + KV-cache write             ~12 launches -> 1
  silu_mul            SiLU(gate) * up                                         3 launches -> 1

and commit_token, the decode step's last kernel (forced_tokens). The decode attention is in decode_attention,
the prefill attention in prefill_attention, the single-token GEMV in gemv; the kernels themselves in
jit_small_ops.

Positions are read from a device tensor (pos_t), never baked in, so one captured CUDA graph serves every
step. Shapes and semantics are those of kernels.reference, which the tests compare against.
"""

from __future__ import annotations

import torch
import triton

from model_loader.kernels.features import pdl_launch_args
from model_loader.kernels.jit_small_ops import (
    _add_rms_norm_kernel,
    _commit_token_kernel,
    _rope_bias_cache_kernel,
    _silu_mul_kernel,
)
from model_loader.kernels.precompile import launch


def add_rms_norm(x, residual, weight, eps, out=None, residual_out=None):
    """See reference.add_rms_norm. residual None -> a new residual buffer holding x."""
    t, h = x.shape
    has_res = residual is not None
    if residual is None:
        residual = residual_out if residual_out is not None else torch.empty_like(x)
    out = torch.empty_like(x) if out is None else out
    launch(_add_rms_norm_kernel, (t,))(
        x,
        residual,
        weight,
        out,
        h,
        eps,
        HAS_RES=has_res,
        BLOCK=triton.next_power_of_2(h),
        num_warps=4,
        **pdl_launch_args(x.device),
    )
    return out, residual


def rms_norm(x, weight, eps):
    out = torch.empty_like(x)
    scratch = torch.empty_like(x)
    # With no residual, the kernel's residual store is just a copy of x into scratch.
    launch(_add_rms_norm_kernel, (x.shape[0],))(
        x,
        scratch,
        weight,
        out,
        x.shape[1],
        eps,
        HAS_RES=False,
        BLOCK=triton.next_power_of_2(x.shape[1]),
        num_warps=4,
        **pdl_launch_args(x.device),
    )
    return out


def value_layout(v_cache) -> tuple[bool, int]:
    """(transposed, row length) of a layer's value cache [Hkv, max_ctx, D]: row-major (the 16-bit cache; its row
    length is max_ctx), or a transposed view whose storage is [Hkv, D, rows] with rows >= max_ctx (the 8-bit
    cache: kv_cache.value_cache), what the kernels take as V_T and v_rows."""
    hkv, max_ctx, d = v_cache.shape
    if v_cache.stride() == (max_ctx * d, d, 1):
        return False, max_ctx
    rows = v_cache.stride(-1)
    if v_cache.stride() != (d * rows, 1, rows) or rows < max_ctx:
        raise ValueError(
            f"a value cache must be [Hkv, max_ctx, D] row-major or a transposed view; strides "
            f"{v_cache.stride()} for shape {tuple(v_cache.shape)}"
        )
    return True, rows


def rope_bias_cache(
    qkv, bias, cos, sin, k_cache, v_cache, pos_t, start, num_heads, num_kv_heads, q_out=None, scales=None
):
    # scales: (k_scale, v_scale) [Hkv, max_ctx] fp32 of an 8-bit cache (kv_cache.py), else None
    t = qkv.shape[0]
    v_t, v_rows = value_layout(v_cache)
    d = k_cache.shape[-1]
    q = torch.empty((t, num_heads, d), dtype=qkv.dtype, device=qkv.device) if q_out is None else q_out
    block_t = 1 if t == 1 else 16
    k_scale, v_scale = scales or (k_cache, v_cache)  # unread without an 8-bit cache
    launch(_rope_bias_cache_kernel, (triton.cdiv(t, block_t), num_heads + 2 * num_kv_heads))(
        qkv,
        bias,
        cos,
        sin,
        q,
        k_cache,
        v_cache,
        pos_t,
        t,
        k_cache.shape[1],
        k_scale,
        v_scale,
        v_rows,
        NUM_HEADS=num_heads,
        NUM_KV=num_kv_heads,
        D=d,
        BLOCK_T=block_t,
        num_warps=1 if t == 1 else 4,
        KV_FP8=scales is not None,
        V_T=v_t,
        **pdl_launch_args(qkv.device),
    )
    return q


def commit_token(nxt, token, pos, state, queue, ring) -> None:
    """The decode step's next input token and position in one kernel: see forced_tokens.commit_reference. The
    committed token also goes to ring[pos % len(ring)] (pos before the step). `queue` and `ring` may be pinned
    host memory (CPU tensors): the kernel reads and writes them across the bus."""
    assert ring.numel() & (ring.numel() - 1) == 0, "the ring's size is a power of two (a cheap modulo)"
    launch(_commit_token_kernel, (1,))(nxt, token, pos, state, queue, ring, RING=ring.numel(), num_warps=1)


def silu_mul(gate_up, out=None, paired: bool = False):
    """SiLU(gate) * up from [gate | up] rows, or paired: from rows laid out (gate 0, up 0, gate 1, ...), what a
    gate/up weight with its rows in pairs (linears.pair_gate_up_rows) outputs."""
    t, two_i = gate_up.shape
    i = two_i // 2
    out = torch.empty((t, i), dtype=gate_up.dtype, device=gate_up.device) if out is None else out
    block = 1024
    launch(_silu_mul_kernel, (t, triton.cdiv(i, block)))(
        gate_up, out, i, BLOCK=block, PAIRED=paired, num_warps=4, **pdl_launch_args(gate_up.device)
    )
    return out
