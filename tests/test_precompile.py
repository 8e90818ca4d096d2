"""Compiling ahead (kernels.precompile): on a first start the warm-up's paths run once with compile-only launches,
their compiles on a thread pool; the warm-up itself must then need no kernel variant beyond those (on a GPU).
Where kernels are interpreted nothing is attempted and the warm-up still works."""

import pytest

from model_loader import compile_ahead
from model_loader.engine import Engine
from model_loader.events import Finished, SamplingSettings
from model_loader.kernels import (
    jit_common,
    jit_decode_attention,
    jit_gemv,
    jit_int4,
    jit_prefill_attention,
    jit_sampler,
    jit_small_ops,
    precompile,
)


def _our_kernels():
    # every module of ours with kernels: one left out (the sampler's once was) lets what an
    # earlier test file compiled in this process hide its compiles from the test below
    from triton.runtime.jit import JITFunction

    return [
        obj
        for module in (
            jit_common,
            jit_small_ops,
            jit_decode_attention,
            jit_prefill_attention,
            jit_gemv,
            jit_int4,
            jit_sampler,
        )
        for obj in vars(module).values()
        if isinstance(obj, JITFunction)
    ]


def test_launch_is_the_plain_launch_outside_compiling_ahead():
    class Kernel:
        def __getitem__(self, grid):
            return ("launch", grid)

        def warmup(self, *args, grid, **kwargs):
            return ("warmup", grid, args, kwargs)

    assert not precompile.active()
    assert precompile.launch(Kernel(), (3,)) == ("launch", (3,))


def test_the_compile_pool_enters_and_leaves_tritons_async_mode_once():
    from concurrent.futures import Future

    from triton.runtime._async_compile import AsyncCompileMode, active_mode

    pool = precompile.CompilePool(AsyncCompileMode, threads=2)
    assert active_mode.get() is pool.mode
    done = pool.executor.submit(lambda: "compiled")
    assert isinstance(done, Future) and done.result() == "compiled"
    pool.finish()
    pool.finish()  # idempotent: compile_pool() calls it again on the way out
    assert active_mode.get() is None
    again = precompile.CompilePool(AsyncCompileMode, threads=1)  # nothing left active to refuse a new one
    again.finish()
    assert active_mode.get() is None


def test_while_a_pool_compiles_the_gil_changes_hands_at_pythons_default_interval():
    import sys

    from triton.runtime._async_compile import AsyncCompileMode

    before = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)  # what the window sets for its decode loop
    pool = precompile.CompilePool(AsyncCompileMode, threads=1)
    try:
        assert sys.getswitchinterval() == pytest.approx(precompile.COMPILE_SWITCH_INTERVAL_S, rel=0.05)
    finally:
        pool.finish()  # also when the assert fails: no async mode left active for later tests
    try:
        assert sys.getswitchinterval() == pytest.approx(0.0005, rel=0.05)
    finally:
        sys.setswitchinterval(before)


def _record_compiles(monkeypatch) -> list[tuple[str, str]]:
    """(kernel, thread) of every Triton compile from now on, this process's earlier compiles forgotten."""
    import threading

    import triton.compiler
    import triton.compiler.compiler

    compiled_on: list[tuple[str, str]] = []
    original = triton.compiler.compiler.compile

    def recording_compile(src, *args, **kwargs):
        compiled_on.append((getattr(getattr(src, "fn", None), "__name__", "?"), threading.current_thread().name))
        return original(src, *args, **kwargs)

    monkeypatch.setattr(triton.compiler.compiler, "compile", recording_compile)
    monkeypatch.setattr(triton.compiler, "compile", recording_compile)
    for kernel in _our_kernels():  # forget this process's compiles; the binder picks up the patched compile
        kernel.device_caches.clear()
    return compiled_on


@pytest.mark.parametrize(
    "kind,beside_load",
    [("dense", True), ("dense", False), ("awq", True), ("dense", "walk fails"), ("dense-8bit", True)],
    ids=[
        "beside-the-load",
        "after-the-load",
        "awq-beside-the-load",
        "twin-walk-fails",
        "8-bit-kv-cache-beside-the-load",
    ],
)
def test_a_first_start_compiles_every_kernel_on_the_pool(
    kind, beside_load, tiny_model, device, monkeypatch, tmp_path, request
):
    """Every Triton compile of a first start (a disk-cache hit still goes through triton's compile()) runs on a
    compile-pool thread: the pass ahead, over the model's shape twin while the weights load (model_loader.
    compile_ahead) or over the loaded model where the twin doesn't fit, submitted each variant the warm-up
    launches; none is compiled on the loading thread (on a GPU, benchmarks/first_start_profile.py counts the
    same: every compile on the pool). With the 8-bit KV cache the
    twin has one too, so its kernels' 8-bit variants are among those compiled ahead."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no kernel_cache marker: a first start
    # Beside the load the compiles run in worker processes (the default, kernels.compile_workers) or on threads.
    in_workers = beside_load is True
    monkeypatch.setenv("R1DESK_COMPILE_PROCESSES", "1" if in_workers else "0")
    on_gpu = device == "cuda"
    if not beside_load:
        monkeypatch.setattr(compile_ahead, "TWIN_HEADROOM", 1 << 60)  # "the twin would not fit"
    if beside_load == "walk fails":  # the twin's walk stops early: the warm-up must walk the loaded model

        def failing_walk(model, buckets, graphs, **kwargs):
            raise RuntimeError("out of something")

        monkeypatch.setattr(compile_ahead, "walk_warm_up_paths", failing_walk)
    compiled_on = _record_compiles(monkeypatch) if on_gpu else []
    folder = tiny_model if kind.startswith("dense") else request.getfixturevalue("awq_model")
    engine = Engine.load(
        folder,
        device=device,
        use_triton=True,
        context_length=1024 if on_gpu else 128,
        kv_cache="8-bit" if kind == "dense-8bit" else "16-bit",
    )
    assert engine.first_start == on_gpu  # the CPU interpreter compiles nothing, so there is nothing to do ahead
    assert ("compile_walk_s" in engine.info.load_breakdown) == (on_gpu and bool(beside_load))
    engine.warm_up()
    if on_gpu:
        assert len(compiled_on) >= 10
        # the Triton self-check compiles its own variant on its own thread, beside the load
        elsewhere = [(k, t) for k, t in compiled_on if not t.startswith(("r1desk-compile", "r1desk-triton-check"))]
        assert not elsewhere, f"compiled elsewhere than on the pool: {elsewhere}"
        # ... where, with workers, each thread only loaded what a worker process compiled
        stats = engine.info.compile_workers
        if in_workers:
            assert stats and stats["compiled"] >= 10 and stats["failed"] == 0 and stats["not_reused"] == 0, stats
        else:
            assert stats is None
        assert not engine.first_start  # marked prepared: the next start skips the pass
    settings = SamplingSettings(temperature=0, max_new_tokens=4, ignore_eos=True)
    out = [ev for ev in engine.generate_ids(engine.chat.encode_plain("Hi"), settings) if isinstance(ev, Finished)]
    assert out[0].stats.completion_tokens == 4
    engine.close()
