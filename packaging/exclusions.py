"""What the GPU release leaves out of the CUDA torch / NVIDIA / Triton stack, and why.

The one list: packaging/r1desk.spec drops these files from the bundle, and packaging/prove_exclusions.py deletes
the same files from a copy of an installed torch stack and runs r1desk on it on a GPU (tests/test_packaging.py
checks both use this module). Paths are relative to site-packages, which is also where PyInstaller puts them
inside the bundle's _internal/ folder. A file may only be listed when torch does not need it at import (the
loader resolves every DT_NEEDED library of libtorch_cuda.so then: cuFFT, cuRAND, cuSPARSE(Lt), NCCL, cuFile,
NVSHMEM, NVRTC, cuDNN's front library; all but the last ship as stubs, STUBBED) and r1desk never loads
it at first use (the proof runs every path: bf16 and 4-bit bench, chat, quantize, and checks that none of these
files was loaded on first use by the full install doing the same work). CUPTI (4 MB, profiler-only) stays for
now: torch preloads it at import, and no GPU run has shown it unneeded yet.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

LEFT_OUT: list[tuple[str, str]] = [
    (
        "*.a",
        "static libraries (Triton's CUPTI/NVPerf profiling libs, cudart_static, nvshmem device): "
        "only a linker reads them",
    ),
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
    # Lazily loaded and shown unneeded by a GPU run of prove_exclusions.py --candidates:
    (
        "nvidia/cudnn/lib/libcudnn_[aeho]*",
        "cuDNN's engine and op libraries (~700 MB), loaded when a cuDNN kernel "
        "first runs; r1desk's attention is SDPA flash/efficient (kernels.reference."
        "keep_off_cudnn: never cuDNN's) or Triton, its matmuls cuBLAS. libcudnn.so.9 "
        "(linked by torch) and libcudnn_graph.so.9 (loaded by torch at run time even "
        "with cuDNN off: the H200 proof saw it mapped) stay",
    ),
    ("nvidia/*/lib/libcusolver.so*", "cuSOLVER, loaded by torch.linalg on CUDA tensors only"),
    ("torch/lib/libtorch_cuda_linalg.so", "torch.linalg's CUDA library, loaded on first use only"),
    (
        "triton/backends/nvidia/lib/cupti*/*",
        "CUPTI and NVPerf for Triton's profiler (proton), loaded only when "
        "profiling (~110 MB: PyInstaller copies each symlink)",
    ),
]

# Left out only where their users ship as stubs (STUBBED; not with R1DESK_NO_STUBS=1, where the real cuSPARSE
# needs nvJitLink at `import torch` and the real NVRTC its builtins).
LEFT_OUT_WITH_STUBS: list[tuple[str, str]] = [
    (
        "nvidia/*/lib/libnvJitLink.so*",
        "nvJitLink (112 MB): linked only by cuSPARSE and cuSOLVER, which are stubbed and left out",
    ),
    ("nvidia/*/lib/libnvrtc-builtins.so*", "NVRTC's builtins, loaded only by NVRTC (stubbed)"),
]

# Next in line, NOT left out yet: lazily loaded, so likely unneeded, but only a GPU run can show it. The proof
# script deletes these too when asked (--candidates) and reports whether the full install ever mapped them;
# an entry moves up to LEFT_OUT once that ran clean on a GPU. R1DESK_LEAVE_OUT_CANDIDATES=1 makes the spec leave
# them out already (to measure the size; not for a release before that GPU run). None at the moment.
CANDIDATES: list[tuple[str, str]] = []

# Linked by libtorch_cuda.so (DT_NEEDED), so a library of each name must exist at `import torch`, but r1desk never
# calls into them: they can be replaced by stubs of a few KB (packaging/stubs.py: same SONAME, version nodes and
# the names torch imports; each function says what was left out and aborts), where the real ones are among the
# stack's largest libraries.
# Proven by a GPU run of prove_exclusions.py (same greedy tokens and speeds as the full install; docs/BENCHMARKS.md,
# 'Packaging: the bundle and the GPU release'); the spec applies them on Linux (R1DESK_NO_STUBS=1 ships the real
# libraries instead).
STUBBED: list[tuple[str, str]] = [
    ("nvidia/*/lib/libcufft.so.*", "cuFFT: FFTs; r1desk runs none"),
    ("nvidia/*/lib/libcurand.so.*", "cuRAND's host API; torch's CUDA random numbers come from its own Philox kernels"),
    ("nvidia/*/lib/libcusparse.so.*", "cuSPARSE: sparse tensors; r1desk has none"),
    ("nvidia/cusparselt/lib/libcusparseLt.so.*", "cuSPARSELt: 2:4-sparse matmuls; r1desk has none"),
    ("nvidia/nccl/lib/libnccl.so.*", "NCCL: multi-GPU communication; r1desk runs on one GPU"),
    ("nvidia/*/lib/libcufile.so.*", "cuFile: GPUDirect Storage; weights are read through safetensors' mmap"),
    ("nvidia/nvshmem/lib/libnvshmem_host.so.*", "NVSHMEM: multi-GPU symmetric memory; r1desk uses none"),
    (
        "nvidia/*/lib/libnvrtc.so.*",
        "NVRTC: torch compiles a few rarely used elementwise ops (the 'jiterator') at run "
        "time; r1desk's ops are not among them",
    ),
]

# Shipped, but with their debug information removed (`strip --strip-debug`: symbols stay, so nothing that looks
# a symbol up breaks). Triton's wheel is built with it, and it is more than half of libtriton.so.
STRIP_DEBUG: list[str] = ["triton/_C/libtriton.so", "triton/_C/libproton.so"]


# Symbols only the static linker needs removed too (`strip --strip-unneeded`; the dynamic symbol table stays):
# a good part of libtorch_cuda and libtorch_cpu (docs/BENCHMARKS.md, 'Packaging: the bundle and the GPU release',
# has the release's size). Proven with the rest above.
STRIP_UNNEEDED: list[str] = ["torch/lib/libtorch_cuda.so", "torch/lib/libtorch_cpu.so", "torch/lib/libtorch_python.so"]


def _why(path: str, rules: list[tuple[str, str]]) -> str | None:
    p = path.replace("\\", "/")
    return next((why for pattern, why in rules if fnmatchcase(p, pattern)), None)


def left_out(path: str, stubs: bool = True) -> str | None:
    """Why `path` (relative to site-packages / the bundle's _internal, either slash) is left out; None if kept.
    stubs: whether STUBBED ship as stubs (then LEFT_OUT_WITH_STUBS are left out too)."""
    return _why(path, LEFT_OUT) or (_why(path, LEFT_OUT_WITH_STUBS) if stubs else None)


def candidate(path: str) -> str | None:
    """Why `path` might be left out once a GPU run has shown it unneeded (CANDIDATES); None if not a candidate."""
    return _why(path, CANDIDATES)


def stubbed(path: str) -> str | None:
    """Why `path` ships as a stub (STUBBED); None if it ships as it is."""
    return _why(path, STUBBED)


def strip_debug(path: str) -> bool:
    return path.replace("\\", "/") in STRIP_DEBUG
