"""Which int4 path an AWQ checkpoint takes, how the weights are labelled, and the kernel variant name the kernel
cache keys by (model_loader.variants)."""

import pytest
import torch

from model_loader.errors import ModelError
from model_loader.kv_cache import KV_8BIT, KV_16BIT
from model_loader.variants import choose_int4_layout, kernel_variant, quantization_label


def test_an_int4_path_that_cannot_run_here_is_refused_by_name():
    with pytest.raises(ModelError, match="the torch int4 path can't run here"):
        choose_int4_layout(torch.device("cpu"), torch.float32, triton_ok=False, forced="torch")
    assert choose_int4_layout(torch.device("cpu"), torch.float32, triton_ok=False, forced=None) is None
    assert choose_int4_layout(torch.device("cpu"), torch.float32, triton_ok=True, forced=None) == "triton"


def test_default_int4_path_follows_the_gpu_generation(monkeypatch):
    """Hopper: our Triton kernels (measured fastest there); other sm80+ GPUs: torch's int4 kernel (the issue's
    default, ours unmeasured there); either can be forced; without Triton torch's kernel runs where it can."""
    import model_loader.variants as variants

    monkeypatch.setattr(variants, "int4pack_supported", lambda dev: True)  # as on any CUDA sm80+ GPU
    gpu, bf16 = torch.device("cuda"), torch.bfloat16
    assert choose_int4_layout(gpu, bf16, triton_ok=True, forced=None, capability=(9, 0)) == "triton"
    assert choose_int4_layout(gpu, bf16, triton_ok=True, forced=None, capability=(8, 6)) == "torch"
    assert choose_int4_layout(gpu, bf16, triton_ok=True, forced=None, capability=(12, 0)) == "torch"
    assert choose_int4_layout(gpu, bf16, triton_ok=False, forced=None, capability=(9, 0)) == "torch"
    assert choose_int4_layout(gpu, bf16, triton_ok=True, forced="torch", capability=(9, 0)) == "torch"
    assert choose_int4_layout(gpu, bf16, triton_ok=True, forced="triton", capability=(8, 6)) == "triton"
    assert choose_int4_layout(gpu, torch.float16, triton_ok=True, forced=None, capability=(8, 6)) == "triton"


def _cfg(awq=None):
    from types import SimpleNamespace

    return SimpleNamespace(num_attention_heads=12, num_key_value_heads=2, head_dim=128, hidden_size=1536, awq=awq)


def test_the_weights_label_says_which_int4_path_runs():
    awq = object()
    assert quantization_label(_cfg(), "triton", torch.bfloat16, False) is None  # a dense checkpoint
    assert quantization_label(_cfg(awq), "triton", torch.bfloat16, False) == "awq-int4 (Triton int4 kernels)"
    assert quantization_label(_cfg(awq), "torch", torch.bfloat16, False) == "awq-int4 (torch int4 kernel)"
    assert quantization_label(_cfg(awq), "torch", torch.bfloat16, True) == (
        "awq-int4 (torch int4 kernel + cuBLAS prefill)"
    )
    assert quantization_label(_cfg(awq), None, torch.float16, False) == "awq (dequantized to float16)"


def test_the_kernel_variant_names_everything_the_kernels_are_compiled_for():
    """Two models that differ in any of these must not share prepared kernels (kernel_cache keys by the name)."""
    dense = kernel_variant(_cfg(), torch.bfloat16, None)
    assert dense == "bfloat16|12/2x128|1536|None"
    assert kernel_variant(_cfg(), torch.bfloat16, None, KV_16BIT) == dense
    others = [
        kernel_variant(_cfg(), torch.float16, None),
        kernel_variant(_cfg(), torch.bfloat16, "awq-int4 (Triton int4 kernels)"),
        kernel_variant(_cfg(), torch.bfloat16, None, KV_8BIT),
    ]
    assert others[2] == "bfloat16|12/2x128|1536|None|kv 8-bit"
    assert len({dense, *others}) == 4
