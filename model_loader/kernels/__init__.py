"""Pick the fused Triton kernels where they can run (CUDA + Triton), else the plain PyTorch reference."""

from __future__ import annotations

import contextlib
import logging

log = logging.getLogger(__name__)


# R1DESK_NO_TRITON's value where the bundle's launcher set it (packaging/launcher.py: no C compiler found)
NO_COMPILER = "no-compiler"
COMPILER_HINT = (
    "Install a C compiler (Ubuntu, Debian: sudo apt install gcc; Fedora: sudo dnf install gcc) and start r1desk again."
)


def triton_unavailable(device) -> str | None:
    """Why r1desk's Triton kernels won't be tried on `device`, with what would bring them back (for the live
    panel), or None where they may (triton_works then checks that they run)."""
    import os
    import sys

    import torch

    if torch.device(device).type != "cuda":
        return "not on a GPU."
    switch = os.environ.get("R1DESK_NO_TRITON")
    if switch == NO_COMPILER:
        return f"no C compiler was found, which Triton needs to build its kernels' launchers. {COMPILER_HINT}"
    if switch:
        return "R1DESK_NO_TRITON is set. Start r1desk without it."
    try:
        import triton  # noqa: F401
    except Exception as err:  # not installed (Windows without triton-windows), or a broken install
        package = "triton-windows" if sys.platform == "win32" else "triton"
        return f"Triton could not be imported ({type(err).__name__}). Install it (pip install {package})."
    from model_loader.kernels import kernel_store

    problem = kernel_store.activate()  # the bundle's kernel store, or $R1DESK_KERNEL_STORE; before any compile
    if problem and not kernel_store.has_compiler():
        return (
            f"no C compiler was found, which Triton needs to build its kernels' launchers, and {problem}. "
            f"{COMPILER_HINT}"
        )
    return None


def triton_available(device) -> bool:
    return triton_unavailable(device) is None


def triton_works(device) -> bool:
    return triton_problem(device) is None


def triton_problem(device) -> str | None:
    """Run one small fused kernel and compare it with the reference: None where it works, else what went wrong
    and what to do (as triton_unavailable). Triton compiles a C launcher on first use (it needs a C compiler and
    Python's headers) and JIT-compiles for this GPU: if any of that fails on the user's machine, r1desk falls
    back to plain PyTorch ops instead of failing to start."""
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
        if torch.allclose(got, reference.rms_norm(x, w, 1e-6), atol=1e-4, rtol=1e-4):
            return None
        log.warning("Triton self-check gave wrong results; using plain PyTorch kernels")
        return "a test of r1desk's kernels on this GPU gave wrong results (the log has the details)."
    except Exception as err:  # no C compiler, no Python headers, an unsupported GPU, a broken install
        first = str(err).splitlines()[0] if str(err) else ""
        log.warning("Triton is unusable here (%s: %s); using plain PyTorch kernels", type(err).__name__, first)
        text = f"{type(err).__name__}: {first}"
        if any(word in text.lower() for word in ("compiler", "gcc", "clang", "cc ", "python.h")):
            return f"Triton could not build its kernels ({text[:160]}). {COMPILER_HINT}"
        return f"Triton could not run on this GPU ({text[:160]})."


def kernels_failure(err: BaseException) -> str | None:
    """Why r1desk's kernels failed after their check at load passed, worded for the live panel (as
    triton_unavailable), where `err` came from Triton: a C module the kernel store lacks with no compiler to build
    it, or Triton's compiler on this GPU. None for any other error (those are not the kernels' to answer for)."""
    from model_loader.kernels.kernel_store import StoreMiss

    first = str(err).splitlines()[0] if str(err) else type(err).__name__
    if isinstance(err, StoreMiss):
        return f"{first}. {COMPILER_HINT}"
    module = type(err).__module__ or ""
    if module == "triton" or module.startswith("triton."):
        return f"they failed on this GPU ({type(err).__name__}: {first[:160]}); the log has the details."
    return None
