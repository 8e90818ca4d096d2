"""Pick the fused Triton kernels where they can run (CUDA + Triton), else the plain PyTorch reference."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def triton_available(device) -> bool:
    import os

    import torch

    if os.environ.get("R1DESK_NO_TRITON"):
        return False
    if torch.device(device).type != "cuda":
        return False
    try:
        import triton  # noqa: F401
    except Exception:  # not installed (Windows without triton-windows), or a broken install
        return False
    return True
