"""Which device and dtype a model runs on: the GPU chosen (or the CPU), made this thread's current device, and the
precision its matrix multiplies take there."""

from __future__ import annotations

import logging

import torch

from model_loader.errors import GpuMissingError, GpuUnsupportedError, ModelError
from model_loader.gpu_support import check_cuda_device

log = logging.getLogger(__name__)


def pick_device(requested: str | None) -> torch.device:
    """The device to run on, always with its index ("cuda" -> "cuda:1"). "auto" and a bare "cuda" take the first
    GPU, in CUDA's order (fastest first unless CUDA_DEVICE_ORDER says otherwise; CUDA_VISIBLE_DEVICES narrows it),
    that this torch build has code for: a desktop whose first GPU is too old for it (a GTX 1060 beside an RTX 4070
    under a CUDA 13 build) runs on the other one instead of offering the CPU. "cuda:N" is that GPU or an error.
    ModelError for a GPU that can't be used: GpuUnsupportedError where this torch build has no code for any GPU
    asked for (auto included: the CPU would be a silent slowdown of many times, so the user chooses it)."""
    if requested in (None, "auto") and not torch.cuda.is_available():
        return torch.device("cpu")
    dev = torch.device("cuda" if requested in (None, "auto") else requested)
    if dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        build = "a CPU-only build of torch" if torch.version.cuda is None else "no usable NVIDIA GPU/driver"
        raise ModelError(f"CUDA was requested but this machine has {build}; use --device cpu (much slower)")
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise GpuMissingError(
            f"{requested} was requested but this machine has {count} NVIDIA GPU(s), numbered from cuda:0",
            dev.index,
            count,
        )
    candidates = [dev.index] if dev.index is not None else list(range(count))
    problems = []
    for index in candidates:  # before any kernel: an unsupported GPU would fail with "no kernel image"
        problem = check_cuda_device(index)
        if problem is None:
            if problems:
                log.warning("running on cuda:%d; the GPU(s) before it can't be used: %s", index, " ".join(problems))
            return torch.device("cuda", index)
        problems.append(problem)
    others = len(problems) - 1
    also = {0: "", 1: " The machine's other GPU is not supported either."}.get(
        others, f" Nor are the machine's {others} other GPUs."
    )
    raise GpuUnsupportedError(problems[0] + also)


def use_device(dev: torch.device) -> None:
    """Make `dev` this thread's current CUDA device. Torch's own ops follow their tensors' device, but Triton
    launches on the thread's current device and stream, CUDA graphs capture there, and torch.cuda calls without a
    device (current_stream, synchronize, manual_seed, Event) mean it: on cuda:1 they would all go to cuda:0. The
    current device is per thread, so every Engine entry point that runs GPU work calls this first."""
    if dev.type == "cuda" and torch.cuda.current_device() != dev.index:
        torch.cuda.set_device(dev)


def pick_dtype(device: torch.device, requested: str | None = None) -> torch.dtype:
    if requested:
        return {
            "bf16": torch.bfloat16,
            "bfloat16": torch.bfloat16,
            "fp16": torch.float16,
            "float16": torch.float16,
            "fp32": torch.float32,
            "float32": torch.float32,
        }[requested]
    if device.type == "cuda":
        # bf16 where the GPU's matrix multiplies take it: natively from compute capability 8.0, emulated by cuBLAS on
        # Turing (7.5; PyTorch tests it on the T4). Older GPUs (Pascal, Volta: reachable with PyTorch's CUDA 12.6
        # builds) fail bf16 GEMMs with CUBLAS_STATUS_NOT_SUPPORTED, while torch.cuda.is_bf16_supported() says yes
        # there (it only checks that a bf16 tensor can be made): fp16 instead, which the warm-up checks for overflow.
        return torch.bfloat16 if torch.cuda.get_device_capability(device) >= (7, 5) else torch.float16
    return torch.float32
