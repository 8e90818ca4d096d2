"""Compile the Triton kernels a warm-up needs on all CPU cores at once, before the warm-up runs them one by one.

On a machine that never ran r1desk, Triton compiles each kernel variant the first time it is launched, one
after the other on the loading thread (H200, 2026-12-03: 15 variants and 8 C launchers, 5.9 s, for a bf16
model; 30 variants, 27.5 s, for a 4-bit one: docs/BENCHMARKS.md). The compiler spends most of its time with
the GIL released (MLIR passes, ptxas and the C compiler are native code or subprocesses), so compiling on
threads scales with the cores.

How: the engine runs every path of its warm-up once inside `compiling_ahead()`, where `launch(kernel, grid)`
only *warms up* each Triton kernel (binds the same arguments and compiles; launches nothing) under Triton's
AsyncCompileMode, which hands each compile to a thread pool. Leaving the block waits for every compile and
stores the kernels where the normal launches find them. Going through the real code paths, rather than a list
of kernels kept by hand, is what guarantees the same specialisations (dtypes, alignments, divisibility of the
integer arguments, constexprs) as the warm-up itself: nothing compiles twice.

Where Triton has no AsyncCompileMode, or kernels are interpreted (TRITON_INTERPRET=1), nothing is compiled
ahead and the warm-up compiles as before.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

log = logging.getLogger(__name__)

_state = threading.local()  # .active: this thread is inside compiling_ahead()


def active() -> bool:
    """True while this thread runs the warm-up paths only to compile (launches are compile-only)."""
    return getattr(_state, "active", False)


def launch(kernel, grid):
    """kernel[grid], to be called with the kernel's arguments; inside compiling_ahead(), a compile-only warm-up
    of the same call."""
    if active():
        return functools.partial(kernel.warmup, grid=grid)
    return kernel[grid]


def _async_compile_mode():
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:  # Triton older than 3.4
        return None
    return AsyncCompileMode


def _prepare_launcher(kernel) -> None:
    """Build the kernel's C launcher now, on this worker thread. Triton 3.6 compiles one with the C compiler per
    kernel signature (~0.2 s each) on the thread of the first launch, and caches it on disk; built here, the
    first launch finds it. Later Tritons launch generically and this costs nothing. Any failure only means the
    first launch builds it as before."""
    try:
        from triton.runtime import driver

        driver.active.launcher_cls(kernel.src, kernel.metadata)
    except Exception as err:  # an internal API: never let it cost more than the time it was meant to save
        log.debug("launcher not prepared ahead (%s: %s)", type(err).__name__, err)


class _CompilePool(ThreadPoolExecutor):
    """Each compile job also prepares its kernel's launcher."""

    def submit(self, fn, /, *args, **kwargs):
        def compile_and_prepare():
            kernel = fn(*args, **kwargs)
            _prepare_launcher(kernel)
            return kernel

        return super().submit(compile_and_prepare)


def default_workers() -> int:
    # Compiles are CPU-bound; one per core, but a 64-core workstation gains nothing past a few dozen variants.
    return max(1, min(os.cpu_count() or 1, 16))


@contextmanager
def compiling_ahead(workers: int | None = None):
    """Inside: launches through `launch` only compile, on `workers` threads. Yields whether compiling ahead is
    possible here (False: run nothing inside, the warm-up compiles as it goes). Compile errors are not raised
    here: the warm-up's own launch of that kernel meets them where they are handled today (a configuration
    this GPU can't run is skipped, a broken Triton falls back)."""
    mode_cls = _async_compile_mode()
    if mode_cls is None:
        yield False
        return
    pool = _CompilePool(max_workers=workers or default_workers(), thread_name_prefix="r1desk-compile")
    try:
        mode = mode_cls(pool, ignore_errors=True)
    except TypeError:  # Tritons whose AsyncCompileMode takes only the executor
        mode = mode_cls(pool)
    try:
        mode.__enter__()
        _state.active = True
        try:
            yield True
        finally:
            _state.active = False
            try:
                mode.__exit__(None, None, None)  # waits for every compile and stores the kernels
            except Exception as err:  # a kernel that doesn't compile: the warm-up's own launch reports it
                log.warning("compiling ahead: %s: %s", type(err).__name__, str(err).splitlines()[0] if str(err) else "")
    finally:
        pool.shutdown(wait=True)
