"""Compile the Triton kernels a warm-up needs on all CPU cores at once, before the warm-up runs them one by one.

On a machine that never ran r1desk, Triton compiles each kernel variant the first time it is launched, one
after the other on the loading thread: measured at seconds for a bf16 model and several times that for a 4-bit
one, which has twice the variants. Compiling on threads overlaps what runs without the GIL (ptxas and the C
compiler are subprocesses, parts of the MLIR passes are native), but much of a compile holds it (code generation
in Python, the bindings' calls): one compile beside a single busy Python thread measured several times slower,
and 16 threads fall far short of a 16-fold speed-up.

How: on a first start the engine walks every path of its warm-up once inside `compile_pool()` (Triton's
AsyncCompileMode over a thread pool) and `compile_only()`, where `launch(kernel, grid)` only *warms up* each
Triton kernel (binds the same arguments and submits its compile; launches nothing), so every compile is under
way at once; then it waits for them all (CompilePool.finish) and runs the warm-up proper, which finds every
kernel compiled. Going through the real code paths, rather than a list of kernels kept by hand, is what
guarantees the same specialisations (dtypes, alignments, divisibility of the integer arguments, constexprs) as
the warm-up itself: nothing compiles twice. (The warm-up does not overlap the compiles: with some Tritons a
launch of a kernel still compiling would fail, and CUDA-graph capture should not run beside compiler threads.)

Where Triton has no AsyncCompileMode, or kernels are interpreted (TRITON_INTERPRET=1), nothing is compiled
ahead and the warm-up compiles as before.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

log = logging.getLogger(__name__)

_state = threading.local()  # .active: this thread is inside compile_only()


def active() -> bool:
    """True while this thread runs the warm-up paths only to compile (inside compile_only())."""
    return getattr(_state, "active", False)


def launch(kernel, grid):
    """kernel[grid], to be called with the kernel's arguments; inside compile_only(), a compile-only warm-up of
    the same call."""
    if active():
        return functools.partial(kernel.warmup, grid=grid)
    return kernel[grid]


def async_compile_mode():
    """Triton's AsyncCompileMode, or None where compiling ahead isn't possible here."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:  # Triton older than 3.4
        return None
    return AsyncCompileMode


def _launcher_key(kernel) -> tuple:
    # Kernels of one function whose constexpr arguments sit at the same positions get the same launcher source.
    constants = getattr(kernel.src, "constants", {}) or {}
    return getattr(getattr(kernel.src, "fn", None), "__name__", None), tuple(sorted(map(str, constants)))


def _prepare_launcher(kernel, prepared: set, lock: threading.Lock) -> None:
    """Build the kernel's C launcher now, on this worker thread. Triton 3.6 compiles one with the C compiler per
    kernel signature on the thread of the first launch, and caches it on disk; built here, the
    first launch finds it. Later Tritons launch generically and this costs nothing. Any failure only means the
    first launch builds it as before."""
    try:
        key = _launcher_key(kernel)
        with lock:
            if key in prepared:  # another variant of the same kernel built (or is building) this one
                return
            prepared.add(key)
        from triton.runtime import driver

        driver.active.launcher_cls(kernel.src, kernel.metadata)
    except Exception as err:  # an internal API: never let it cost more than the time it was meant to save
        log.debug("launcher not prepared ahead (%s: %s)", type(err).__name__, err)


WORKER_WAIT_S = 60  # a worker's compile that takes longer than this is left to the thread (normal ones take far less)
MIN_WORKERS = 6  # fewer worker processes than this (where memory is short): the threads compile instead


class _LauncherPreparingExecutor(ThreadPoolExecutor):
    """Each compile job first waits for the same compile in a worker process, if one was started for it
    (compile_workers: Triton's compile then only loads the result from the cache), and then prepares its
    kernel's launcher (once per launcher)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._launchers: set = set()
        self._launchers_lock = threading.Lock()
        self.worker_stats = {"compiled": 0, "seconds": 0.0, "failed": 0, "not_reused": 0}
        self._workers_hang = False
        self._stats_lock = threading.Lock()  # the pool's threads count at once

    def _count(self, **amounts) -> None:
        with self._stats_lock:
            for name, amount in amounts.items():
                self.worker_stats[name] += amount

    def submit(self, fn, /, *args, **kwargs):
        from model_loader.kernels import compile_workers

        in_worker = compile_workers.take_pending()  # started by Triton's hook on this thread, for this compile

        def compile_and_prepare():
            worker_hash = self._wait_for_worker(in_worker) if in_worker is not None else None
            kernel = fn(*args, **kwargs)
            if worker_hash is not None and getattr(kernel, "hash", None) != worker_hash:
                self._count(not_reused=1)  # compiled again here: a different cache key
                log.warning(
                    "%s: compiled again on a thread (the worker's cache key %s, the thread's %s)",
                    getattr(getattr(kernel, "src", None), "name", "?"),
                    worker_hash[:12],
                    str(getattr(kernel, "hash", None))[:12],
                )
            _prepare_launcher(kernel, self._launchers, self._launchers_lock)
            return kernel

        return super().submit(compile_and_prepare)

    def _wait_for_worker(self, future) -> str | None:
        try:
            # after one compile timed out the workers are taken to hang: only what they already finished is used
            kernel_hash, seconds = future.result(timeout=0 if self._workers_hang else WORKER_WAIT_S)
        except BaseException as err:  # it failed, died or hangs: this thread compiles it instead
            if isinstance(err, TimeoutError):
                self._workers_hang = True
            self._count(failed=1)
            log.debug("a worker's compile failed (%s: %s); compiling on the thread", type(err).__name__, err)
            return None
        self._count(compiled=1, seconds=seconds)
        return kernel_hash


def default_workers() -> int:
    """R1DESK_COMPILE_THREADS, else one per core up to 16: compiles are CPU-bound, but a 64-core workstation gains
    nothing past a few dozen variants."""
    try:
        asked = int(os.environ.get("R1DESK_COMPILE_THREADS", "0"))
    except ValueError:
        asked = 0
    if asked > 0:
        return asked
    return max(1, min(os.cpu_count() or 1, 16))


# While a first start compiles, the GIL changes hands at Python's default interval, whatever the app set for its
# decode loop (the window and `serve` run at 0.5 ms): 0.5 ms while compiling makes the first start slower, bf16
# and 4-bit (docs/BENCHMARKS.md, 'Tried and rejected'), as each hand-off costs the compile threads more than the
# loading thread gains from getting the GIL back sooner.
COMPILE_SWITCH_INTERVAL_S = 0.005
_switch = {"pools": 0, "saved": None}
_switch_lock = threading.Lock()


def _set_compile_switch_interval() -> None:
    with _switch_lock:
        if _switch["pools"] == 0:
            _switch["saved"] = sys.getswitchinterval()
            sys.setswitchinterval(COMPILE_SWITCH_INTERVAL_S)
        _switch["pools"] += 1


def _restore_switch_interval() -> None:
    with _switch_lock:
        _switch["pools"] -= 1
        if _switch["pools"] == 0 and _switch["saved"] is not None:
            sys.setswitchinterval(_switch["saved"])


class CompilePool:
    """Triton's AsyncCompileMode over a thread pool, entered on creation; with `processes`, the compiles run in
    worker processes (compile_workers) and the threads wait for them. finish() waits for every compile and
    stores the kernels where launches find them (idempotent; always called by compile_pool())."""

    def __init__(self, mode_cls, threads: int, processes: bool = False, target: tuple | None = None):
        self.threads = threads
        self.executor = _LauncherPreparingExecutor(max_workers=threads, thread_name_prefix="r1desk-compile")
        try:
            self.mode = mode_cls(self.executor, ignore_errors=True)
        except TypeError:  # Tritons whose AsyncCompileMode takes only the executor
            self.mode = mode_cls(self.executor)
        self.open = False
        self.workers = None  # compile_workers.WorkerCompiler
        try:
            self.mode.__enter__()
        except BaseException:
            self.executor.shutdown(wait=False)
            raise
        self.open = True
        _set_compile_switch_interval()
        if processes:
            self._start_workers(threads, target)

    def _start_workers(self, count: int, target: tuple | None) -> None:
        from model_loader.kernels import compile_workers

        affordable = compile_workers.affordable_workers(count)
        if affordable < min(count, MIN_WORKERS):  # a few processes compile slower than 16 threads
            log.info("compiling on threads: the available host memory allows %d worker processes", affordable)
            return
        count = affordable
        try:
            self.workers = compile_workers.WorkerCompiler(count, target)
            compile_workers.register(self)
        except Exception as err:  # no processes here (a sandbox, a limit): the threads compile, as before
            log.warning("compiling on threads only (%s: %s)", type(err).__name__, err)
            if self.workers is not None:
                self.workers.shutdown()
            self.workers = None

    @property
    def in_processes(self) -> bool:
        return self.workers is not None

    @property
    def processes(self) -> int:
        """Worker processes compiling (0: the threads compile)."""
        return self.workers.workers if self.workers is not None else 0

    @property
    def worker_stats(self) -> dict:
        """compiled / seconds / failed in the workers, not_reused (compiled again on a thread), submitted, the
        workers whose compiler warmed up while booting with the seconds that took, and those that imported this
        process's __main__ (all numbers: they add up over a first start's two pools)."""
        warmed = [s for s in self.workers.warm_s if s is not None] if self.workers else []
        return dict(
            self.executor.worker_stats,
            submitted=self.workers.submitted if self.workers else 0,
            warmed=len(warmed),
            warm_s=round(sum(warmed), 3),
            main_imported=self.workers.mains_imported if self.workers else 0,
        )

    def finish(self) -> None:
        if not self.open:
            return
        self.open = False
        try:
            self.mode.__exit__(None, None, None)
        except Exception as err:  # a kernel that doesn't compile: its launch reports it
            log.warning("compiling ahead: %s: %s", type(err).__name__, str(err).splitlines()[0] if str(err) else "")
        finally:
            # Some Tritons (3.6) clear the active mode only after waiting; after an interruption there it would
            # stay set, and every later compile on this thread would go to a pool that is shut down.
            from triton.runtime import _async_compile

            if _async_compile.active_mode.get() is self.mode:
                _async_compile.active_mode.set(None)
            try:
                self.executor.shutdown(wait=True)
            finally:
                _restore_switch_interval()
            if self.workers is not None:
                from model_loader.kernels import compile_workers

                compile_workers.unregister(self)
                self.workers.shutdown()
                stats = self.worker_stats
                log.info(
                    "compiled %d of %d kernels in %d worker processes (%.1f s of compile time); %d failed "
                    "there, %d compiled again on a thread",
                    stats["compiled"],
                    stats["submitted"],
                    self.processes,
                    stats["seconds"],
                    stats["failed"],
                    stats["not_reused"],
                )


def open_compile_pool(
    workers: int | None = None, processes: bool | None = None, target: tuple | None = None
) -> CompilePool | None:
    """A CompilePool entered on this thread (every Triton compile this thread starts goes to it until finish()),
    or None where that isn't possible here. finish() may be called from any thread. processes: compile in worker
    processes (default: compile_workers.enabled()), whose compilers warm up for `target` (backend, arch, warp
    size; default: this process's GPU) while they boot."""
    mode_cls = async_compile_mode()
    if mode_cls is None:
        return None
    if processes is None:
        from model_loader.kernels import compile_workers

        processes = compile_workers.enabled()
    try:
        return CompilePool(mode_cls, workers or default_workers(), processes, target)
    except RuntimeError as err:  # "Another AsyncCompileMode is already active": compile as usual
        log.warning("not compiling ahead: %s", err)
        return None


@contextmanager
def compile_pool(workers: int | None = None, processes: bool | None = None):
    """Inside: every Triton compile goes to a pool of `workers` threads. Yields a CompilePool, or None where that
    isn't possible here (then compiles happen on the launching thread as usual). Leaving waits for every
    compile (if finish() was not called already). Compile errors are not raised here: a launch of that kernel
    meets them where they are handled today (a configuration this GPU can't run is skipped, a broken Triton
    falls back)."""
    pool = open_compile_pool(workers, processes)
    if pool is None:
        yield None
        return
    try:
        yield pool
    finally:
        pool.finish()


@contextmanager
def compile_only():
    """Inside (and inside compile_pool): launches through `launch` only submit their kernel's compile."""
    _state.active = True
    try:
        yield
    finally:
        _state.active = False
