"""Pick the fused Triton kernels where they can run (CUDA + Triton), else the plain PyTorch reference."""

from __future__ import annotations

import contextlib
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


def triton_works(device) -> bool:
    """Run one small fused kernel and compare it with the reference. Triton compiles a C launcher on first use
    (it needs a C compiler and Python's headers) and JIT-compiles for this GPU: if any of that fails on the
    user's machine, r1desk falls back to plain PyTorch ops instead of failing to start."""
    import torch

    try:
        from model_loader.kernels import reference, small_ops

        # 40 columns: a width no model has (theirs are multiples of 16), so this compile never shares its kernel
        # variant with one a first start is compiling ahead at the same time (model_loader.compile_ahead).
        x = torch.randn(2, 40, device=device, dtype=torch.float32)
        w = torch.rand(40, device=device, dtype=torch.float32)
        # on the thread's current device Triton would launch (and compile) for cuda:0 whatever the tensors' GPU
        with torch.cuda.device(x.device) if x.device.type == "cuda" else contextlib.nullcontext():
            got = small_ops.rms_norm(x, w, 1e-6)
        ok = torch.allclose(got, reference.rms_norm(x, w, 1e-6), atol=1e-4, rtol=1e-4)
        if not ok:
            log.warning("Triton self-check gave wrong results; using plain PyTorch kernels")
        return bool(ok)
    except Exception as err:  # no C compiler, no Python headers, an unsupported GPU, a broken install
        log.warning(
            "Triton is unusable here (%s: %s); using plain PyTorch kernels",
            type(err).__name__,
            str(err).splitlines()[0] if str(err) else "",
        )
        return False
