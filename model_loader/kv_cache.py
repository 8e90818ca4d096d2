"""The KV cache's formats: 16-bit (the model's own dtype, exact) or 8-bit (half the memory, faster at depth).

8-bit stores every cached K and V row (one token of one KV head, head_dim values) as fp8 e4m3 scaled so that its
largest magnitude is e4m3's largest finite value, 448, with the scale kept beside it in fp32: 1 byte a value plus
4 bytes a row (128 values: 1.03 bytes a value against 2). The scale is per row and chosen when the row is written,
so nothing needs calibrating, and a row with an outlier (Qwen2's K has a few large channels from its biases)
only costs that row precision. The attention kernels dequantize each tile as they read it.

Why offer it: the decode step reads the whole cache once a token, so at depth the cache read is what slows
decoding (H200, the 1.5B at 32,768 tokens: 0.92 GB a token in 16-bit, next to ~3 GB of weights); and on a 6 GB GPU
it doubles the context that fits. What it costs: e4m3 keeps 3 mantissa bits, so each cached value is off by up
to 1/16 of its size; attention averages over many of them. Like llama.cpp's q8_0 cache, a choice for the user
(16-bit stays the default): the outputs are no longer bit-equal to transformers'.
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
