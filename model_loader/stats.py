"""Timings and memory: percentiles, torch's own allocator counters, and NVML for the whole device."""

from __future__ import annotations

import math

from model_loader.events import GenerationStats, MemoryStats


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100), like numpy's default; nan for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def decode_context(prompt_tokens: int, new_tokens: int) -> float:
    """Tokens of cache the average decode step of a reply reads (0: no decode step). The first of new_tokens
    comes from the prefill; the steps that make the others read prompt_tokens + 1 ... prompt_tokens + new_tokens
    - 1 tokens. With EngineInfo's decode_weight_bytes and kv_bytes_per_token: what a step reads from memory."""
    return prompt_tokens + new_tokens / 2 if new_tokens > 1 else 0.0


def thinking_seconds(stats: GenerationStats) -> float:
    """A finished reply's time reasoning: from its first token to its first answer token, or to its end where the
    answer never started."""
    end_ms = stats.first_answer_ms if stats.first_answer_ms is not None else stats.total_s * 1000.0
    return max(0.0, (end_ms - stats.ttft_ms) / 1000.0)


def gpu_uuid(index: int) -> str | None:
    """NVML's name for CUDA device `index` ("GPU-" and its UUID), None where torch can't tell. NVML numbers the
    GPUs by PCI bus, CUDA fastest first and only those in CUDA_VISIBLE_DEVICES: on a machine with two GPUs,
    NVML's index 0 may well be the other one."""
    import torch

    try:
        uuid = str(torch.cuda.get_device_properties(index).uuid)
    except Exception:  # a torch without the field, or not a CUDA device
        return None
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def nvml_handle(pynvml, uuid: str | None):
    """The NVML handle of the GPU named by gpu_uuid(), after nvmlInit(); None when it has no name or NVML doesn't
    know it (never another GPU's handle: its memory and load would be shown as the model's)."""
    if not uuid:
        return None
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except Exception:
        return None


def _nvml_utilization(index: int) -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = nvml_handle(pynvml, gpu_uuid(index))
            return int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu) if handle is not None else None
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVIDIA driver, no pynvml, or a GPU NVML can't see
        return None


def memory_stats(device, weights_bytes: int, kv_cache_bytes: int) -> MemoryStats:
    import torch

    dev = torch.device(device)
    stats = MemoryStats(device=str(dev), weights_bytes=weights_bytes, kv_cache_bytes=kv_cache_bytes)
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        stats.torch_allocated_bytes = torch.cuda.memory_allocated(index)
        stats.torch_reserved_bytes = torch.cuda.memory_reserved(index)
        stats.peak_allocated_bytes = torch.cuda.max_memory_allocated(index)
        free, total = torch.cuda.mem_get_info(index)
        stats.device_free_bytes, stats.device_total_bytes = free, total
        stats.gpu_utilization_pct = _nvml_utilization(index)
    else:
        stats.torch_allocated_bytes = weights_bytes + kv_cache_bytes
    return stats
