"""Record the Triton kernel variants r1desk compiles on this GPU, for the release build's kernel store
(model_loader.kernels.kernel_store): `r1desk-cli kernel-store record`.

Everything that compiles on a first start runs once: each model's load and warm-up (every decode-attention and
GEMV candidate, the prefill graphs, the sampler), a sampled and a greedy reply, with the 16-bit and the 8-bit KV
cache, and, with --parallel, the scheduler's paged steps (what `serve --max-parallel` and several samples at once
use); a 4-bit model in both int4 layouts (other_int4_layout), since which one loads depends on the GPU. Triton's
jit_cache_hook sees every compile it starts, whether or not its disk cache already holds the kernel,
so a machine that ran r1desk before records the same list as a new one.
"""

from __future__ import annotations

from model_loader.errors import ModelError
from model_loader.events import Finished, SamplingSettings
from model_loader.kernels import kernel_store
from model_loader.kv_cache import KV_8BIT, KV_16BIT
from model_loader.variants import INT4_LABELS

PROMPT = "Why is the sky blue? Answer in one sentence."


def record(
    models, kv_caches=(KV_16BIT, KV_8BIT), parallel: int = 4, say=print, device: str = "cuda"
) -> list[kernel_store.Record]:
    """Load and warm up every model with every KV cache on the GPU, reply once sampled and once greedy, run
    `parallel` replies at once through the scheduler (0: not), and return the kernel variants Triton compiled.
    (device: another one runs the same paths, where no Triton kernel compiles: tests.)"""
    from model_loader.engine import Engine

    records: list[kernel_store.Record] = []
    with kernel_store.recording(records):
        for model in models:
            layouts: list[str | None] = [None]  # this GPU's own 4-bit path, then the other one (other_int4_layout)
            for int4_kernel in layouts:
                for kv_cache in kv_caches:
                    name = model if int4_kernel is None else f"{model} ({int4_kernel} int4 layout)"
                    say(f"{name}, {kv_cache} KV cache: loading and warming up")
                    try:
                        engine = Engine.load(model, device=device, kv_cache=kv_cache, int4_kernel=int4_kernel)
                    except ModelError as err:  # that layout can't run on this GPU
                        say(f"  skipped: {err}")
                        break
                    other = other_int4_layout(engine.info.quantization)
                    if other and other not in layouts:
                        layouts.append(other)
                    _walk(engine, name, kv_cache, parallel, say)
                say(f"  {len({r.variant() for r in records})} kernel variants so far")
    return records


def other_int4_layout(quantization: str | None) -> str | None:
    """The 4-bit layout other GPUs take by default, given the one this GPU loaded (EngineInfo.quantization):
    Hopper runs our row-packed Triton kernels, the other sm80+ GPUs torch's int4 layout, whose prefill
    dequantiser is a Triton kernel of its own. Records from one GPU then cover both."""
    if quantization == INT4_LABELS["triton"]:
        return "torch"
    if quantization is not None and quantization.startswith(INT4_LABELS["torch"].removesuffix(")")):
        return "triton"
    return None


def _walk(engine, name: str, kv_cache: str, parallel: int, say) -> None:
    """Warm up, reply sampled and greedy, then `parallel` replies through the scheduler; close the engine."""
    try:
        engine.warm_up()
        ids = engine.chat.render([{"role": "user", "content": PROMPT}]).ids
        for settings in (
            SamplingSettings(temperature=0.6, top_p=0.95, max_new_tokens=16, seed=0),
            SamplingSettings(temperature=0, max_new_tokens=16),
        ):
            for _ in engine.generate_ids(ids, settings):
                pass
        if parallel > 1:
            say(f"{name}, {kv_cache} KV cache: {parallel} replies at once")
            _run_batched(engine, ids, parallel)
    finally:
        engine.close()


def _run_batched(engine, ids: list[int], parallel: int) -> None:
    scheduler = engine.serve_batched(parallel)
    done: list[Finished] = []
    for i in range(parallel):
        settings = SamplingSettings(temperature=0.6 if i % 2 else 0, max_new_tokens=16, seed=i)
        scheduler.submit(ids, settings, sink=lambda ev: done.append(ev) if isinstance(ev, Finished) else None)
    while scheduler.has_work():
        scheduler.step()
    if len(done) != parallel:
        raise RuntimeError(f"{parallel} replies at once ended {len(done)} times")
