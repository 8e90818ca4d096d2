"""Compile a first start's Triton kernels in worker processes, so they really run at once.

Why: a Triton compile holds the GIL much of the time (code generation in Python, the bindings' calls), so the
compile pool's threads (precompile.CompilePool) mostly take turns, and they starve the threads that load the
weights and walk the shape twin beside them (16 threads compile far less than 16 times faster than one, and the
weights load several times slower beside the compiles than alone).

How: while a CompilePool with workers is open, Triton's `jit_cache_hook` (which Triton calls before every
compile, with the kernel's specialization in its own serialized form: signature, constexprs, attributes,
options) sends that specialization to a worker process. The worker rebuilds the same source from our torch-free
kernel modules (the jit_* modules: a worker starts in a fraction of a second) and compiles it into the same
on-disk Triton cache. The pool thread Triton hands the compile to waits for the worker, then runs Triton's
compile as before, which finds the cache entry and only loads it. So the result is exactly what a compile on the
thread would give; anything that goes wrong on the process side (a worker that can't start, a kernel it can't
rebuild, a different cache key) only means the thread compiles that kernel itself, as it did before workers.

Workers are spawned (never forked: the app has threads), booted at once so they start while the weights load,
and stopped when the pool finishes; they never import the app's own main module (_main_module_hidden). On by
default (R1DESK_COMPILE_PROCESSES=0 turns them off; see enabled() for why), as many as free host memory allows,
never in a frozen app (the bundle): its spawned children start through the bundle's own executable, not tried
with a GPU.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import types
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager

log = logging.getLogger(__name__)

# The only modules a worker imports kernels from: they import Triton and nothing else.
WORKER_MODULES = (
    "model_loader.kernels.jit_common",
    "model_loader.kernels.jit_small_ops",
    "model_loader.kernels.jit_decode_attention",
    "model_loader.kernels.jit_prefill_attention",
    "model_loader.kernels.jit_gemv",
    "model_loader.kernels.jit_int4",
    "model_loader.kernels.jit_sampler",
)


def enabled() -> bool:
    """Worker processes for compiling: on, unless R1DESK_COMPILE_PROCESSES is 0 / false / no / off, and never in
    a frozen bundle (its spawned children start through the bundle's own executable, not tried with a GPU).

    On by default because, interleaved with the threads on one machine, the workers measure faster to ready in most
    pairs (bf16 and 4-bit): without the GIL contention the twin's walk and the weights finish sooner, while the
    compiles end a little later (each worker pays Triton's start-up). That holds only with _source_hash: without it
    two of the sampler's kernels come back from the workers under another cache key and are compiled again on a
    thread, and the workers lose to the threads."""
    off = os.environ.get("R1DESK_COMPILE_PROCESSES", "").strip().lower() in ("0", "false", "no", "off")
    from model_loader.kernels import kernel_store

    # with a kernel store, a worker (which reads only the disk cache) would compile what the store already holds
    return not getattr(sys, "frozen", False) and not off and kernel_store.active() is None


WORKER_BYTES = 400 * 2**20  # host memory to leave per worker: a warm worker takes well under it, more while compiling
UNKNOWN_MEMORY_WORKERS = 8  # memory unreadable; 8 do as well as 16 (docs/BENCHMARKS.md, 'Tried and rejected')


def affordable_workers(wanted: int) -> int:
    """How many of `wanted` workers the available host memory allows: Linux's MemAvailable (free memory plus
    what the page cache would give back: a machine that just read a model file has little *free* memory),
    within this process's cgroup limit where there is one. Elsewhere at most UNKNOWN_MEMORY_WORKERS."""
    available = available_host_memory()
    if available is None:
        return min(wanted, UNKNOWN_MEMORY_WORKERS)
    return max(0, min(wanted, available // WORKER_BYTES))


def available_host_memory(cgroup: str = "/sys/fs/cgroup") -> int | None:
    """Bytes of host memory a new process could use without swapping (context.host_memory: MemAvailable on Linux),
    within a cgroup v2 limit where there is one; None where the system doesn't say."""
    from model_loader.context import host_memory

    available, _ = host_memory()
    if available is None:
        return None
    try:  # cgroup v2 (a container, a systemd slice): what is left under its limit
        with open(os.path.join(cgroup, "memory.max")) as f:
            limit = f.read().strip()
        with open(os.path.join(cgroup, "memory.current")) as f:
            used = int(f.read().strip())
        if limit != "max":
            available = min(available, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return available


# ---------------------------------------------------------------------------------------------- worker side
def _boot(cache_dir: str, target: tuple | None) -> dict:
    """Runs first in each worker: import what compiles need, check the worker sees the parent's cache, and warm
    its compiler for the device's target (when known)."""
    import importlib

    from triton import knobs

    for module in WORKER_MODULES:
        importlib.import_module(module)
    if os.path.realpath(knobs.cache.dir) != os.path.realpath(cache_dir):
        raise RuntimeError(f"the worker's Triton cache is {knobs.cache.dir}, not {cache_dir}")
    # multiprocessing names the parent's main module __mp_main__ where it imported it (a file or a module); else
    # that name is this process's own bootstrap, which has neither
    parents_main = sys.modules.get("__mp_main__")
    imported = any(getattr(parents_main, name, None) is not None for name in ("__file__", "__spec__"))
    return {"pid": os.getpid(), "warm_s": _warm_compiler(target) if target else None, "main_imported": imported}


def _warm_compiler(target: tuple) -> float | None:
    """Compile one small kernel for the target into a throw-away cache; the seconds it took, None if it failed.
    A process's first Triton compile also pays the compiler's one-time start-up (its backend, the MLIR context,
    the first ptxas run), which makes the workers' compiles add up to more than the same compiles on the threads
    of one warm process. Done while the worker boots, that start-up overlaps the weight load instead of delaying
    the first kernel the warm-up waits for. It measured at about a second a worker, and the workers' total compile
    time did not visibly drop; kept, as the start-up is paid while the weights load either way."""
    import tempfile
    import time

    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from model_loader.kernels import jit_small_ops

    t0 = time.perf_counter()
    shared = knobs.cache.dir
    try:
        with tempfile.TemporaryDirectory(prefix="r1desk-warm-") as scratch:
            knobs.cache.dir = scratch  # nothing of this lands in the real cache
            try:
                triton.compile(
                    ASTSource(
                        jit_small_ops._add_rms_norm_kernel,
                        {
                            "x_ptr": "*bf16",
                            "res_ptr": "*bf16",
                            "w_ptr": "*bf16",
                            "out_ptr": "*bf16",
                            "n_cols": "i32",
                            "eps": "fp32",
                            "HAS_RES": "constexpr",
                            "BLOCK": "constexpr",
                            "PDL": "constexpr",
                        },
                        {(6,): True, (7,): 256, (8,): False},
                    ),
                    target=GPUTarget(*target),
                    options={"num_warps": 4},
                )
            finally:
                knobs.cache.dir = shared
    except Exception as err:  # only a head start lost: the real compiles report their own problems
        log.debug("warming the compiler failed: %s: %s", type(err).__name__, err)
        return None
    return time.perf_counter() - t0


def _compile(
    module: str,
    name: str,
    specialization: str,
    target: tuple,
    source_hash: str | None = None,
    sources: str | None = None,
) -> tuple[str, float]:
    """Compile one kernel variant into the Triton cache; returns its cache key (CompiledKernel.hash) and the
    seconds it took. source_hash: the parent's hash of the same source (see _source_hash), used only where this
    process read the same kernel sources as the parent (`sources`: kernel_sources()), not a file changed since."""
    import time

    import triton
    from triton.backends.compiler import GPUTarget

    t0 = time.perf_counter()
    src, options = rebuild_source(module, name, specialization)
    if source_hash is not None and sources == kernel_sources():
        src.hash = lambda: source_hash  # the key the parent will look for (_source_hash says why)
    kernel = triton.compile(src, target=GPUTarget(*target), options=options)
    return kernel.hash, time.perf_counter() - t0


_sources_digest: list[str] = []


def kernel_sources() -> str:
    """A digest of every Triton function's source in WORKER_MODULES as this process imported them."""
    if not _sources_digest:
        import hashlib
        import importlib

        from triton.runtime.jit import JITFunction

        digest = hashlib.sha256()
        for module in WORKER_MODULES:
            for name, value in sorted(vars(importlib.import_module(module)).items()):
                if isinstance(value, JITFunction):
                    digest.update(f"{module}.{name}\n{value.src}\n".encode())
        _sources_digest.append(digest.hexdigest())
    return _sources_digest[0]


def rebuild_source(module: str, name: str, specialization: str):
    """(ASTSource, options) for a compile, rebuilt from Triton's serialized specialization the way
    JITFunction.preload does, without a GPU."""
    import importlib

    import triton.language as tl
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(module), name)
    spec = json.loads(specialization)
    constexprs = {
        tuple(key): tl.dtype(value)
        if tl.dtype.is_dtype(value)
        else tl.constexpr(_tuples(value["constexpr"]))
        if isinstance(value, dict) and "constexpr" in value
        else _tuples(value)
        for key, value in zip(spec["constant_keys"], spec["constant_vals"])
    }
    attrs = {tuple(key): value for key, value in zip(spec["attrs_keys"], spec["attrs_vals"])}
    signature = {key: _tuples(value) for key, value in spec["signature"].items()}
    options = {key: tuple(value) if isinstance(value, list) else value for key, value in spec["options"].items()}
    return ASTSource(fn, signature, constexprs, attrs), options


def _source_hash(module: str, name: str, specialization: str) -> str | None:
    """The parent's hash of a kernel variant's source, for the worker to file its result under. Triton up to 3.6
    hashes a kernel with the helpers it calls in an order that depends on what the process hashed before and on
    its module dictionaries' addresses (fixed upstream in triton-lang/triton#10494): two of the sampler's five
    kernels come out with another key in every worker than in the app, so the app would compile them again. The
    source is the same file in both processes, so the parent's hash names the same kernel."""
    try:
        return rebuild_source(module, name, specialization)[0].hash()
    except Exception as err:  # the worker hashes it itself: at worst that kernel is compiled twice, as before
        log.debug("no source hash for %s (%s: %s)", name, type(err).__name__, err)
        return None


def _tuples(value):
    # JSON turns tuples (nested signatures) into lists; a kernel signature never holds a list.
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


# ---------------------------------------------------------------------------------------------- parent side
class WorkerCompiler:
    """A pool of spawned worker processes that compile into this process's Triton cache."""

    def __init__(self, workers: int, target: tuple | None = None):
        """target: (backend, arch, warp size) of the GPU the kernels are for, which the workers warm their
        compilers for; None: this process's GPU, if Triton sees one."""
        import multiprocessing

        from triton import knobs

        self.cache_dir = knobs.cache.dir
        self.executor = _LeanProcessPool(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
        self.workers = workers
        self.broken = False
        try:
            target = target or _current_target()
            # Boot every worker now (a job each: the pool starts a process per job while none is idle), while the
            # weights load.
            self.booted = [self.executor.submit(_boot, self.cache_dir, target) for _ in range(workers)]
        except BaseException:
            self.executor.shutdown(wait=False, cancel_futures=True)
            raise
        self.submitted = 0
        self._started: dict[tuple, Future] = {}  # one job per kernel variant (see submit)

    def submit(self, module: str, name: str, specialization: str, target: tuple) -> Future | None:
        failed = (
            None
            if self.broken
            else next((f.exception() for f in self.booted if f.done() and f.exception() is not None), None)
        )
        if failed is not None:  # a worker could not start, or sees another Triton cache: results would be lost
            self.broken = True
            log.warning("compile workers unusable (%s: %s); compiling on threads", type(failed).__name__, failed)
        if self.broken:
            return None
        # A walk launches each variant many times (every layer, every path) and Triton asks again each time,
        # as its in-memory cache is only filled when the async compiles are finalized: one job per variant.
        # What decides the variant (and Triton's cache key) is the specialization without its launch key.
        variant = dict(json.loads(specialization), key=None)
        dedup = (module, name, json.dumps(variant, sort_keys=True), target)
        if dedup in self._started:
            return self._started[dedup]
        try:
            self.submitted += 1
            self._started[dedup] = future = self.executor.submit(
                _compile,
                module,
                name,
                specialization,
                target,
                _source_hash(module, name, specialization),
                kernel_sources(),
            )
            return future
        except Exception as err:  # the pool broke (a worker died): the threads compile from here on
            self.broken = True
            log.warning("compile workers unavailable (%s: %s); compiling on threads", type(err).__name__, err)
            return None

    @property
    def warm_s(self) -> list[float | None]:
        """Each booted worker's compiler warm-up in seconds (None: not warmed)."""
        return [f.result()["warm_s"] for f in self.booted if f.done() and f.exception() is None]

    @property
    def mains_imported(self) -> int:
        """Booted workers that imported the parent's __main__ (none should: _main_module_hidden)."""
        return sum(bool(f.result().get("main_imported")) for f in self.booted if f.done() and f.exception() is None)

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


_main_lock = threading.RLock()


@contextmanager
def _main_module_hidden():
    """A spawned child imports the parent's __main__ before its first job (the window's module pulls in Qt; a
    script may pull in torch): every worker would pay for that in time and memory, and a module without a
    __main__ guard would run again. The workers need only Triton and our kernel modules, so while a process
    starts multiprocessing sees a bare __main__ (it reads sys.modules["__main__"] in Process.start). Other
    threads see it too for those few milliseconds; nothing of ours reads __main__."""
    with _main_lock:
        missing = object()
        main = sys.modules.get("__main__", missing)
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            if main is missing:
                del sys.modules["__main__"]
            else:
                sys.modules["__main__"] = main


class _LeanProcessPool(ProcessPoolExecutor):
    """A ProcessPoolExecutor whose processes start without the parent's __main__ (_main_module_hidden), whichever
    submit() starts them (CPython 3.9-3.13 start one in submit() when no worker is idle)."""

    def _spawn_process(self):
        with _main_module_hidden():
            return super()._spawn_process()


def _current_target() -> tuple | None:
    try:
        from triton.runtime import driver

        target = driver.active.get_current_target()
        return (target.backend, target.arch, target.warp_size)
    except Exception:  # no GPU here (a CPU machine): the workers start cold
        return None


# Triton's hook is one per process; the CompilePools that use workers register here, found by their thread's
# active AsyncCompileMode (Triton's async mode is per thread).
_pools: dict[int, object] = {}  # id(AsyncCompileMode) -> precompile.CompilePool
_lock = threading.Lock()
_previous_hook = None
_state = threading.local()  # .pending: the worker future of the compile this thread is about to submit


def register(pool) -> None:
    """Route the compiles submitted under pool.mode to pool.workers (installs Triton's hook on first use)."""
    global _previous_hook
    from triton import knobs

    with _lock:
        if not _pools:
            _previous_hook = knobs.runtime.jit_cache_hook
            knobs.runtime.jit_cache_hook = _hook
        _pools[id(pool.mode)] = pool


def unregister(pool) -> None:
    global _previous_hook
    from triton import knobs

    with _lock:
        if _pools.pop(id(pool.mode), None) is not None and not _pools:
            if knobs.runtime.jit_cache_hook is _hook:
                knobs.runtime.jit_cache_hook = _previous_hook
            _previous_hook = None


def take_pending() -> Future | None:
    """The worker future started for the compile this thread submits next (precompile's executor asks)."""
    pending = getattr(_state, "pending", None)
    _state.pending = None
    return pending


def _hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled, **extra):  # Triton's keyword names
    """Triton's jit_cache_hook: called on the compiling thread right before Triton submits the compile to this
    thread's async mode. Starts the same compile in a worker; returns None so that Triton goes on as usual."""
    _state.pending = None
    previous = _previous_hook
    if previous is not None:
        result = previous(
            key=key,
            repr=repr,
            fn=fn,
            compile=compile,
            is_manual_warmup=is_manual_warmup,
            already_compiled=already_compiled,
            **extra,
        )
        if result:
            return result
    try:
        from triton.runtime import _async_compile

        pool = _pools.get(id(_async_compile.active_mode.get()))
        if pool is None or pool.workers is None or fn.module not in WORKER_MODULES:
            return None
        target = fn.jit_function.device_caches[compile["device"]][2]
        _state.pending = pool.workers.submit(
            fn.module, fn.name, compile["specialization_data"], (target.backend, target.arch, target.warp_size)
        )
    except Exception as err:  # an internal API: never let it stop the compile it was meant to speed up
        log.debug("not compiling %s in a worker (%s: %s)", getattr(fn, "name", "?"), type(err).__name__, err)
    return None
