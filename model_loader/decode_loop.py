"""One reply of the single-sequence path (Engine.generate_ids): prefill what the KV cache doesn't hold, then decode
token by token with the host a few steps behind the GPU, streaming Delta events and ending with Finished.

On CUDA with Triton each decode step (forward + sampling + position update) is one CUDA graph replay
(model_loader.decode_graphs); tokens come back through a host ring, stop-thinking pushes the close tag into the
steps already queued (model_loader.forced_tokens), and options past temperature/top-p/top-k choose on the host
(model_loader.logits_processing), one step at a time when a grammar must read each token first."""

from __future__ import annotations

import collections
import os
import time

import torch

from model_loader.chat import AnswerNewlineTrimmer, ReasoningSplitter, StreamingDetokenizer, stored_reply
from model_loader.common_prefix import common_prefix
from model_loader.device import use_device
from model_loader.errors import ContextFullError, ModelError, check_room
from model_loader.events import Delta, Finished, GenerationControl, GenerationStats, SamplingSettings, Started
from model_loader.forced_tokens import RING, ClosePush
from model_loader.logits_processing import LogitsPipeline
from model_loader.sampling import greedy
from model_loader.stats import decode_context

# Decode steps kept queued on the GPU while the host waits for the oldest: each one is a step of GPU work that
# covers a host stall (the GIL held by another thread, a slow detokenizer step) without the GPU idling.
# A step queued past the end of a reply only costs its GPU time: its K/V lie beyond the cached tokens. Four
# (not two) because the window's GUI thread takes the GIL for up to a few ms at a time (a Qt call such as
# setHtml holds it throughout): with two or three queued the window loses a visible share of the decode speed,
# with four almost none (benchmarks/window_overhead.py; docs/BENCHMARKS.md, 'The window's overhead (self-test)').
# A cancel waits for the queued steps (four steps' GPU time); stop-thinking doesn't: the queued steps take the
# close tag in place of their samples (forced_tokens).
QUEUED_STEPS = 4


def prefill_uncached(engine, seq: list[int]) -> tuple[torch.Tensor, int]:
    """Prefill only what is not already cached; returns (last logits [1, V], tokens reused)."""
    limit = min(len(engine.cache_tokens), len(seq) - 1)  # at least one token must run to get logits
    reuse = common_prefix(engine.cache_tokens, seq, limit)
    engine.cache_tokens = engine.cache_tokens[:reuse]
    logits = None
    if engine.prefill_graphs is not None:
        logits = engine.prefill_graphs.run(seq[reuse:], reuse)
    if logits is None:  # no graphs here (CPU, no Triton), or more than the largest bucket
        ids = torch.tensor(seq[reuse:], dtype=torch.int64, device=engine.model.device)
        logits = engine.model.prefill(ids, reuse)
    engine.cache_tokens = list(seq)
    return logits, reuse


def decode_reply(
    engine, prompt_ids, s: SamplingSettings, control: GenerationControl, in_reasoning: bool, started_at: float | None
):
    t_prompt = time.perf_counter()
    t0 = t_prompt if started_at is None else started_at
    use_device(engine.model.device)  # held while this generator runs: its consumer's thread does the GPU work
    ctx = engine.model.max_ctx
    n_prompt = len(prompt_ids)
    if n_prompt == 0:
        raise ModelError("empty prompt")
    if n_prompt >= ctx:
        raise ContextFullError(
            f"the conversation is {n_prompt} tokens and the context holds {ctx}; "
            "start a new chat or raise the context length"
        )
    check_room(n_prompt, s, ctx)
    greedy_mode = s.temperature <= 0
    # Options past temperature/top-p/top-k: the step stops at the logits and logits_processing chooses
    pipeline = (
        None
        if s.plain
        else LogitsPipeline(s, engine.model.cfg.vocab_size, engine.model.device, prompt_ids, in_reasoning)
    )
    mode = "logits" if pipeline is not None else "greedy" if greedy_mode else "sample"
    seed = s.seed if s.seed is not None else int.from_bytes(os.urandom(4), "little")
    if not engine.step.captured(mode):
        engine.step.capture(mode)
        engine.cache_tokens = []  # capturing ran steps that wrote into the cache
    # the processed path's own random stream on the device, seeded per reply (the graphs' stays as it is)
    host_gen = torch.Generator(engine.model.device).manual_seed(seed) if pipeline is not None else None
    if mode == "sample":  # seeded after any capture above, whose steps draw noise too
        engine.params.set(s.temperature, s.top_p, s.top_k, engine.model.cfg.vocab_size)
        engine.params.reseed(seed)  # the fused sampler's noise (16-bit logits on a GPU)
        if engine.model.device.type == "cuda":
            torch.cuda.manual_seed(seed)  # the sort-based sampler's on a GPU (fp32): read at every replay
        else:
            engine.step.generator = torch.Generator().manual_seed(seed)
    on_cuda = engine.model.device.type == "cuda"
    stop_ids = set() if s.ignore_eos else set(engine.chat.stop_ids)

    detok = StreamingDetokenizer(engine.tokenizer)
    splitter = ReasoningSplitter(in_reasoning)
    trim = AnswerNewlineTrimmer() if not s.verbatim else (lambda kind, text: text)
    reasoning_parts: list[str] = []
    answer_parts: list[str] = []
    tokens: list[int] = []
    times: list[float] = []
    first_answer_t: float | None = None
    reasoning_tokens = 0
    finish = None

    def emit(tok: int):
        nonlocal first_answer_t, reasoning_tokens
        tokens.append(tok)
        times.append(time.perf_counter())
        if splitter.in_reasoning:
            reasoning_tokens += 1
        if pipeline is not None:
            scored = pipeline.take_logprobs(tok, engine.tokenizer, "reasoning" if splitter.in_reasoning else "answer")
            if scored is not None:
                yield scored
        if tok in stop_ids:
            return
        was_reasoning = splitter.in_reasoning
        parts = splitter.feed(detok.add(tok))
        if pipeline is not None:
            pipeline.accept(tok, splitter.in_reasoning)
        if was_reasoning and not splitter.in_reasoning:
            # The reasoning has closed (the model's tag, perhaps spelled in several tokens the GPU doesn't
            # know as the close, or ours): a Stop thinking now would push the tag into the answer.
            control.act_on_stop_thinking(None)
            close_push.close()
        for kind, text in parts:
            text = trim(kind, text)
            if not text:
                continue
            if kind == "answer" and first_answer_t is None:
                first_answer_t = time.perf_counter()
            (answer_parts if kind == "answer" else reasoning_parts).append(text)
            yield Delta(text, kind, len(tokens))

    def done(tok: int):
        if tok in stop_ids:
            return "eos"
        if s.max_new_tokens is not None and len(tokens) >= s.max_new_tokens:
            return "max_new_tokens"
        if n_prompt + len(tokens) >= ctx:
            return "context_full"
        return None

    seq = list(prompt_ids)
    # made before the first token, which may itself close the reasoning (emit closes the push then)
    close_push = ClosePush(engine.step.forced, engine.close_tag)
    engine.step.forced.reset()  # before the prefill: it has run by the time a step could take a forced token
    with torch.inference_mode():
        logits, reused = prefill_uncached(engine, seq)
        # Sampled in the model's dtype, as the decode step does (exact: the fp32 logits were 16-bit values),
        # so the first token takes the sampler the warm-up ran: a sampler first used here would hold up the
        # first reply with its lazy set-up (the sort's).
        if pipeline is not None:
            first = pipeline.choose(logits, host_gen)
            pipeline.observe(first)
        else:
            first = greedy(logits) if mode == "greedy" else engine.step.sample(logits.to(engine.model.dtype))
    yield Started(prompt_tokens=n_prompt, prefix_reused_tokens=reused, context_length=ctx)
    first_id = int(first.item())
    yield from emit(first_id)
    finish = done(first_id)
    limit = s.new_tokens_within(ctx - n_prompt) - 1  # decode steps allowed
    engine.step.token.copy_(first)
    engine.step.pos.fill_(n_prompt)
    launched = 0
    pending: collections.deque = collections.deque()
    ring_size = QUEUED_STEPS + 2  # a slot is rewritten only after the host has read it
    forced = engine.step.forced
    # Each step's token comes back through the commit kernel's host ring where it writes one; else a copy
    # after each step into this ring.
    ring = None if forced.reads_ring else torch.empty(ring_size, dtype=torch.int64, pin_memory=on_cuda)
    assert ring_size <= RING, "the commit's ring must outlast the steps queued"
    events = [torch.cuda.Event() for _ in range(ring_size)] if on_cuda else []

    # A grammar's reply reads each token before choosing the next (its mask depends on it), one step at a
    # time; so that the GPU doesn't wait on the host meanwhile, each step's forward pass is queued as soon as
    # its input token is committed, before the host reads that token: the forward runs while the host reads
    # it and computes the next mask.
    ahead = pipeline is not None and pipeline.needs_each_token
    queued_steps = 1 if ahead else QUEUED_STEPS
    forward = [None]  # ahead: the logits of the forward pass already queued

    def launch():
        nonlocal launched
        slot = launched % ring_size
        logits = forward[0] if forward[0] is not None else engine.step.run(mode, n_prompt + launched)
        forward[0] = None
        if pipeline is not None:
            with torch.inference_mode():
                engine.step.commit(pipeline.choose(logits, host_gen))
                pipeline.observe(engine.step.token)
        if ring is not None:
            ring[slot : slot + 1].copy_(engine.step.token, non_blocking=on_cuda)
        if on_cuda:
            events[slot].record()
        if ahead and launched + 1 < limit:
            forward[0] = engine.step.run(mode, n_prompt + launched + 1)
        pending.append((slot, n_prompt + launched))
        launched += 1

    # Stop-thinking: the close tag goes to the decode steps already queued (model_loader.forced_tokens): the
    # one running commits its first token instead of a sample, and the tag comes back through the ring like
    # any token, so the answer starts a few steps later with no prefill and nothing waiting. Asked from
    # another thread (the GUI), the push happens there at once; the GPU ignores it if the model has closed
    # its reasoning by itself meanwhile (which only a single-token close tag lets it see).
    if splitter.in_reasoning and engine.chat.think_close_id is not None:
        control.act_on_stop_thinking(close_push)
    try:
        while finish is None:
            # Cancel and stop-thinking are checked before topping the queue up: a step launched now would
            # only delay a cancel by its GPU time.
            if control.cancelled:
                finish = "cancelled"
                break
            if splitter.in_reasoning and control.take_stop_thinking():
                close_push()
            # Keep steps queued beyond the one we wait for, so the GPU never waits on the host.
            while launched < limit and len(pending) < queued_steps:
                launch()
            if not pending:
                finish = "context_full" if n_prompt + len(tokens) >= ctx - 1 else "max_new_tokens"
                break
            slot, pos = pending.popleft()
            if on_cuda:
                events[slot].synchronize()
            tok = forced.committed(pos) if ring is None else int(ring[slot].item())
            yield from emit(tok)
            finish = done(tok)
    finally:  # also when the consumer stops early: no push may land in the next reply
        control.act_on_stop_thinking(None)
        close_push.close()
    if on_cuda:
        torch.cuda.current_stream().synchronize()
    # a request the GPU ignored (the model had closed its reasoning itself), or whose tag the reply never got
    # to show (cancelled or ended right after it), doesn't count
    stopped_thinking = close_push.pushed and engine.step.forced.taken() > 0 and not splitter.in_reasoning
    # Step i took tokens[i] as its input (the first came from the prefill). Steps whose input the host never
    # read wrote K/V too, past the listed tokens: the next prefill overwrites them.
    engine.cache_tokens = seq + tokens[:launched]

    for kind, text in splitter.feed(detok.flush()) + splitter.flush():
        text = trim(kind, text)
        if text:
            (answer_parts if kind == "answer" else reasoning_parts).append(text)
            yield Delta(text, kind, len(tokens))

    t_end = time.perf_counter()
    ttft = (times[0] - t0) if times else 0.0
    decode_s = times[-1] - times[0] if len(times) > 1 else 0.0
    reasoning, answer = "".join(reasoning_parts), "".join(answer_parts)
    text = stored_reply(reasoning, answer, in_reasoning, not splitter.in_reasoning)
    cache_read = engine.info.kv_bytes_per_token * decode_context(n_prompt, len(tokens))
    stats = GenerationStats(
        finish_reason=finish,
        prompt_tokens=n_prompt,
        completion_tokens=len(tokens),
        reasoning_tokens=reasoning_tokens,
        prefix_reused_tokens=reused,
        context_length=ctx,
        ttft_ms=ttft * 1000.0,
        prompt_ms=(t_prompt - t0) * 1000.0,
        first_answer_ms=(first_answer_t - t0) * 1000.0 if first_answer_t is not None else None,
        decode_tok_s=(len(times) - 1) / decode_s if decode_s > 0 else 0.0,
        total_s=t_end - t0,
        token_latencies_ms=[(b - a) * 1000.0 for a, b in zip(times, times[1:])],
        memory=engine.memory(),
        stopped_thinking=stopped_thinking,
        seed=None if greedy_mode else seed,
        decode_read_bytes=engine.info.decode_weight_bytes + cache_read if len(tokens) > 1 else 0.0,
        decode_cache_read_bytes=cache_read,
    )
    yield Finished(text=text, reasoning=reasoning, answer=answer, token_ids=tokens, stats=stats)
