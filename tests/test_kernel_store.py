"""The kernel store (model_loader.kernels.kernel_store): built on a machine without a GPU for GPU architectures it
doesn't have, then used in a fresh process with no C compiler on PATH and, as in the bundle, Triton's files hashing
otherwise than where the store was built, where every kernel it holds and Triton's C driver module come from it,
and a compile of anything is an error (so the test fails if anything is built at run time). Then the parts on their
own: records, the options re-derived per architecture, what makes a store unusable, the message for a C module it
lacks, and the bundle's launcher leaving Triton on when its store carries the modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINUX = sys.platform.startswith("linux")

# Both sides record the same launches: an RMS norm (bf16 and fp32 rows) and a residual add-norm, as the
# decode step launches them, each for a GPU this machine doesn't have (TargetOnlyDriver: nothing runs); with
# programmatic dependent launch where the GPU has it (sm_90+: records come from such a GPU), without before.
LAUNCHES = """
import torch
from model_loader.kernels import features, small_ops

def launches(arch):
    features._PDL_OK[torch.device("cpu")] = arch >= 90  # what pdl_supported finds on such a GPU
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.zeros(2, 1536, dtype=dtype)
        w = torch.ones(1536, dtype=dtype)
        small_ops.rms_norm(x, w, 1e-6)
        small_ops.add_rms_norm(x, x.clone(), w, 1e-6)
"""

BUILD = (
    LAUNCHES
    + """
import json, sys
from pathlib import Path
from model_loader.kernels import kernel_store

records = []
with kernel_store.target_only(90), kernel_store.recording(records, skip_compiles=True):
    launches(90)
kernel_store.write_records(records, sys.argv[1] + "/records.jsonl")
info = kernel_store.build(  # in two compile processes, as on a many-core build machine
    kernel_store.read_records([sys.argv[1] + "/records.jsonl"]), [80, 90], sys.argv[1] + "/store", workers=2
)
kernel_store.make_libcuda_stub(Path(sys.argv[1]) / "driver")  # the user's NVIDIA driver, for loading modules
print(json.dumps(info))
"""
)

USE = (
    LAUNCHES
    + """
import ctypes, json, os, shutil, sys
from model_loader.kernels import kernel_store, precompile

assert not any(shutil.which(cc) for cc in ("cc", "gcc", "clang")) and "CC" not in os.environ
ctypes.CDLL(sys.argv[1] + "/driver/libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
# as in the bundle: the same Triton, whose own files hash otherwise there (its library stripped of debug sections,
# its sources laid out by PyInstaller), and every kernel's cache key starts with that hash
import triton.runtime.cache as triton_cache
sys.frozen = True
triton_cache.triton_key = lambda: "the bundle's hash of Triton's files"
assert kernel_store.activate(sys.argv[1] + "/store") is None

import triton.backends.nvidia.compiler as nvidia_compiler

def compiled_at_run_time(*args, **kwargs):
    raise AssertionError("a kernel was compiled at run time")

nvidia_compiler.CUDABackend.add_stages = compiled_at_run_time  # what every real compile goes through
result = {}
for arch in (80, 90):
    with kernel_store.target_only(arch), precompile.compile_only():
        launches(arch)  # warm-ups: Triton binds and compiles (finds) each variant, launches nothing
    result[f"sm{arch}"] = "from the store"

from triton.backends.nvidia.driver import CudaUtils

result["cuda_utils"] = CudaUtils().load_binary.__name__  # built and loaded: no compiler here

try:  # an architecture the store doesn't hold compiles (and here fails)
    with kernel_store.target_only(86), precompile.compile_only():
        launches(86)
    result["sm86"] = "no compile?"
except AssertionError as err:
    result["sm86"] = str(err)

from triton.runtime.build import compile_module_from_src

try:  # a C module the store doesn't hold, with no compiler to build it
    compile_module_from_src("int r1desk_unknown;", "not_in_the_store")
    result["unknown_module"] = "built?"
except kernel_store.StoreMiss as err:
    result["unknown_module"] = str(err)
print(json.dumps(result))
"""
)


def _run(code: str, folder: Path, env: dict) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), str(folder)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not LINUX, reason="the store's C modules are built by the release build of each platform")
def test_a_store_built_without_a_gpu_serves_every_kernel_and_module_with_no_compiler(tmp_path):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON_", "R1DESK_"))}  # no interpreter
    build_env = dict(base, TRITON_CACHE_DIR=str(tmp_path / "build-cache"))
    info = _run(BUILD, tmp_path, build_env)
    assert info["archs"] == [80, 90] and info["kernels"] == 2 * info["variants"] and info["variants"] >= 3
    assert info["failed"] == []
    # Triton's driver module, and where Triton builds a launcher per kernel signature (3.6 and older), those too
    assert sorted({m.split("-")[0] for m in info["modules"]} - {"__triton_launcher"}) == ["cuda_utils"]
    assert 0 < info["bytes"] < 20 * 2**20
    assert info["triton_key"].startswith(info["triton"])  # Triton's hash of its own files, for the bundle

    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    user_env = dict(
        base,
        PATH=str(empty_bin),  # no cc, gcc or clang
        TRITON_CACHE_DIR=str(tmp_path / "user-cache"),  # a new user's: empty
        TRITON_LIBCUDA_PATH=str(tmp_path / "driver"),
        HOME=str(tmp_path / "home"),
    )
    result = _run(USE, tmp_path, user_env)
    assert result["sm80"] == result["sm90"] == "from the store"
    assert result["cuda_utils"] == "load_binary"
    assert result["sm86"] == "a kernel was compiled at run time"  # the check does catch a compile
    assert "not_in_the_store" in result["unknown_module"] and "no C compiler" in result["unknown_module"]
    # nothing was compiled into the user's cache: the store was only read
    assert not list((tmp_path / "user-cache").rglob("*.cubin"))


def test_records_round_trip_and_one_variant_is_kept_once(tmp_path):
    from model_loader.kernels.kernel_store import Record, read_records, write_records

    spec = {"name": "k", "signature": {"x": "*bf16"}, "options": {"num_warps": 4}, "key": "launch-1"}
    first = Record("model_loader.kernels.jit_small_ops", "k", json.dumps(spec), ("cuda", 90, 32))
    again = Record(first.module, "k", json.dumps(dict(spec, key="launch-2")), ("cuda", 90, 32))  # same variant
    other = Record(first.module, "k", json.dumps(dict(spec, options={"num_warps": 8})), ("cuda", 90, 32))
    write_records([first, again, other], tmp_path / "r.jsonl")
    assert read_records([tmp_path / "r.jsonl"]) == [again, other]
    assert first.variant() == again.variant() != other.variant()


def test_options_are_the_launchs_own_and_each_targets_defaults():
    from model_loader.kernels.kernel_store import Record, options_for
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    recorded = make_backend(GPUTarget("cuda", 90, 32)).parse_options({"num_warps": 8, "num_stages": 2}).__dict__
    recorded = json.loads(json.dumps(recorded))  # as the record holds them
    recorded["extern_libs"] = [["libdevice", "/the/recording/machine/libdevice.10.bc"]]
    record = Record("m", "k", json.dumps({"options": recorded}), ("cuda", 90, 32))
    sm90 = options_for(record, 90)
    assert sm90 == make_backend(GPUTarget("cuda", 90, 32)).parse_options({"num_warps": 8, "num_stages": 2}).__dict__
    sm80 = options_for(record, 80)
    assert sm80 == make_backend(GPUTarget("cuda", 80, 32)).parse_options({"num_warps": 8, "num_stages": 2}).__dict__
    assert sm80["arch"] == "sm80" and sm80["extern_libs"] != recorded["extern_libs"]  # this machine's libdevice


def _store(folder: Path, **overrides) -> Path:
    import sysconfig

    import triton

    info = {
        "format": 1,
        "triton": triton.__version__,
        "python": sysconfig.get_config_var("EXT_SUFFIX"),
        "platform": sysconfig.get_platform(),
        "modules": ["cuda_utils-abc.so"],
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "STORE.json").write_text(json.dumps({**info, **overrides}))
    return folder


def test_a_store_for_another_triton_python_or_platform_is_refused_with_the_reason(tmp_path):
    from model_loader.kernels import kernel_store

    assert kernel_store.usable(_store(tmp_path / "ok")) is None and kernel_store.carries_modules(tmp_path / "ok")
    problem = kernel_store.usable(_store(tmp_path / "old", triton="3.1.0"))
    assert "triton '3.1.0'" in problem and "built for another" in problem
    assert "python '.cpython-39" in kernel_store.usable(_store(tmp_path / "py", python=".cpython-39-x.so"))
    assert not kernel_store.carries_modules(_store(tmp_path / "win", platform="win-amd64"))
    assert not kernel_store.carries_modules(_store(tmp_path / "kernels-only", modules=[]))
    assert "no readable STORE.json" in kernel_store.usable(tmp_path / "missing")
    assert kernel_store.activate(tmp_path / "old") == problem  # refused, and nothing switched on
    assert kernel_store.active() is None


def test_the_store_cache_finds_a_kernel_by_its_files_names_wherever_the_store_was_built(tmp_path, monkeypatch):
    from triton import knobs

    from model_loader.kernels.kernel_store import _store_cache

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "user"))
    monkeypatch.delitem(knobs.cache.__dict__, "dir", raising=False)  # a value set in Python would win over the env
    entry = tmp_path / "store" / "KEY"
    entry.mkdir(parents=True)
    for name in ("k.cubin", "k.json"):
        (entry / name).write_text(name)
    children = {name: f"/build/machine/cache/KEY/{name}" for name in ("k.cubin", "k.json")}
    (entry / "__grp__k.json").write_text(json.dumps({"child_paths": children}))
    cache = _store_cache(tmp_path / "store")("KEY")
    assert cache.get_group("k.json") == {n: str(entry / n) for n in children}
    assert cache.get_file("k.cubin") == str(entry / "k.cubin")
    assert cache.get_file("other.cubin") is None
    (entry / "k.cubin").unlink()  # a group with a member missing is no hit (Triton then compiles)
    assert cache.get_group("k.json") is None
    written = cache.put(b"new", "n.cubin")  # what is compiled goes to the user's cache, never into the store
    assert written.startswith(str(tmp_path / "user"))


def test_a_module_the_store_lacks_names_itself_and_what_is_missing(tmp_path):
    from model_loader.kernels.kernel_store import StoreMiss, _ModulesFromStore, module_file

    src = tmp_path / "launcher.c"
    src.write_text("int x;")
    modules = tmp_path / "modules"
    modules.mkdir()
    with pytest.raises(StoreMiss, match="'__triton_launcher'.*no C compiler"):
        _ModulesFromStore(modules)("__triton_launcher", str(src), str(tmp_path), [], [], [])
    (modules / module_file("__triton_launcher", b"int x;")).write_bytes(b"ELF")
    (tmp_path / "src").mkdir()  # Triton's build folder for it
    built = _ModulesFromStore(modules)("__triton_launcher", str(src), str(tmp_path / "src"), [], [], [])
    assert Path(built).read_bytes() == b"ELF" and Path(built).parent == tmp_path / "src"


@pytest.mark.skipif(not LINUX, reason="the bundle's launcher checks for a C compiler on Linux")
def test_the_launcher_leaves_triton_on_when_the_bundle_carries_the_modules(tmp_path, monkeypatch):
    from test_packaging import _launcher

    launcher = _launcher()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no gcc, no clang
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("R1DESK_NO_TRITON", raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    _store(tmp_path / "kernel-store")
    launcher.prepare_frozen_environment()
    assert "R1DESK_NO_TRITON" not in os.environ
    _store(tmp_path / "kernel-store", modules=[])  # a store of kernels only: Triton would still need a compiler
    launcher.prepare_frozen_environment()
    assert os.environ["R1DESK_NO_TRITON"] == "no-compiler"


def test_a_frozen_triton_finds_its_backends_without_package_metadata(tmp_path, monkeypatch):
    """Triton finds its GPU backends through its package's entry points, which a bundle may lack (PyInstaller's hook
    for Triton doesn't collect them): then it sees no driver and the app falls back to PyTorch. The launcher has it
    list its backends folder instead, which this Triton honours."""
    from test_packaging import _launcher

    code = """
import importlib.metadata as metadata, json
metadata.entry_points = lambda **kwargs: metadata.EntryPoints([])  # a bundle without Triton's metadata
from triton.backends import backends
print(json.dumps(sorted(backends)))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_BACKENDS_IN_TREE"}

    def backends(extra: dict) -> list:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**env, **extra})
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    assert backends({}) == []  # what the first frozen run on a GPU met: "0 active drivers"
    for name in ("TRITON_BACKENDS_IN_TREE", "R1DESK_NO_TRITON", "MPLCONFIGDIR"):  # what it sets, restored after
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    _launcher().prepare_frozen_environment()
    assert "nvidia" in backends({"TRITON_BACKENDS_IN_TREE": os.environ["TRITON_BACKENDS_IN_TREE"]})
