"""The KV cache's formats: 16-bit (the model's own dtype, exact; the default) or 8-bit (about half the memory).

8-bit stores every cached K and V row (one token of one KV head, head_dim values) as fp8 e4m3 scaled so that its
largest magnitude is e4m3's largest finite value, 448, with the scale kept beside it in fp32: 1 byte a value plus
4 bytes a row (128 values: 1.03 bytes a value against 2). The scale is per row and chosen when the row is written,
so nothing needs calibrating, and a row with an outlier (Qwen2's K has a few large channels from its biases)
only costs that row precision. The attention kernels take the fp8 tiles into their dots as fp16 (exact) and
apply the row scales to the scores and the value weights.

An 8-bit cache keeps V transposed ([KV head, head_dim, token], value_cache): the P.V product reduces over
tokens, and Hopper's tensor cores take 8-bit operands only along the reduced dimension (no 8-bit transposing
load either), so row-major fp8 V goes to the dot through an fp16 copy in shared memory, which leaves the decode
kernel bound by its instructions. Transposed, a tile's V arrives 16 tokens a load, ready for the dot (markedly
fewer instructions a warp in the loop of one 128-token tile at sm_90; benchmarks/decode_kernel_sass.py). The
kernels read V tiles whole, so the cache writer stores no NaN code (a value that overflowed is stored as 0).

Why offer it: on a small GPU it doubles the context that fits next to the weights (a 14B model's 32k context
is 6.3 GB in 16-bit). What it costs: e4m3 keeps 3 mantissa bits, so each cached value is off by up to 1/16 of
its size (attention averages over many of them; outputs no longer match 16-bit or transformers exactly). Speed
at depth: with V row-major our attention kernels on it are bound by their instructions, not the cache read, and
slower than over the 16-bit cache at every depth; with V transposed and two programs an SM
(decode_attention.KV8_CONFIGS) it is as fast as the 16-bit cache at 16k and faster at 32k on an H100
(docs/BENCHMARKS.md, 'Speed by context depth'; not yet measured on an H200). The 16-bit cache stays the default
(exact). Like llama.cpp's q8_0 cache: a choice for the user.
"""

from __future__ import annotations

KV_16BIT = "16-bit"
KV_8BIT = "8-bit"
KV_CACHE_CHOICES = (KV_16BIT, KV_8BIT)


def check_kv_cache(kind: str) -> str:
    """The kind, or ValueError with the choices."""
    if kind not in KV_CACHE_CHOICES:
        raise ValueError(f"unknown KV cache format {kind!r}: choose {' or '.join(KV_CACHE_CHOICES)}")
    return kind


def value_bytes(kind: str, dtype_bytes: int, head_dim: int) -> float:
    """Device bytes one cached value costs (8-bit: one byte plus its row's fp32 scale spread over the row)."""
    return 1 + 4 / head_dim if kind == KV_8BIT else dtype_bytes


# Rows past the end of each transposed value row: the attention kernels read V tiles whole (a mask per token
# would cut their loads to single bytes), so a tile that starts below max_ctx may run up to a tile past it.
V_ROW_PAD = 128  # >= the largest key tile (decode_attention.DECODE_ATTN_CONFIGS, PrefillAttention.SHAPES)


def value_cache(shape: tuple, device, dtype, transposed: bool):
    """The value cache [layers, Hkv, max_ctx, D], zero-filled: row-major, or (transposed, the 8-bit cache's) a
    view of [layers, Hkv, D, rows] storage with rows = max_ctx + V_ROW_PAD rounded up to 16 (so every
    dimension's row starts 16-byte aligned). The kernels read either (small_ops.value_layout)."""
    import torch

    if not transposed:
        return torch.zeros(shape, device=device, dtype=dtype)
    layers, hkv, max_ctx, d = shape
    rows = -(-(max_ctx + V_ROW_PAD) // 16) * 16
    return torch.zeros((layers, hkv, d, rows), device=device, dtype=dtype).transpose(-1, -2)[:, :, :max_ctx]


# Triton has the e4m3 type our 8-bit kernels load only on compute capability 8.9+ (Ada: RTX 40-series; Hopper
# and newer); on an RTX 30-series card (8.6) their compile would fail at warm-up.
FP8_MIN_CAPABILITY = (8, 9)


def unsupported_reason(
    kind: str, device_type: str, capability: tuple[int, int] | None = None, device_name: str = "this GPU"
) -> str | None:
    """Why this device can't hold a cache of this kind (a one-line message for the user), or None."""
    if kind != KV_8BIT or device_type != "cuda" or capability is None or tuple(capability) >= FP8_MIN_CAPABILITY:
        return None
    return (
        f"the 8-bit KV cache needs an NVIDIA GPU of compute capability {FP8_MIN_CAPABILITY[0]}."
        f"{FP8_MIN_CAPABILITY[1]} or newer (RTX 40-series and later); {device_name} is {capability[0]}."
        f"{capability[1]}: choose the 16-bit KV cache (Settings > KV cache, or --kv-cache 16-bit)"
    )
