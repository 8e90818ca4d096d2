"""Several sampled replies to one conversation, decoded together through the scheduler: the chains a majority
vote (model_loader.vote) counts. Their prompt is prefilled once and its blocks shared (prefix caching)."""

from __future__ import annotations

import torch

from model_loader.events import Failed, Finished, GenerationControl, SamplingSettings
from model_loader.kv_cache import KV_16BIT
from model_loader.scheduler import Scheduler, SchedulerConfig


def kv_blocks_for(engine, chains: int, tokens_each: int, block_size: int) -> int:
    """Blocks for `chains` sequences of tokens_each tokens (all at once, no preemption), or as many as 90% of the
    GPU's free memory holds if fewer (the scheduler then runs some later)."""
    want = chains * -(-tokens_each // block_size) + 1
    if engine.model.device.type != "cuda":
        return want
    free, _ = torch.cuda.mem_get_info(engine.model.device)
    fit = Scheduler.blocks_that_fit(engine.model, block_size, free)
    if fit < -(-tokens_each // block_size):
        raise torch.cuda.OutOfMemoryError("no room on the GPU for one more reply's KV cache")
    return min(want, fit)


def samples_scheduler(engine, n: int, prompt_tokens: int, settings: SamplingSettings, kv_cache: str = KV_16BIT):
    """A scheduler for n samples of one prompt of prompt_tokens tokens, beside the engine's own KV cache: blocks
    for all n at their longest (kv_blocks_for: fewer where the GPU's free memory holds fewer, the rest then run
    later), no sequence past the engine's context. Raises torch.cuda.OutOfMemoryError where not one fits."""
    context = engine.info.context_length
    tokens_each = min(context, prompt_tokens + settings.new_tokens_within(context - prompt_tokens) + 1)
    config = SchedulerConfig(max_seqs=n, kv_cache=kv_cache)
    scheduler = Scheduler(engine.model, engine.chat, kv_blocks_for(engine, n, tokens_each, config.block_size), config)
    scheduler.max_ctx = min(scheduler.max_ctx, context)
    return scheduler


def sample_chains(
    engine,
    messages: list[dict],
    settings: SamplingSettings,
    n: int,
    control: GenerationControl | None = None,
    on_done=None,
) -> list[Finished | Failed]:
    """n replies to `messages`, seeds settings.seed, +1, ... (random if unset). on_done(index, event) is called as
    each one ends. A cancel of `control` ends them all (each keeps what it wrote). Runs on the calling thread."""
    prompt = engine.chat.render(messages)
    scheduler = samples_scheduler(engine, n, len(prompt.ids), settings)
    results: list = [None] * n

    def sink_for(i: int):
        def sink(event) -> None:
            if isinstance(event, (Finished, Failed)):
                results[i] = event
                if on_done is not None:
                    on_done(i, event)

        return sink

    controls = [GenerationControl() for _ in range(n)]
    scheduler.submit_samples(
        prompt.ids,
        settings,
        n,
        in_reasoning=prompt.starts_in_reasoning,
        sinks=[sink_for(i) for i in range(n)],
        controls=controls,
    )
    while scheduler.has_work():
        if control is not None and control.cancelled:
            for c in controls:
                c.cancel()
        scheduler.step()
    return results
