"""Warm-up: compile the kernels, tune the GEMVs and the decode attention, capture the decode and prefill graphs, so
that nothing compiles or captures after it and the first reply starts at full speed (Engine.warm_up)."""

from __future__ import annotations

import contextlib
import logging
import time

import torch

from model_loader import kernel_cache
from model_loader.compile_ahead import WARM_UP_TOKENS, walk_warm_up_paths
from model_loader.device import use_device
from model_loader.errors import ModelError, OutOfMemoryError
from model_loader.kernels import precompile, torch_graph_ops
from model_loader.loading import OOM_ADVICE

log = logging.getLogger(__name__)


def warm_up_ids(engine) -> torch.Tensor:
    """The warm-up's eager prompt: the start of a real chat (the sequence's first token, where Qwen2 models put
    their largest activations), as long as compile_ahead.warm_up_ids, whose kernels it must reuse."""
    ids = engine.chat.render([{"role": "user", "content": "Hello! How are you doing today?"}]).ids
    ids = (ids * WARM_UP_TOKENS)[:WARM_UP_TOKENS]
    return torch.tensor(ids, dtype=torch.int64, device=engine.model.device)


def check_finite(engine, logits: torch.Tensor) -> None:
    """A prefill of a real prompt must give finite logits, or every reply would be random tokens: fp16 overflows
    on some Qwen2 models (activations past 65,504), and a damaged weights file can hold NaN or infinity."""
    if bool(torch.isfinite(logits).all()):
        return
    name = engine.info.model_name
    if engine.model.dtype == torch.float16:
        raise ModelError(
            f"{name} overflows in fp16 precision (its activations exceed fp16's range, so it computes "
            f"infinities): choose bf16 (GPUs of compute capability 7.5 and newer) or fp32 "
            f"(Settings > Precision; --dtype for r1desk-cli), or run on the CPU"
        )
    raise ModelError(
        f"{name} computed NaN or infinite values on a test prompt: its weights are probably "
        f"damaged; download the model again"
    )


def warm_up(engine, progress=None) -> None:
    """Compile the kernels, tune and capture the decode graphs and the prefill graphs of every bucket, so that
    nothing compiles or captures after this and the first reply starts at full speed. Must run on the thread
    that will generate. progress(done, total, what) is called between the steps."""
    t0 = time.perf_counter()
    use_device(engine.model.device)
    graphs = engine.info.cuda_graphs
    buckets = sorted(engine.prefill_graphs.buckets, reverse=True) if engine.prefill_graphs is not None else []
    total = 2 + (2 if graphs and engine.model.use_triton else 0) + 2 + len(buckets)
    done = 0

    def step(what: str) -> None:
        nonlocal done
        if progress is not None:
            progress(done, total, what)
        done += 1

    # On a first start the warm-up's paths are first walked with compile-only launches, every compile on a
    # thread pool, so all kernels compile at once (kernels.precompile). Once this GPU and model kind are
    # prepared (kernel_cache), everything is in Triton's disk cache and that walk would only cost time.
    # A first start whose twin could not be walked beside the load walks the loaded model now.
    beside_load, engine.compiles_beside_load = engine.compiles_beside_load, None
    try:
        if beside_load is not None and not beside_load.complete:  # its walk stopped early
            beside_load.finish()  # what it submitted compiles; the walk below submits the rest
            count_worker_compiles(engine, beside_load)
            beside_load = None
        ahead = beside_load is None and engine.first_start and engine.model.device.type == "cuda"
        with precompile.compile_pool() if ahead else contextlib.nullcontext() as pool:
            _warm_up_steps(engine, step, graphs, buckets, pool or beside_load, walk=ahead)
    finally:  # a warm-up stopped early (a window closed, out of memory) still ends the compiles it began
        if beside_load is not None:
            beside_load.finish()
    if progress is not None:
        progress(total, total, "ready")
    if engine.info.kernels == "triton":
        kernel_cache.mark_prepared(engine.model.device, engine.kernel_variant)
    engine.reset_cache()  # warm-up wrote junk into the cache
    engine.info.warmup_s = time.perf_counter() - t0
    engine.ready = True


def count_worker_compiles(engine, pool) -> None:
    stats = pool.worker_stats if pool.in_processes else None
    if stats:
        so_far = engine.info.compile_workers or {}
        engine.info.compile_workers = {k: so_far.get(k, 0) + v for k, v in stats.items()}


def _warm_up_steps(engine, step, graphs: bool, buckets: list[int], pool, walk: bool) -> None:
    """pool: a first start's compiles (kernels.precompile.CompilePool, or compile_ahead.CompileBesideLoad
    whose walk is done); walk: walk the warm-up's paths into it first."""
    try:
        step(
            (
                "compiling every kernel at once ("
                + (f"{pool.processes} worker processes)" if pool.in_processes else f"{pool.threads} CPU threads)")
            )
            if pool is not None
            else "preparing the kernels"
        )
        if pool is not None:
            t = time.perf_counter()
            if walk:
                walk_warm_up_paths(engine.model, buckets, graphs)
            pool.finish()
            count_worker_compiles(engine, pool)
            log.info(
                "kernels compiled ahead in %.2f s (%s)",
                time.perf_counter() - t,
                "walked now" if walk else "the rest of what was walked beside the load",
            )
        step("running the prefill kernels")
        with torch.inference_mode():
            ids = warm_up_ids(engine)
            check_finite(engine, engine.model.prefill(ids, 0))
            engine.model.prefill(ids[:2], ids.numel())  # the prefix-reuse path too
        if graphs and not engine.model.use_triton:  # plain PyTorch ops: a graph per span, nothing to tune
            engine.step.use_spans(torch_graph_ops.decode_spans(engine.model.max_ctx))
        elif graphs:  # before any capture: the graphs record whichever kernels win
            step("timing the matrix-vector kernels")
            tuned = engine.model.tune_gemv()
            engine.info.gemv = dict(tuned["choice"])
            log.info("single-token GEMV per weight shape: %s (us: %s)", engine.info.gemv, tuned["timings_us"])
            step("timing the attention kernels")
            from model_loader.kernels.decode_attention import depth_buckets  # graphs run only with Triton's kernels

            attention = engine.step.tune(
                engine.model.decode_attention_candidates(), depth_buckets(engine.model.max_ctx)
            )
            attn = engine.model.decode_attention  # what runs: a shape this GPU has no room for ran a fallback
            engine.info.decode_attention = {
                f"<={upper}": str(attn.working.get(attn.resolve(config), config)) for upper, config in attention["plan"]
            }
            log.info(
                "decode attention per depth bucket: %s (us per decode step: %s)",
                engine.info.decode_attention,
                attention["timings_us"],
            )
        for mode in ("greedy", "sample"):
            step(f"capturing the {mode} decode step")
            engine.step.capture(mode)
        for bucket in buckets:  # largest first: sizes the pool
            step(f"capturing the {bucket}-token prefill")
            engine.prefill_graphs.capture(bucket)
        if engine.model.device.type == "cuda":
            torch.cuda.synchronize(engine.model.device)
    except torch.cuda.OutOfMemoryError as err:
        torch.cuda.empty_cache()
        raise OutOfMemoryError(f"out of GPU memory while warming up; {OOM_ADVICE}") from err
