"""The kernel store: what Triton would build on a user's machine, built ahead of time by the release build and
shipped in the bundle, so that the app needs no C compiler, and compiles no kernel the store holds, at run time.

Triton builds two kinds of thing on first use:
- C modules, with the system's C compiler and Python's headers: its driver utilities (`cuda_utils`) and, in
  Triton 3.6, a launcher per kernel signature. They depend on the platform and the Python version, not on the
  GPU. Without a compiler they can't be built, and without them no kernel runs: the reason a machine without
  `gcc` used to get only the plain PyTorch path.
- Kernels (cubins), with the `ptxas` inside Triton's wheel (no system compiler): a few seconds each, for one
  GPU architecture.

A store holds both, built by the same Triton as the bundle's:
    STORE.json            what it was built for (Triton, Python, platform, GPU architectures) and what it holds
    modules/<name>-<sha256 of its C source><Python extension suffix>    C modules, as Triton would build them
    cache/<key>/...       kernels, laid out as Triton's own file cache (its cache keys name the architecture)

At run time `activate()` points Triton at it, through Triton's own extension points: `knobs.cache.manager_class`
(a cache that also reads the store, read-only, and writes what it compiles to the user's cache) and, where no C
compiler exists, `knobs.build.impl` (C modules come from the store; one it lacks is an error that names it, which
the engine turns into its plain PyTorch path with a notice). A kernel the store lacks is compiled as before.

What goes into a store comes from records: the specialization Triton serializes before each compile (its
`jit_cache_hook`), taken while the engine warms up on a GPU (`recording()`, `r1desk-cli kernel-store record`).
`build()` compiles every record for every architecture asked for, without a GPU: a kernel's variant is decided by
its argument types, alignments and constexprs, which the record holds, and the target only by the architecture.
Variants the host code picks from the GPU itself (decode attention's split count from the SM count, programmatic
dependent launch on sm_90) are those of the GPU recorded; other GPUs compile theirs on first start (no C compiler
needed for that).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "R1DESK_KERNEL_STORE"  # the store's folder (packaging/launcher.py sets it to the bundle's)
STORE_FILE = "STORE.json"
FORMAT = 1
# The launch options a record's options may carry that are not the target's defaults; everything else (the
# architecture's own defaults, the path of Triton's libdevice) is re-derived for each target.
_PATH_OPTIONS = ("extern_libs",)


class StoreMiss(RuntimeError):
    """A C module Triton needs is not in the store, and there is no C compiler to build it."""


@dataclass(frozen=True)
class Record:
    """One kernel variant as Triton serialized it before compiling: the jit function (module, name), its
    specialization (Triton's JSON: signature, constexprs, attributes, options) and the target it was for."""

    module: str
    name: str
    specialization: str
    target: tuple  # (backend, arch, warp size)

    def to_json(self) -> str:
        return json.dumps(
            {
                "module": self.module,
                "name": self.name,
                "specialization": self.specialization,
                "target": list(self.target),
            }
        )

    @classmethod
    def from_json(cls, line: str) -> Record:
        d = json.loads(line)
        return cls(d["module"], d["name"], d["specialization"], tuple(d["target"]))

    def variant(self) -> tuple:
        """What decides the compiled kernel (not the launch key Triton keeps in memory)."""
        spec = dict(json.loads(self.specialization), key=None)
        return self.module, self.name, json.dumps(spec, sort_keys=True), self.target


def read_records(paths) -> list[Record]:
    records = []
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if line.strip():
                records.append(Record.from_json(line))
    return records


def write_records(records, path) -> None:
    unique = {r.variant(): r for r in records}
    Path(path).write_text("".join(r.to_json() + "\n" for r in unique.values()), encoding="utf-8")


# ---------------------------------------------------------------------------------------------- recording
@contextmanager
def recording(records: list, skip_compiles: bool = False):
    """Append a Record to `records` for every compile Triton starts of r1desk's kernels inside this block (on
    any thread). skip_compiles: record only; Triton compiles and launches nothing (a walk without a GPU)."""
    from triton import knobs

    previous = knobs.runtime.jit_cache_hook
    lock = threading.Lock()

    def hook(*, fn, compile, **rest):  # Triton's keyword names; the rest goes on to the hook before this one
        if fn.module.startswith("model_loader."):  # the jit_* modules, and the paged cache's kernels
            target = fn.jit_function.device_caches[compile["device"]][2]
            record = Record(
                fn.module, fn.name, compile["specialization_data"], (target.backend, target.arch, target.warp_size)
            )
            with lock:
                records.append(record)
        if skip_compiles:
            return True
        return previous(fn=fn, compile=compile, **rest) if previous is not None else None

    knobs.runtime.jit_cache_hook = hook
    try:
        yield records
    finally:
        knobs.runtime.jit_cache_hook = previous


class TargetOnlyDriver:
    """A Triton driver that only names a target: Triton specializes and compiles for it, and launches nothing
    (for walks and builds on a machine without that GPU, or without any)."""

    def __init__(self, arch: int, warp_size: int = 32):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, warp_size)

    def get_current_device(self):
        # Triton keeps a kernel's binder, target and compiled variants per device number: one per architecture,
        # so that a later target_only() for another one neither reuses nor overwrites them.
        return self.target.arch

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")


@contextmanager
def target_only(arch: int):
    """Triton compiles for sm_<arch> inside this block, whatever GPU (if any) this machine has."""
    from triton.runtime import driver

    previous = driver._active  # None until something asked for the real one
    driver.set_active(TargetOnlyDriver(arch))
    try:
        yield
    finally:
        driver._active = previous


# ---------------------------------------------------------------------------------------------- building
def options_for(record: Record, arch: int) -> dict:
    """The record's compile options for sm_<arch>: what was passed at the launch (what differs from the recorded
    target's defaults), the rest left to the new target's defaults, as a launch on that GPU would get them."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    recorded = json.loads(record.specialization)["options"]
    defaults = make_backend(GPUTarget(*record.target)).parse_options({}).__dict__
    explicit = {}
    for key, value in recorded.items():
        if key in _PATH_OPTIONS:
            continue
        value = _tuples(value)
        if key not in defaults or _tuples(_jsonable(defaults[key])) != value:
            explicit[key] = value
    return make_backend(GPUTarget(record.target[0], arch, record.target[2])).parse_options(explicit).__dict__


# What the host code turns off where programmatic dependent launch can't run (before Hopper): the kernels' PDL
# constexpr (features.pdl_launch_args) and decode attention's early-tile and late-launch variants
# (decode_attention.decode_attention_candidates), which only pay off with it.
_PDL_CONSTEXPRS = ("PDL", "EARLY_TILE", "LATE_LAUNCH")


def for_architecture(record: Record, arch: int) -> Record:
    """The record as the app launches it on sm_<arch>. Records come from a GPU that runs programmatic dependent
    launch (sm_90+), whose `griddepcontrol` instructions ptxas refuses before sm_90; there the same launch
    passes PDL=False, no launch_pdl and the plain decode attention, so that is the variant a store needs."""
    if arch >= 90:
        return record
    spec = json.loads(record.specialization)
    names = list(spec.get("signature", {}))
    values = list(spec.get("constant_vals", []))
    for i, key in enumerate(spec.get("constant_keys", [])):
        if len(key) == 1 and key[0] < len(names) and names[key[0]] in _PDL_CONSTEXPRS and values[i] is True:
            values[i] = False
    spec["constant_vals"] = values
    if spec.get("options", {}).get("launch_pdl"):
        spec["options"]["launch_pdl"] = False
    return Record(record.module, record.name, json.dumps(spec), record.target)


def compile_record(record: Record, arch: int):
    """Compile one record for sm_<arch> into the current Triton cache (knobs.cache.dir); the CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget

    from model_loader.kernels.compile_workers import rebuild_source

    src, _ = rebuild_source(record.module, record.name, record.specialization)
    return triton.compile(
        src, target=GPUTarget(record.target[0], arch, record.target[2]), options=options_for(record, arch)
    )


def build(records, archs, out, progress=None, workers: int | None = None) -> dict:
    """Build a store in `out` (emptied first): every record's kernel for every architecture in `archs` (e.g. 80,
    86, 89, 90, 120), compiled in `workers` processes (default: a CPU each, as host memory allows), and the C modules
    Triton builds for them on this platform (needs a C compiler; a machine without a GPU driver links against a
    stand-in libcuda, built here). Returns STORE.json's content."""
    from triton import __version__ as triton_version
    from triton import knobs
    from triton.runtime.cache import triton_key

    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    (out / "modules").mkdir(parents=True)
    cache = str(out / "cache")
    variants = list({r.variant(): r for r in records}.values())
    jobs = [
        (record, arch)
        for arch in archs
        for record in {v.variant(): v for v in (for_architecture(r, arch) for r in variants)}.values()
    ]
    pooled = len(jobs) > 1 and workers != 1
    errors = _compile_in_processes(jobs, cache, workers, progress) if pooled else {}
    kernels, failed = [], []
    saved_dir, saved_binary_only = knobs.cache.dir, knobs.compilation.store_binary_only
    try:
        knobs.cache.dir = cache
        knobs.compilation.store_binary_only = True  # the cubin and its metadata, not every stage's IR
        for n, (record, arch) in enumerate(jobs, 1):  # what the processes compiled is only loaded here
            error = errors.get(n - 1)
            if error is None:
                try:
                    kernels.append(compile_record(record, arch))
                except Exception as err:  # a kernel this architecture can't run (e.g. fp8 before sm_89)
                    error = f"{type(err).__name__}: {err}"[:300]
            if error is not None:
                failed.append({"kernel": record.name, "arch": arch, "error": error})
            if progress and not pooled:
                progress(n, len(jobs))
        modules: set[str] = set()
        if sys.platform.startswith("linux"):  # triton-windows builds them with the TinyCC it ships: nothing to do
            with tempfile.TemporaryDirectory(prefix="r1desk-store-modules-") as scratch:
                knobs.cache.dir = scratch  # C modules must be built here, not found in this machine's cache
                modules = _build_modules(kernels, out / "modules")
    finally:
        knobs.cache.dir, knobs.compilation.store_binary_only = saved_dir, saved_binary_only
    for lock in (out / "cache").rglob("lock"):  # Triton's per-entry lock files: nothing to lock in a bundle
        lock.unlink()
    info = {
        "format": FORMAT,
        "triton": triton_version,
        "python": sysconfig.get_config_var("EXT_SUFFIX"),
        "platform": _platform_key(),
        "archs": sorted(archs),
        "kernels": len(kernels),
        "variants": len(variants),
        "failed": failed,
        "modules": sorted(modules),
        "bytes": sum(p.stat().st_size for p in out.rglob("*") if p.is_file()),
        "triton_key": triton_key(),  # what every kernel's cache key here starts with (see adopt_triton_key)
    }
    (out / STORE_FILE).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return info


def _compile_in_processes(jobs, cache: str, workers: int | None, progress) -> dict[int, str]:
    """Compile the (record, arch) jobs into the cache in spawned processes; {job index: error} for those that
    failed. One compile is seconds of mostly single-threaded work, and a store is hundreds of them."""
    import multiprocessing
    from concurrent.futures import as_completed

    # its processes start without this one's __main__ (a script without a __main__ guard would run again)
    from model_loader.kernels.compile_workers import _LeanProcessPool, affordable_workers

    count = workers or max(1, affordable_workers(os.cpu_count() or 1))
    count = max(1, min(count, len(jobs)))
    errors: dict[int, str] = {}
    with _LeanProcessPool(max_workers=count, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_compile_job, cache, record.to_json(), arch): i for i, (record, arch) in enumerate(jobs)}
        for done, future in enumerate(as_completed(futures), 1):
            try:
                error = future.result()
            except Exception as err:  # the worker died: this process compiles that job again, and reports it
                error = None
                log.warning("a compile process failed (%s); compiling that kernel here", err)
            if error is not None:
                errors[futures[future]] = error
            if progress:
                progress(done, len(jobs))
    return errors


def _compile_job(cache: str, record_json: str, arch: int) -> str | None:
    """In a worker process: one record for one architecture into the store's cache; None, or why it failed."""
    from triton import knobs

    knobs.cache.dir = cache
    knobs.compilation.store_binary_only = True
    try:
        compile_record(Record.from_json(record_json), arch)
        return None
    except Exception as err:  # a kernel this architecture can't run (e.g. fp8 before sm_89)
        return f"{type(err).__name__}: {err}"[:300]


def _build_modules(kernels, dest: Path) -> set[str]:
    """Have Triton build the C modules it needs for these kernels (its driver utilities; a launcher per
    signature where it builds those) with this machine's compiler, and keep a copy of each in dest."""
    from triton import knobs
    from triton.backends.nvidia import driver as nvidia

    built: set[str] = set()
    build_lock = threading.Lock()

    def collect(name, src, srcdir, library_dirs, include_dirs, libraries):
        with build_lock:
            knobs.build.impl = None  # Triton's own build, exactly as on a user's machine with a compiler
            try:
                so = _triton_build(name, src, srcdir, library_dirs, include_dirs, libraries)
            finally:
                knobs.build.impl = collect
        stored = dest / module_file(name, Path(src).read_bytes())
        shutil.copyfile(so, stored)
        built.add(stored.name)
        return so

    with _libcuda_for_linking():
        knobs.build.impl = collect
        try:
            _try(lambda: nvidia.CudaUtils())
            launcher = getattr(nvidia, "CudaLauncher", None)
            for kernel in kernels:
                _try(lambda k=kernel: launcher(k.src, k.metadata))
        finally:
            knobs.build.impl = None
    if not any(n.startswith("cuda_utils-") for n in built):
        raise RuntimeError("Triton's cuda_utils module was not built: the store would still need a compiler")
    return built


def _triton_build(name, src, srcdir, library_dirs, include_dirs, libraries) -> str:
    import inspect

    from triton.runtime import build as triton_build

    params = inspect.signature(triton_build._build).parameters
    extra = {"ccflags": []} if "ccflags" in params else {}
    return triton_build._build(name, src, srcdir, library_dirs, include_dirs, libraries, **extra)


def _try(make) -> None:
    """Build by constructing: Triton then loads the module it built, which fails on a machine without a GPU
    driver (its symbols resolve against the real libcuda only); the module was kept before that."""
    try:
        make()
    except Exception as err:
        log.debug("loading a built module failed here (expected without a GPU driver): %s", err)


@contextmanager
def _libcuda_for_linking():
    """Triton links its modules against libcuda.so.1. Where the driver isn't installed (a build machine without
    a GPU), a stand-in with the same name lets the link record the dependency; the user's driver provides the
    real one when the module is loaded."""
    from triton import knobs
    from triton.backends.nvidia import driver as nvidia

    try:
        nvidia.libcuda_dirs()
        found = True
    except Exception:  # Triton asserts when it finds no libcuda.so.1
        found = False
    if found:
        yield
        return
    with tempfile.TemporaryDirectory(prefix="r1desk-libcuda-") as folder:
        make_libcuda_stub(Path(folder))
        saved = knobs.nvidia.libcuda_path
        knobs.nvidia.libcuda_path = folder
        try:
            yield
        finally:
            knobs.nvidia.libcuda_path = saved


def make_libcuda_stub(folder: Path) -> Path:
    """A libcuda.so.1 that defines every cu* function Triton's driver source calls, each failing with
    CUDA_ERROR_NO_DEVICE: enough to link Triton's modules, and to load them where no GPU driver is installed."""
    import re

    from triton.backends.nvidia import driver as nvidia

    source = Path(nvidia.__file__).with_name("driver.c").read_text(encoding="utf-8")
    names = sorted(
        set(re.findall(r"\b(cu[A-Z]\w*)\s*\(", source)) - {n for n in re.findall(r"\b(cu[A-Z]\w*_t)\b", source)}
    )
    folder.mkdir(parents=True, exist_ok=True)
    stub = folder / "libcuda_stub.c"
    stub.write_text("".join(f"int {n}(void) {{ return 100; }}\n" for n in names), encoding="utf-8")
    lib = folder / "libcuda.so.1"
    subprocess.run(
        [_compiler() or "cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(lib), str(stub)],
        check=True,
        capture_output=True,
    )
    return lib


def module_file(name: str, source: bytes) -> str:
    return f"{name}-{hashlib.sha256(source).hexdigest()}{sysconfig.get_config_var('EXT_SUFFIX')}"


# ---------------------------------------------------------------------------------------------- run time
_active: dict = {}


def active() -> Path | None:
    """The store Triton reads from in this process, if one is active."""
    return _active.get("store")


def default_store() -> Path | None:
    """$R1DESK_KERNEL_STORE, else the bundle's own store (kernel-store/ next to the frozen app's files)."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    bundled = Path(getattr(sys, "_MEIPASS", "")) / "kernel-store"
    return bundled if getattr(sys, "frozen", False) and bundled.is_dir() else None


def usable(store) -> str | None:
    """None where this process's Triton can use the store, else why not."""
    return _problem(_info(store))


def _problem(info: dict | str) -> str | None:
    """usable()'s answer from the store's STORE.json (or why it couldn't be read)."""
    if isinstance(info, str):
        return info
    import triton

    wanted = {
        "format": FORMAT,
        "triton": triton.__version__,
        "python": sysconfig.get_config_var("EXT_SUFFIX"),
        "platform": _platform_key(),
    }
    wrong = [f"{k} {info.get(k)!r} (here {v!r})" for k, v in wanted.items() if info.get(k) != v]
    return f"the kernel store was built for another {', '.join(wrong)}" if wrong else None


def _info(store) -> dict | str:
    """The store's STORE.json, or why it can't be read."""
    try:
        return json.loads((Path(store) / STORE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return f"no readable {STORE_FILE} in {store} ({type(err).__name__})"


def adopt_triton_key(recorded: str) -> None:
    """Make Triton's triton_key() the store's. Every kernel's cache key starts with it, and Triton derives it by
    hashing its own files, which in the bundle are not byte for byte the ones the store was built with, though the
    same Triton (usable() checked the version; the release build makes both from one environment): the spec strips
    libtriton's debug sections, and PyInstaller lays out its sources. Without this every store lookup of the frozen
    app misses and each kernel compiles at first start (docs/BENCHMARKS.md, "The kernel store")."""
    import triton.runtime.cache as cache

    def triton_key() -> str:
        return recorded

    cache.triton_key = triton_key  # get_cache_key() looks it up in its module at each call
    autotuner = sys.modules.get("triton.runtime.autotuner")  # imported it by name
    if autotuner is not None and hasattr(autotuner, "triton_key"):
        autotuner.triton_key = triton_key


def activate(store=None) -> str | None:
    """Make Triton read kernels and C modules from the store (default_store() when not given). Returns None when
    active (or when there is no store to use), else why the store can't be used. Call before the first compile."""
    store = Path(store) if store is not None else default_store()
    if store is None:
        return None
    if _active.get("store") == store:
        return None
    info = _info(store)  # read once: it says whether the store fits and holds the Triton key to adopt
    problem = _problem(info)
    if problem:
        log.warning("not using the kernel store: %s", problem)
        return problem
    from triton import knobs

    recorded = info.get("triton_key")
    if getattr(sys, "frozen", False) and recorded:  # (outside a bundle, Triton's files are the store's or newer)
        adopt_triton_key(recorded)
    knobs.cache.manager_class = _store_cache(store / "cache")
    if sys.platform.startswith("linux") and _compiler() is None:  # (Windows: triton-windows ships a compiler)
        knobs.build.impl = _ModulesFromStore(store / "modules")
    _active["store"] = store
    log.info("kernel store in use: %s (C modules from it: %s)", store, knobs.build.impl is not None)
    return None


def has_compiler() -> bool:
    return _compiler() is not None


def _compiler() -> str | None:
    # Triton's own order (triton.runtime.build._find_compiler): $CC, then gcc, then clang
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")


def carries_modules(store) -> bool:
    """Whether a store (not yet active) says it holds Triton's driver module for this platform and Python: read
    from its STORE.json alone, without importing Triton (the bundle's launcher asks before anything is loaded).
    activate() then also checks the Triton version."""
    try:
        info = json.loads((Path(store) / STORE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        info.get("format") == FORMAT
        and info.get("python") == sysconfig.get_config_var("EXT_SUFFIX")
        and info.get("platform") == _platform_key()
        and any(str(m).startswith("cuda_utils-") for m in info.get("modules", []))
    )


class _ModulesFromStore:
    """Triton's knobs.build.impl where no C compiler exists: the module of this name and source from the store."""

    def __init__(self, folder: Path):
        self.folder = folder

    def __call__(self, name, src, srcdir, library_dirs, include_dirs, libraries):
        stored = self.folder / module_file(name, Path(src).read_bytes())
        if not stored.is_file():
            raise StoreMiss(
                f"Triton needs its C module {name!r} for this kernel, which r1desk's kernel store lacks, and no C "
                "compiler was found to build it"
            )
        so = Path(srcdir) / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
        shutil.copyfile(stored, so)
        return str(so)


def _store_cache(folder: Path):
    """Triton's file cache (the user's, where new compiles go) that also finds what the read-only store holds.
    The store's group files name their members by the build machine's paths: found here by file name."""
    from triton.runtime.cache import FileCacheManager

    class StoreCache(FileCacheManager):
        def __init__(self, key, override=False, dump=False):
            super().__init__(key, override=override, dump=dump)
            self._stored_dir = None if (override or dump) else os.path.join(folder, key)

        def _stored(self, filename):
            if self._stored_dir is None:
                return None
            path = os.path.join(self._stored_dir, filename)
            return path if os.path.exists(path) else None

        def get_file(self, filename):
            return super().get_file(filename) or self._stored(filename)

        def get_group(self, filename):
            found = super().get_group(filename)
            if found is not None:
                return found
            group = self._stored(f"__grp__{filename}")
            if group is None:
                return None
            try:
                with open(group, encoding="utf-8") as f:
                    children = json.load(f)["child_paths"]
            except (OSError, ValueError, KeyError):
                return None
            result = {}
            for child, path in children.items():
                stored = self._stored(os.path.basename(path))
                if stored is None:
                    return None
                result[child] = stored
            return result

    return StoreCache


def _platform_key() -> str:
    # Not Triton's platform_key(): it asks the `file` command about the interpreter, and says less without it.
    return sysconfig.get_platform()


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))
