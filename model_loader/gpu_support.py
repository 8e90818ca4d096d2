"""Can the installed torch run on this GPU? Each torch build carries GPU code for a list of compute capabilities
(torch.cuda.get_arch_list()); a GPU outside them loads weights fine (copies need no kernel) and then fails at its
first kernel with "CUDA error: no kernel image is available for execution on the device". It happens to real
users both ways: PyPI's current Linux builds (CUDA 13) dropped GPUs older than the RTX 20-series (GTX 10-series
6-8 GB cards among them), and builds for CUDA 12.6 and older predate the RTX 50-series. Checked before a load, it
becomes one clear message with what to install, and the window offers the CPU instead.

What to install (PyTorch's support matrix, late 2026): CUDA 13 builds cover compute capability 7.5-12.0 (Turing
to Blackwell); CUDA 12.6 builds, published up to PyTorch 2.14, cover 5.0-9.0 (Maxwell, Pascal and Volta too).
Both URLs serve Linux and Windows wheels. --force-reinstall: the same torch version built for another CUDA can
rank as already installed (2.13.0+cu130 sorts above 2.13.0+cu126), and pip would then change nothing.
"""

from __future__ import annotations

import re

_ENTRY = re.compile(r"^(sm|compute)_(\d+)([af]?)$")


def code_runs_on(entry: str, capability: int) -> bool | None:
    """Whether an arch-list entry's code runs on a GPU of `capability` (major * 10 + minor; 8.6 -> 86); None for
    an entry we can't read. A cubin ("sm_80") runs on later GPUs of its major (8.6, 8.9), not on another major;
    "sm_90a" (architecture-specific features) only on 9.0; "sm_100f" on its family (10.x from 10.0); plain PTX
    ("compute_90") is compiled by the driver for any GPU from 9.0 on ("compute_90a" / "compute_100f": as their
    cubins)."""
    match = _ENTRY.match(entry)
    if match is None:
        return None
    kind, code, suffix = match.group(1), int(match.group(2)), match.group(3)
    if suffix == "a":  # architecture-specific features, as cubin or PTX: that GPU only
        return capability == code
    if suffix == "f" or kind == "sm":  # a family's code, or a cubin: later GPUs of the same major
        return capability // 10 == code // 10 and capability % 10 >= code % 10
    return capability >= code  # plain PTX: the driver compiles it for any later GPU


def _capability_text(code: int) -> str:
    return f"{code // 10}.{code % 10}"


def unsupported_gpu_reason(
    capability: tuple[int, int], arch_list: list[str], device_name: str, torch_version: str
) -> str | None:
    """A one-line message when no code in this torch build runs on the GPU, with what to install instead; None
    when some does, or when the build lists nothing we can read (then we don't second-guess it)."""
    cc = capability[0] * 10 + capability[1]
    verdicts = [code_runs_on(entry, cc) for entry in arch_list]
    readable = [entry for entry, v in zip(arch_list, verdicts) if v is not None]
    if not readable or any(verdicts):
        return None
    codes = sorted({int(_ENTRY.match(e).group(2)) for e in readable})
    built_for = ", ".join(_capability_text(c) for c in codes)
    if cc < codes[0] and cc >= 50:
        advice = (
            "PyTorch's CUDA 12.6 builds support it (pip install --force-reinstall torch --index-url "
            "https://download.pytorch.org/whl/cu126)."
        )
    elif cc < codes[0]:
        advice = "Current PyTorch builds start at compute capability 5.0."
    elif cc > codes[-1]:
        advice = (
            "A newer PyTorch build supports it: the CUDA 13 ones include every GPU from the RTX 20-series "
            "to the RTX 50-series (pip install --force-reinstall torch --index-url "
            "https://download.pytorch.org/whl/cu130)."
        )
    else:
        advice = "Install a PyTorch build made for it (pytorch.org lists which CUDA versions cover which GPUs)."
    return (
        f"Your {device_name} (compute capability {_capability_text(cc)}) is not supported by this PyTorch "
        f"({torch_version}, built for compute capability {built_for}). {advice}"
    )


def list_gpus() -> list[dict]:
    """This machine's NVIDIA GPUs in CUDA's order, {"device": "cuda:N", "name", "supported"} (supported: the
    installed torch has code for it); [] without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [
        {"device": f"cuda:{i}", "name": torch.cuda.get_device_name(i), "supported": check_cuda_device(i) is None}
        for i in range(torch.cuda.device_count())
    ]


def check_cuda_device(device) -> str | None:
    """unsupported_gpu_reason for a CUDA device with the installed torch (None on ROCm builds: their list is not
    CUDA's)."""
    import torch

    if torch.version.hip is not None:
        return None
    return unsupported_gpu_reason(
        torch.cuda.get_device_capability(device),
        torch.cuda.get_arch_list(),
        torch.cuda.get_device_name(device),
        torch.__version__,
    )
