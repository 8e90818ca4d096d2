"""`r1desk-cli kernel-store record`'s walk (model_loader.kernel_records) runs every path it names: each model
loaded and warmed up with each KV cache, a sampled and a greedy reply, several replies through the scheduler.
Here on the CPU, where nothing is compiled (no Triton kernel runs off a GPU), so the records are empty; on a GPU
the same walk is what fills the release's kernel store (docs/packaging.md, "The kernel store")."""

from __future__ import annotations

import torch

from model_loader.kernel_records import record


def test_the_walk_loads_warms_up_replies_and_batches_with_each_kv_cache(tiny_model):
    said = []
    records = record([tiny_model], ("16-bit", "8-bit"), parallel=3, say=said.append, device="cpu")
    assert records == []  # the CPU compiles nothing
    assert [s for s in said if "warming up" in s] == [
        f"{tiny_model}, 16-bit KV cache: loading and warming up",
        f"{tiny_model}, 8-bit KV cache: loading and warming up",
    ]
    assert [s for s in said if "at once" in s] == [  # the scheduler's paths, over each paged cache
        f"{tiny_model}, 16-bit KV cache: 3 replies at once",
        f"{tiny_model}, 8-bit KV cache: 3 replies at once",
    ]


def test_a_4bit_model_is_recorded_in_both_int4_layouts_whichever_this_gpu_defaults_to():
    """Hopper loads 4-bit weights into our row-packed layout, the other sm80+ GPUs into torch's (with our Triton
    dequantiser for prefill): records made on either must hold the other's kernels too, or those GPUs compile
    (and without a C compiler lose the fast path) on their first start."""
    from model_loader.kernel_records import other_int4_layout
    from model_loader.variants import quantization_label

    class Awq:
        awq = object()

    assert other_int4_layout(quantization_label(Awq, "triton", None, False)) == "torch"
    assert other_int4_layout(quantization_label(Awq, "torch", None, True)) == "triton"
    assert other_int4_layout(quantization_label(Awq, "torch", None, False)) == "triton"
    assert other_int4_layout(quantization_label(Awq, None, torch.bfloat16, False)) is None  # dequantised at load
    assert other_int4_layout(None) is None  # a 16-bit model
