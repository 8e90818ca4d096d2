"""What the kernel tests share: the attention shapes that matter (the tiny test model's and the real 1.5B's), and
the dtype and tolerance a kernel is checked at on this device (bf16 on a GPU; fp32 in Triton's interpreter)."""

import torch


SHAPES = [  # (Hq, Hkv, D, hidden)
    (4, 2, 16, 64),  # tiny test model
    (12, 2, 128, 1536),  # DeepSeek-R1-Distill-Qwen-1.5B
]


def kernel_dtype(device):
    return torch.bfloat16 if device == "cuda" else torch.float32


def tolerance(device):
    return dict(atol=2e-2, rtol=2e-2) if device == "cuda" else dict(atol=1e-5, rtol=1e-5)
