"""What the GPU release leaves out of the CUDA torch / NVIDIA / Triton stack, and why.

The one list: packaging/r1desk.spec drops these files from the bundle, and packaging/prove_exclusions.py deletes
the same files from a copy of an installed torch stack and runs r1desk on it on a GPU (tests/test_packaging.py
checks both use this module). Paths are relative to site-packages, which is also where PyInstaller puts them
inside the bundle's _internal/ folder. A file may only be listed when torch does not need it at import (the
loader resolves every DT_NEEDED library of libtorch_cuda.so then: cuFFT, cuRAND, cuSPARSE(Lt), NCCL, cuFile,
NVSHMEM, cuDNN's front library all stay until they are replaced by something smaller) and r1desk never loads
it at first use (the proof runs every path: bf16 and 4-bit bench, chat, quantize, and checks that none of these
files was loaded on first use by the full install doing the same work). CUPTI (4 MB, profiler-only) stays for
now: torch preloads it at import, and no GPU run has shown it unneeded yet.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

LEFT_OUT: list[tuple[str, str]] = [
    ("*.a", "static libraries (Triton's CUPTI/NVPerf profiling libs, cudart_static, nvshmem device): "
            "only a linker reads them"),
    ("nvidia/*/include/*", "the CUDA toolkit's C headers; Triton compiles with its own copy"),
    ("nvidia/*/lib/libnvperf_*", "Nsight performance counters: profiling only"),
    ("nvidia/*/lib/libpcsamplingutil*", "PC sampling: profiling only"),
    ("nvidia/*/lib/libcheckpoint*", "CUDA checkpoint/restore of processes: never used"),
    ("nvidia/*/lib/libnvblas*", "a BLAS shim for CPU programs; torch calls cuBLAS directly"),
    ("nvidia/*/lib/libcufftw*", "the FFTW-compatible front end; torch calls cuFFT directly"),
    ("nvidia/*/lib/libcusolverMg*", "multi-GPU cuSOLVER: torch does not link or load it"),
    ("nvidia/*/lib/libnvrtc*.alt.*", "the alternate NVRTC build; torch links libnvrtc.so"),
    ("nvidia/nvshmem/lib/nvshmem_transport_*", "NVSHMEM network transports: multi-node jobs only"),
    ("nvidia/nvshmem/lib/nvshmem_bootstrap_*", "NVSHMEM bootstraps (MPI, PMI, UCX): multi-process jobs only"),
    ("nvidia/nvshmem/lib/*.bc", "NVSHMEM device bitcode: only for compiling NVSHMEM kernels"),
]

# Next in line, NOT left out yet: lazily loaded, so likely unneeded, but only a GPU run can show it. The proof
# script deletes these too when asked (--candidates) and reports whether the full install ever mapped them;
# an entry moves up to LEFT_OUT once that ran clean on a GPU.
CANDIDATES: list[tuple[str, str]] = [
    ("nvidia/cudnn/lib/libcudnn_[aeghio]*", "cuDNN's engine and op libraries (~850 MB), loaded when a cuDNN kernel "
                                            "first runs; r1desk's attention is SDPA flash/efficient or Triton, its "
                                            "matmuls cuBLAS (libcudnn.so.9 itself is linked by torch: it stays)"),
    ("nvidia/*/lib/libcusolver.so*", "cuSOLVER, loaded by torch.linalg on CUDA tensors only"),
    ("torch/lib/libtorch_cuda_linalg.so", "torch.linalg's CUDA library, loaded on first use only"),
]

# Shipped, but with their debug information removed (`strip --strip-debug`: symbols stay, so nothing that looks
# a symbol up breaks). Triton's wheel is built with it: libtriton.so 483 MB -> 228 MB (Triton 3.8).
STRIP_DEBUG: list[str] = ["triton/_C/libtriton.so", "triton/_C/libproton.so"]


def _why(path: str, rules: list[tuple[str, str]]) -> str | None:
    p = path.replace("\\", "/")
    return next((why for pattern, why in rules if fnmatchcase(p, pattern)), None)


def left_out(path: str) -> str | None:
    """Why `path` (relative to site-packages / the bundle's _internal, either slash) is left out; None if kept."""
    return _why(path, LEFT_OUT)


def candidate(path: str) -> str | None:
    """Why `path` might be left out once a GPU run has shown it unneeded (CANDIDATES); None if not a candidate."""
    return _why(path, CANDIDATES)


def strip_debug(path: str) -> bool:
    return path.replace("\\", "/") in STRIP_DEBUG
