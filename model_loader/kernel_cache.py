"""Whether this machine has prepared r1desk's GPU kernels before.

Triton compiles our kernels for the user's GPU on first use and caches them on disk, so the first start on a
machine takes longer than the next ones (docs/BENCHMARKS.md, 'Start times: first start and warm start'). A
marker per (GPU, torch, Triton, r1desk version, and the model's kernel-relevant shape: dtype, heads, head dim,
quantization) is written after a complete warm-up; while it is missing, the
window says "Preparing GPU kernels (first start only)" instead of a bare "Warming up" that seems to hang.
"""

from __future__ import annotations

import hashlib
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch


def _marker(device, variant: str = "") -> Path | None:
    device = torch.device(device)
    if device.type != "cuda":
        return None
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # no Triton: nothing to compile
        return None
    try:
        ours = version("r1desk")
    except PackageNotFoundError:
        ours = "source"
    key = "|".join(
        [
            torch.cuda.get_device_name(device),
            str(torch.cuda.get_device_capability(device)),
            torch.__version__,
            triton_version,
            ours,
            variant,
        ]
    )
    from platformdirs import user_cache_dir

    return (
        Path(user_cache_dir("r1desk", appauthor=False))
        / "kernels"
        / (hashlib.sha256(key.encode()).hexdigest()[:16] + ".ready")
    )


def triton_cache_dir() -> Path | None:
    """Where Triton keeps its compiled kernels (TRITON_CACHE_DIR, else its own default), or None if unknown."""
    if os.environ.get("TRITON_CACHE_DIR"):
        return Path(os.environ["TRITON_CACHE_DIR"])
    try:
        from triton import knobs

        return Path(knobs.cache.dir)
    except Exception:  # a Triton without knobs, or none
        try:
            from triton.runtime.cache import default_cache_dir

            return Path(default_cache_dir())
        except Exception:
            return None


def _triton_cache_has_entries() -> bool:
    folder = triton_cache_dir()
    if folder is None:  # can't tell: trust the marker
        return True
    try:
        with os.scandir(folder) as entries:
            return any(True for _ in entries)
    except OSError:  # missing (a cleaned cache) or unreadable
        return False


def kernels_prepared(device, variant: str = "") -> bool:
    """True where nothing needs compiling (not a CUDA device) or a warm-up of this variant (the model's dtype
    and shapes, which the kernels are compiled for) has completed here before and Triton's cache still holds
    something. A marker over an emptied or deleted Triton cache (a user's clean-up) would skip compiling beside the
    load, and everything would compile one kernel at a time in the warm-up (several times longer to ready)
    under a bare "Warming up"."""
    marker = _marker(device, variant)
    return marker is None or (marker.exists() and _triton_cache_has_entries())


def mark_prepared(device, variant: str = "") -> None:
    marker = _marker(device, variant)
    if marker is None:
        return
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:  # a read-only cache folder only means the message shows again next time
        pass
