"""How a loaded model's weights are held and which kernels serve them: the int4 path an AWQ checkpoint takes on this
GPU, the label the app shows for it, and the variant name the kernel cache keys prepared kernels by."""

from __future__ import annotations

import torch

from model_loader.awq import int4pack_supported
from model_loader.errors import ModelError
from model_loader.kv_cache import KV_16BIT


INT4_LABELS = {"triton": "awq-int4 (Triton int4 kernels)", "torch": "awq-int4 (torch int4 kernel)"}


def choose_int4_layout(
    dev: torch.device, dtype: torch.dtype, triton_ok: bool, forced: str | None, capability: tuple | None = None
) -> str | None:
    """Which int4 path an AWQ checkpoint runs on. capability: the CUDA GPU's (major, minor), read from dev when
    not given. By default:
      - our Triton int4 kernels on Hopper (sm90) where Triton runs: fastest there, in decode and TTFT, against
        torch's int4 kernel (docs/BENCHMARKS.md, 'Headline: decode and TTFT');
      - torch's int4 kernel on the other sm80+ GPUs in bf16 (what the 4-bit issue specifies; ours is not
        measured on them yet), its prefill replaced by our dequantiser + cuBLAS where Triton runs (Linears);
      - our Triton kernels on older GPUs and in fp16; else None: dequantised to dense at load.
    forced ("torch", "triton", "dequantize") picks one; ModelError if it can't run here."""
    possible = {"dequantize": None}
    if triton_ok:
        possible["triton"] = "triton"
    if dtype == torch.bfloat16 and int4pack_supported(dev):
        possible["torch"] = "torch"
    if forced is not None:
        if forced not in possible:
            raise ModelError(f"the {forced} int4 path can't run here (available: {', '.join(possible)})")
        return possible[forced]
    if capability is None and dev.type == "cuda":
        capability = torch.cuda.get_device_capability(dev)
    if capability is not None and capability[0] == 9 and "triton" in possible:
        return "triton"
    return possible.get("torch", possible.get("triton"))


def quantization_label(cfg, int4: str | None, dtype: torch.dtype, int4pack_prefill: bool) -> str | None:
    """How the weights are held, as EngineInfo.quantization says it (None: a dense checkpoint)."""
    if cfg.awq is None:
        return None
    if int4pack_prefill:
        return "awq-int4 (torch int4 kernel + cuBLAS prefill)"
    return INT4_LABELS.get(int4, f"awq (dequantized to {str(dtype).replace('torch.', '')})")


def kernel_variant(cfg, dtype: torch.dtype, quantization: str | None, kv_cache: str = KV_16BIT) -> str:
    """What our kernels are compiled for besides the GPU: dtype, head layout, quantization, an 8-bit KV cache
    (kernel_cache)."""
    return (
        f"{str(dtype).replace('torch.', '')}|{cfg.num_attention_heads}/{cfg.num_key_value_heads}x"
        f"{cfg.head_dim}|{cfg.hidden_size}|{quantization}" + ("" if kv_cache == KV_16BIT else f"|kv {kv_cache}")
    )
