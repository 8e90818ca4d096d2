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

import torch
import triton
import triton.language as tl

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
    _add_rms_norm_kernel[(t,)](x, residual, weight, out, h, eps, HAS_RES=has_res,
                               BLOCK=triton.next_power_of_2(h), num_warps=4, **pdl_launch_args(x.device))
    return out, residual


def rms_norm(x, weight, eps):
    out = torch.empty_like(x)
    scratch = torch.empty_like(x)
    # With no residual, the kernel's residual store is just a copy of x into scratch.
    _add_rms_norm_kernel[(x.shape[0],)](x, scratch, weight, out, x.shape[1], eps, HAS_RES=False,
                                        BLOCK=triton.next_power_of_2(x.shape[1]), num_warps=4, **pdl_launch_args(x.device))
    return out


@triton.jit
def _rope_bias_cache_kernel(qkv_ptr, bias_ptr, cos_ptr, sin_ptr, q_ptr, k_cache_ptr, v_cache_ptr, pos_ptr,
                            max_ctx, NUM_HEADS: tl.constexpr, NUM_KV: tl.constexpr, D: tl.constexpr,
                            PDL: tl.constexpr):
    _pdl_start(PDL)
    tok = tl.program_id(0)
    head = tl.program_id(1)  # 0..Hq-1: q heads, then Hkv k heads, then Hkv v heads
    pos = tl.load(pos_ptr) + tok
    half = tl.arange(0, D // 2)
    row = qkv_ptr + tok * (NUM_HEADS + 2 * NUM_KV) * D + head * D
    x1 = tl.load(row + half).to(tl.float32) + tl.load(bias_ptr + head * D + half).to(tl.float32)
    x2 = tl.load(row + D // 2 + half).to(tl.float32) + tl.load(bias_ptr + head * D + D // 2 + half).to(tl.float32)
    if head < NUM_HEADS + NUM_KV:
        c = tl.load(cos_ptr + pos * (D // 2) + half)
        s = tl.load(sin_ptr + pos * (D // 2) + half)
        y1 = x1 * c - x2 * s
        y2 = x2 * c + x1 * s
        if head < NUM_HEADS:
            dst = q_ptr + tok * NUM_HEADS * D + head * D
        else:
            dst = k_cache_ptr + ((head - NUM_HEADS) * max_ctx + pos) * D
    else:
        y1 = x1
        y2 = x2
        dst = v_cache_ptr + ((head - NUM_HEADS - NUM_KV) * max_ctx + pos) * D
    tl.store(dst + half, y1.to(q_ptr.dtype.element_ty))
    tl.store(dst + D // 2 + half, y2.to(q_ptr.dtype.element_ty))


def rope_bias_cache(qkv, bias, cos, sin, k_cache, v_cache, pos_t, start, num_heads, num_kv_heads, q_out=None):
    t = qkv.shape[0]
    d = k_cache.shape[-1]
    q = torch.empty((t, num_heads, d), dtype=qkv.dtype, device=qkv.device) if q_out is None else q_out
    _rope_bias_cache_kernel[(t, num_heads + 2 * num_kv_heads)](
        qkv, bias, cos, sin, q, k_cache, v_cache, pos_t, k_cache.shape[1],
        NUM_HEADS=num_heads, NUM_KV=num_kv_heads, D=d, num_warps=1, **pdl_launch_args(qkv.device))
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
    _silu_mul_kernel[(t, triton.cdiv(i, block))](gate_up, out, i, BLOCK=block, num_warps=4, **pdl_launch_args(gate_up.device))
    return out


@triton.jit
def _decode_attn_split_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, mid_o_ptr, mid_lse_ptr, max_ctx, scale,
                              GROUP: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr,
                              BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, PDL: tl.constexpr,
                              IEEE: tl.constexpr):
    # IEEE (fp32 models): tl.dot on fp32 inputs defaults to TF32 (10-bit mantissa), which made fp32 greedy
    # decoding drift from transformers' fp32 after a few dozen tokens. bf16/fp16 inputs are exact either way.
    _pdl_start(PDL)
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    length = tl.load(pos_ptr) + 1  # the current token is already in the cache
    chunk = tl.cdiv(tl.cdiv(length, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
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
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        else:
            s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + base + n[:, None] * D + d[None, :], mask=n_mask[:, None], other=0.0)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    heads = kvh * GROUP + g
    out_base = (heads * NUM_SPLITS + split)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    tl.store(mid_o_ptr + out_base[:, None] * D + d[None, :], acc / l_safe[:, None], mask=g_mask[:, None])
    lse = tl.where(l_i > 0, m_i + tl.log(l_safe), float("-inf"))
    tl.store(mid_lse_ptr + out_base, lse, mask=g_mask)


@triton.jit
def _decode_attn_reduce_kernel(mid_o_ptr, mid_lse_ptr, out_ptr, D: tl.constexpr, NUM_SPLITS: tl.constexpr,
                               PDL: tl.constexpr):
    _pdl_start(PDL)
    head = tl.program_id(0)
    s = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, D)
    lse = tl.load(mid_lse_ptr + head * NUM_SPLITS + s)
    m = tl.max(lse, axis=0)
    w = tl.exp(lse - m)  # empty splits have lse -inf -> weight 0
    o = tl.load(mid_o_ptr + (head * NUM_SPLITS + s[:, None]) * D + d[None, :])
    out = tl.sum(o * w[:, None], axis=0) / tl.sum(w, axis=0)
    tl.store(out_ptr + head * D + d, out.to(out_ptr.dtype.element_ty))


class DecodeAttention:
    """Split-K flash decoding with its scratch buffers preallocated (they must outlive graph capture)."""

    NUM_SPLITS = 32
    BLOCK_N = 32

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, device, dtype):
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.group = num_heads // num_kv_heads
        self.mid_o = torch.empty((num_heads, self.NUM_SPLITS, head_dim), device=device, dtype=torch.float32)
        self.mid_lse = torch.empty((num_heads, self.NUM_SPLITS), device=device, dtype=torch.float32)
        self.out = torch.empty((num_heads, head_dim), device=device, dtype=dtype)

    def __call__(self, q, k_cache, v_cache, pos_t, length, scale):
        # q: [Hq, D]; k_cache/v_cache: [Hkv, max_ctx, D]; returns [Hq, D] (a reused buffer)
        _decode_attn_split_kernel[(self.num_kv_heads, self.NUM_SPLITS)](
            q, k_cache, v_cache, pos_t, self.mid_o, self.mid_lse, k_cache.shape[1], scale,
            GROUP=self.group, BLOCK_G=max(16, triton.next_power_of_2(self.group)), D=self.head_dim,
            BLOCK_N=self.BLOCK_N, NUM_SPLITS=self.NUM_SPLITS, IEEE=q.dtype == torch.float32, num_warps=4,
            **pdl_launch_args(q.device))
        _decode_attn_reduce_kernel[(self.num_heads,)](self.mid_o, self.mid_lse, self.out, D=self.head_dim,
                                                      NUM_SPLITS=self.NUM_SPLITS, num_warps=4, **pdl_launch_args(q.device))
        return self.out


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
    _gemv_kernel[(triton.cdiv(n, block_n),)](x, w, out, n, k, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
                                             **pdl_launch_args(x.device))
    return out


def _graph_time_us(fn, calls: int) -> float:
    """GPU time of one call, from a CUDA graph of `calls` calls (no launch overhead in the measurement)."""
    stream = torch.cuda.Stream()
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
