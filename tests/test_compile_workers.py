"""A first start's kernels compile in worker processes (model_loader.kernels.compile_workers), and what the
pool's threads then get is the worker's result, read from the Triton cache rather than compiled again.

No GPU is needed: Triton compiles for a given target (sm_86 here) on any machine. The test drives Triton's own
JIT compile entry (JITFunction._do_compile, what a kernel launch calls on a cache miss) under the engine's
CompilePool, so Triton's hook, its async compile mode and its cache are the real ones; only the device's target
is given rather than read from a GPU. It runs in a fresh interpreter without TRITON_INTERPRET (the CPU tests'
interpreter patches Triton's language module, after which its compiler no longer works in that process)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = r"""
import json, sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, CompiledKernel, make_backend
from triton.compiler import compile as compile_kernel

from model_loader.kernels import jit_int4, jit_small_ops, precompile

target = GPUTarget("cuda", 86, 32)
backend = make_backend(target)
ALIGNED = [["tt.divisibility", 16]]


@triton.jit
def _not_in_a_worker_module(x_ptr, BLOCK: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, BLOCK), tl.zeros([BLOCK], tl.float32))


def compile_through_triton(fn, signature, constexprs, attrs, num_warps=4, launch="first"):
    # What JITFunction.run does on a cache miss, with the device's target given instead of read from a GPU (the
    # attributes JITFunction.create_binder sets on a first launch, then its compile entry).
    if 0 not in fn.device_caches or not isinstance(fn.device_caches[0][0], dict):
        fn.device_caches[0] = ({}, {}, target, backend, None)
    fn.CompiledKernel, fn.compile, fn.ASTSource = CompiledKernel, compile_kernel, ASTSource
    key = (launch, tuple(signature.values()))
    fn._do_compile(key, signature, 0, constexprs, backend.parse_options({"num_warps": num_warps}), attrs,
                   warmup=True)
    return fn.device_caches[0][0]


def main():
    # What Triton up to 3.6 does to some kernels (triton-lang/triton#10494; on the H200 two of the sampler's): this
    # process hashes a kernel's source differently from a fresh one (JITFunction.hash is where it keeps its own;
    # set here, in main(), which the spawned workers do not run). A worker must still file its result under this
    # process's key, or the thread compiles the kernel again.
    jit_small_ops._silu_mul_kernel.hash = "a-source-hash-no-fresh-process-computes"
    pool = precompile.open_compile_pool(workers=int(sys.argv[1]), processes=True,
                                        target=(target.backend, target.arch, target.warp_size))
    assert pool is not None and pool.in_processes, "no worker processes"
    for booted in pool.workers.booted:  # every worker warmed its compiler for the target before any job
        booted.result()
    silu = (jit_small_ops._silu_mul_kernel, {"x_ptr": "*bf16", "out_ptr": "*bf16", "n_cols": "i32",
                                             "BLOCK": "constexpr", "PAIRED": "constexpr", "PDL": "constexpr"},
            {(3,): 8192, (4,): False, (5,): False},
            {(0,): ALIGNED, (1,): ALIGNED})
    caches = [
        compile_through_triton(*silu),
        compile_through_triton(jit_small_ops._add_rms_norm_kernel,
                               {"x_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16",
                                "n_cols": "i32", "eps": "fp32", "HAS_RES": "constexpr", "BLOCK": "constexpr",
                                "PDL": "constexpr"}, {(6,): True, (7,): 2048, (8,): False},
                               {(0,): ALIGNED, (1,): ALIGNED, (2,): ALIGNED, (3,): ALIGNED}),
        compile_through_triton(jit_int4._int4_dequantize_kernel,
                               {"qw_ptr": "*i32", "s_ptr": "*bf16", "z_ptr": "*bf16", "w_ptr": "*bf16", "N": "i32",
                                "K": "i32", "GROUPS": "i32", "GROUP": "constexpr", "IB": "constexpr",
                                "BLOCK_N": "constexpr", "GATE_UP_PAIRS": "constexpr"},
                               {(7,): 128, (8,): 16, (9,): 32, (10,): False},
                               {(0,): ALIGNED, (1,): ALIGNED, (2,): ALIGNED, (3,): ALIGNED}),
        compile_through_triton(_not_in_a_worker_module, {"x_ptr": "*fp32", "BLOCK": "constexpr"}, {(1,): 64},
                               {(0,): ALIGNED}),
    ]
    # The same variant asked for again under another launch key (a walk launches each variant in every layer,
    # and Triton asks again until its async compiles are finalized): no second job for the workers.
    compile_through_triton(*silu, launch="again")
    pool.finish()
    stats = pool.worker_stats
    # the engine adds up the stats of a first start's two pools (beside the load, then the warm-up)
    stats["all_numbers"] = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in stats.values())
    # (a launch key Triton saw while the compile was under way may hold a FutureKernel: it resolves on use)
    resolved = lambda k: k.result() if hasattr(k, "result") else k  # noqa: E731
    stats["compiled_kernels"] = sorted({id(cache): [type(resolved(k)).__name__ for k in cache.values()]
                                        for cache in caches}.values())
    stats["hook_left_installed"] = triton.knobs.runtime.jit_cache_hook is not None
    stats["cache_entries"] = sorted(p.name for p in __import__("pathlib").Path(triton.knobs.cache.dir).glob("*/*.json")
                                    if not p.name.startswith("__grp__"))
    print(json.dumps(stats))


if __name__ == "__main__":  # (spawned workers must not even import this file: main_imported below)
    main()
"""


def _run(tmp_path, workers: int = 2) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    script = tmp_path / "compile_in_workers.py"  # a file: Triton reads a kernel's source from it
    script.write_text(_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(workers)], capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr.strip()[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_kernels_compile_in_workers_and_the_threads_reuse_their_results(tmp_path):
    stats = _run(tmp_path)
    # The three kernels of our torch-free modules went to the workers, and each thread's own compile found the
    # worker's result in the cache (the same cache key, also for the kernel this process hashes its own way):
    # none compiled twice, none failed there.
    assert stats["submitted"] == 3 and stats["compiled"] == 3, stats
    assert stats["failed"] == 0 and stats["not_reused"] == 0, stats
    # The kernel from elsewhere (a worker can't import its module) compiled on a thread; every compile gave a
    # kernel to each of the four kernels' caches, and the hook is gone once the pool is finished.
    kinds = stats["compiled_kernels"]
    assert len(kinds) == 4 and all(k and set(k) == {"CompiledKernel"} for k in kinds), stats
    assert stats["hook_left_installed"] is False
    # Each worker warmed its compiler while booting (a compile for the target), into a scratch cache: the shared
    # cache holds the four kernels and nothing else (not the warm-up's add+RMSNorm).
    assert stats["warmed"] == 2 and stats["warm_s"] > 0 and stats["all_numbers"], stats
    # ... and did not import this script (the parent's __main__): the window's would pull Qt into every worker.
    assert stats["main_imported"] == 0, stats
    names = [n.rsplit(".", 1)[0] for n in stats["cache_entries"]]
    assert sorted(names) == sorted(
        ["_silu_mul_kernel", "_add_rms_norm_kernel", "_int4_dequantize_kernel", "_not_in_a_worker_module"]
    ), names


def test_workers_are_on_by_default_off_when_asked_and_never_in_a_bundle(monkeypatch):
    from model_loader.kernels import compile_workers

    monkeypatch.delenv("R1DESK_COMPILE_PROCESSES", raising=False)
    assert compile_workers.enabled()
    for off in ("0", "false", "Off", "no"):
        monkeypatch.setenv("R1DESK_COMPILE_PROCESSES", off)
        assert not compile_workers.enabled()
    monkeypatch.setenv("R1DESK_COMPILE_PROCESSES", "1")
    monkeypatch.setattr("sys.frozen", True, raising=False)
    assert not compile_workers.enabled()


def test_the_available_host_memory_counts_the_page_cache_and_the_cgroup_limit(tmp_path, monkeypatch):
    """MemAvailable (free memory plus the page cache a process could take back: a machine that just read a model
    file has little *free* memory; context.host_memory reads it), capped by a cgroup v2 limit; None where the
    system doesn't say."""
    from model_loader import context
    from model_loader.kernels import compile_workers

    monkeypatch.setattr(context, "host_memory", lambda: (8_000_000 * 1024, 32_000_000 * 1024))
    no_cgroup = tmp_path / "none"
    assert compile_workers.available_host_memory(str(no_cgroup)) == 8_000_000 * 1024
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("123\n")
    assert compile_workers.available_host_memory(str(cgroup)) == 8_000_000 * 1024
    (cgroup / "memory.max").write_text(str(3 * 2**30))
    (cgroup / "memory.current").write_text(str(2**30))
    assert compile_workers.available_host_memory(str(cgroup)) == 2 * 2**30
    monkeypatch.setattr(context, "host_memory", lambda: (None, None))
    assert compile_workers.available_host_memory(str(cgroup)) is None


def test_as_many_workers_as_the_available_memory_allows(monkeypatch):
    """~400 MB a worker: a machine short of memory gets fewer; one that can't tell gets a cautious number."""
    from model_loader.kernels import compile_workers

    for available, expected in ((64 * 2**30, 16), (2 * 2**30, 5), (300 * 2**20, 0), (None, 8)):
        monkeypatch.setattr(compile_workers, "available_host_memory", lambda a=available: a)
        assert compile_workers.affordable_workers(16) == expected
