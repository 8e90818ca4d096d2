"""The automatic context length: as much as the device has room for, up to what a reasoning model needs.

DeepSeek advises letting R1 write up to 32,768 tokens; a chain of thought that hits the end of the context is
cut off mid-sentence. So "auto" takes 32,768 tokens where that fits in the memory left after the weights,
with headroom for everything else a reply allocates (prefill activations in 2,048-token chunks, CUDA graphs,
the sampler, other programs' growth), else the largest context that does fit. The KV cache costs
layers x 2 (K, V) x KV heads x head_dim x dtype bytes per token: 28 KiB for the 1.5B in bf16, so 32k is 0.9 GiB.
"""

from __future__ import annotations

import os

from model_loader.kv_cache import KV_16BIT, value_bytes

AUTO_TARGET = 32768
GRANULE = 256  # round down to this many tokens
MIN_CONTEXT = 1024  # less than this is no use for a reasoning model: say so rather than load it
HEADROOM_MIN_BYTES = 1 << 30  # 1 GiB ...
HEADROOM_FRACTION = 0.10  # ... or a tenth of the device, whichever is more
CPU_FALLBACK = 8192  # where the free host memory can't be read


def per_token_bytes(cfg, dtype_bytes: int, kv_cache: str = KV_16BIT) -> int:
    """Device bytes one token of context costs: its K and V in every layer (an 8-bit cache: a byte a value and
    a scale a row), plus its RoPE cos/sin (fp32)."""
    values = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim
    return int(values * value_bytes(kv_cache, dtype_bytes, cfg.head_dim)) + 4 * cfg.head_dim


# A context typed by hand is rounded up to this: the kernels take the context length as an argument, and Triton
# compiles a separate variant for an int that doesn't divide by 16, which the release's kernel store (made from
# the warm-up's launches at multiples of 16) lacks, so a context of 5,000 would compile at first start, or run
# without r1desk's kernels where there is no C compiler.
KERNEL_MULTIPLE = 16


def requested_context(tokens: int, max_positions: int) -> int:
    """The context for an explicit length: at least 16, rounded up to KERNEL_MULTIPLE, at most the model's
    positions."""
    return min(max(16, -(-int(tokens) // KERNEL_MULTIPLE) * KERNEL_MULTIPLE), max_positions)


def choose_context(
    free_bytes: int, total_bytes: int, token_bytes: int, max_positions: int, target: int = AUTO_TARGET
) -> int:
    """The context for `free_bytes` of free memory (measured after the weights are in place)."""
    headroom = max(HEADROOM_MIN_BYTES, int(HEADROOM_FRACTION * total_bytes))
    fits = max(0, free_bytes - headroom) // token_bytes
    ctx = min(target, max_positions, fits)
    if ctx >= target or ctx == max_positions:
        return int(ctx)
    return int(ctx // GRANULE * GRANULE)


class NoRoomForContext(Exception):
    """Fewer than MIN_CONTEXT tokens fit next to the weights."""

    def __init__(self, tokens: int, free_bytes: int):
        super().__init__(
            f"only {free_bytes / 2**30:.2f} GiB is free after loading the weights: room for "
            f"{tokens:,} tokens of context, and a reasoning model needs at least {MIN_CONTEXT:,}"
        )
        self.tokens = tokens


def auto_context(device, cfg, dtype_bytes: int, kv_cache: str = KV_16BIT) -> int:
    """Measure the free memory of `device` (a torch.device; CUDA after the weights are loaded, or the host's
    RAM on the CPU) and choose. Raises NoRoomForContext below MIN_CONTEXT."""
    import torch

    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
    else:
        free, total = host_memory()
        if free is None:
            return min(CPU_FALLBACK, cfg.max_position_embeddings)
    ctx = choose_context(free, total, per_token_bytes(cfg, dtype_bytes, kv_cache), cfg.max_position_embeddings)
    if ctx < min(MIN_CONTEXT, cfg.max_position_embeddings):
        raise NoRoomForContext(ctx, free)
    return ctx


def host_memory() -> tuple[int | None, int | None]:
    """(available, total) bytes of RAM where the OS tells: Linux's MemAvailable (free + reclaimable cache), else
    POSIX sysconf's free pages; (None, None) elsewhere (Windows)."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.strip()}
        return info["MemAvailable"], info["MemTotal"]
    except (OSError, KeyError, ValueError, IndexError):
        pass
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
    except (AttributeError, ValueError, OSError):
        return None, None
