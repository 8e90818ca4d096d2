"""The engine: load a Qwen2 folder onto a device, warm it up, and stream replies.

Contract: Engine.generate(messages, settings, control) yields Delta events (text tagged reasoning/answer)
and then one Finished event with the full text, the generated ids and the stats. It owns the KV cache and
reuses the longest cached prefix of every new prompt. On CUDA with Triton the decode step (forward +
sampling + position update) is one CUDA graph replayed once per token, and the host runs one step ahead of
the token it is waiting for, so the GPU never idles between tokens. CUDA graphs belong to the thread that
captured them: load, warm_up and generate must all run on the same thread.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from typing import Iterator

import torch

from model_loader.chat import (
    STOP_THINKING_TEXT,
    AnswerNewlineTrimmer,
    ChatFormat,
    ReasoningSplitter,
    StreamingDetokenizer,
    history_message,
    stored_reply,
)
from model_loader.common_prefix import common_prefix
from model_loader.kv_cache import KV_16BIT
from model_loader.errors import ContextFullError, ModelError, OutOfMemoryError, check_room
from model_loader.forced_tokens import RING, ClosePush
from model_loader.events import Delta, Finished, GenerationControl, GenerationStats, SamplingSettings, Started
from model_loader import kernel_cache
from model_loader.locate import ModelFolder
from model_loader.qwen2 import Qwen2Model
from model_loader.logits_processing import LogitsPipeline
from model_loader.sampling import SamplerParams, greedy
from model_loader.stats import decode_context, memory_stats
from model_loader.device import use_device
from model_loader.decode_graphs import DecodeStep, PrefillGraphs
from model_loader.loading import OOM_ADVICE, EngineInfo, load_model
from model_loader.variants import kernel_variant as variant_of
from model_loader.warm_up import warm_up as run_warm_up

log = logging.getLogger(__name__)

# Decode steps kept queued on the GPU while the host waits for the oldest: each one is a step of GPU work that
# covers a host stall (the GIL held by another thread, a slow detokenizer step) without the GPU idling.
# A step queued past the end of a reply only costs its GPU time: its K/V lie beyond the cached tokens. Four
# (not two) because the window's GUI thread takes the GIL for up to a few ms at a time (a Qt call such as
# setHtml holds it throughout): with two or three queued the window loses a visible share of the decode speed,
# with four almost none (benchmarks/window_overhead.py; docs/BENCHMARKS.md, 'The window's overhead (self-test)').
# A cancel waits for the queued steps (four steps' GPU time); stop-thinking doesn't: the queued steps take the
# close tag in place of their samples (forced_tokens).
QUEUED_STEPS = 4


class Engine:
    def __init__(self, folder: ModelFolder, model: Qwen2Model, chat: ChatFormat, info: EngineInfo):
        self.folder, self.model, self.chat, self.info = folder, model, chat, info
        self.tokenizer = chat.tokenizer
        self.params = SamplerParams(model.device)
        self.step = DecodeStep(model, self.params, use_graphs=info.cuda_graphs, think_close_id=chat.think_close_id)
        self.prefill_graphs = PrefillGraphs(model) if info.cuda_graphs else None
        # encoded once: a reply needs it between its first token and its first decode step
        self._close_tag = chat.encode_plain(STOP_THINKING_TEXT)
        self._cache_tokens: list[int] = []  # ids whose K/V are valid at positions 0..len-1
        self.compiles_beside_load = None  # compile_ahead.CompileBesideLoad: a first start's compiles, until warm_up()
        self.scheduler = None  # serve_batched(): the scheduler that owns the KV cache from then on
        self.closed = False
        self.ready = False

    # ---------------------------------------------------------------- loading
    @classmethod
    def load(
        cls,
        spec,
        device: str | None = None,
        context_length: int | str = 4096,
        dtype: str | None = None,
        progress=None,
        use_triton: bool | None = None,
        use_cuda_graphs: bool | None = None,
        embed_on_host: bool | None = None,
        int4_kernel: str | None = None,
        on_compiling=None,
        kv_cache: str = KV_16BIT,
    ) -> "Engine":
        """Validate and load a model folder (or cached repo id). progress(bytes_done, bytes_total) is called from
        this thread as weights arrive; an exception raised inside it aborts the load and propagates (how a
        window that closes mid-load stops it). context_length "auto" (or 0) takes as much context as the device
        has room for after the weights, up to 32,768 tokens (model_loader.context). int4_kernel forces an AWQ path
        ("triton", "torch" or "dequantize"; by default the fastest that runs here). on_compiling() is called from this
        thread when a first start begins compiling the GPU kernels beside the weight load (model_loader.compile_ahead).
        kv_cache: "16-bit" (the model's dtype) or "8-bit" (fp8 with a scale per row: model_loader.kv_cache).
        Raises ModelError (one-line message) for anything unusable."""
        loaded = load_model(
            spec,
            device,
            context_length,
            dtype,
            progress,
            use_triton,
            use_cuda_graphs,
            embed_on_host,
            int4_kernel,
            on_compiling,
            kv_cache,
        )
        try:
            engine = cls(loaded.folder, loaded.model, loaded.chat, loaded.info)
        except BaseException:
            if loaded.ahead is not None:  # the compiles it began end before the error is reported
                loaded.ahead.abandon()
            raise
        engine.compiles_beside_load = loaded.ahead
        return engine

    @property
    def kernel_variant(self) -> str:
        return variant_of(self.model.cfg, self.model.dtype, self.info.quantization, self.info.kv_cache)

    @property
    def first_start(self) -> bool:
        """Warm-up will compile GPU kernels (none prepared here for this GPU and model kind: kernel_cache)."""
        return self.info.kernels == "triton" and not kernel_cache.kernels_prepared(
            self.model.device, self.kernel_variant
        )

    def warm_up(self, progress=None) -> None:
        """Compile the kernels, tune and capture the decode graphs and the prefill graphs of every bucket, so that
        nothing compiles or captures after this and the first reply starts at full speed (model_loader.warm_up).
        Must run on the thread that will generate. progress(done, total, what) is called between the steps."""
        run_warm_up(self, progress)

    def close(self) -> None:
        """Free the model's device memory now (weights, KV cache, graphs). The engine is unusable afterwards."""
        if self.closed:
            return
        if self.compiles_beside_load is not None:  # closed before its warm-up
            self.compiles_beside_load.abandon()
            self.compiles_beside_load = None
        self.ready = False
        if self.scheduler is not None:
            self.scheduler.close()
            self.scheduler = None
        self.step.graphs.clear()
        self.step.outputs.clear()
        if self.prefill_graphs is not None:
            self.prefill_graphs.graphs.clear()
            self.prefill_graphs.outputs.clear()
        self.prefill_graphs = None
        self.model.w = {"layers": []}
        self.model.k_cache = self.model.v_cache = self.model.k_scale = self.model.v_scale = None
        # Everything else the model and the decode step hold on the device: the 4-bit prefill's dequantise
        # scratch (as large as the biggest weight), RoPE tables, the attentions' split buffers, the step's
        # token/position and the sampler's parameters.
        self.model.linear.scratch = None
        self.model.cos = self.model.sin = None
        self.model.decode_attention = None
        self.model.prefill_attention = None  # its split scratch
        self.step = None
        self.params = None
        self.closed = True
        self._cache_tokens = []
        # No gc.collect(): the tensors are freed as their last references go (none is in a cycle), and the window
        # collects garbage on its GUI thread only, while this may run on the engine thread (a failed warm-up).
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def memory(self):
        kv = self.scheduler.cache.nbytes if self.scheduler is not None else self.model.kv_cache_bytes
        return memory_stats(self.model.device, self.model.weights_bytes, kv)

    def serve_batched(self, max_seqs: int, block_size: int = 64):
        """Hand this engine's memory to a scheduler that runs up to max_seqs sequences at once (continuous
        batching: model_loader.scheduler) and return it. The single-sequence KV cache and its graphs are freed
        first, so the paged cache gets their memory; generate() is unavailable afterwards. Call after warm_up(),
        on the thread that will step the scheduler (it captures its decode graphs there)."""
        from model_loader.scheduler import Scheduler, SchedulerConfig

        if self.info.kv_cache != KV_16BIT:
            raise ModelError(
                "several replies at once need the 16-bit KV cache (the paged cache has no 8-bit "
                "format yet): choose the 16-bit KV cache, or one reply at a time"
            )
        use_device(self.model.device)
        self.step.graphs.clear()
        self.step.outputs.clear()
        if self.prefill_graphs is not None:
            self.prefill_graphs.graphs.clear()
            self.prefill_graphs.outputs.clear()
        self.model.k_cache = self.model.v_cache = None
        self._cache_tokens = []
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)
            torch.cuda.empty_cache()
        try:
            blocks = Scheduler.blocks_for_device(self.model, block_size, max_seqs)
            config = SchedulerConfig(max_seqs=max_seqs, block_size=block_size)
            if os.environ.get("R1DESK_PREFILL_TOKENS"):  # an A/B switch (docs/BENCHMARKS.md)
                config.prefill_tokens = int(os.environ["R1DESK_PREFILL_TOKENS"])
            self.scheduler = Scheduler(self.model, self.chat, blocks, config)
        except torch.cuda.OutOfMemoryError as err:
            torch.cuda.empty_cache()
            raise OutOfMemoryError(f"out of GPU memory for {max_seqs} replies at once; {OOM_ADVICE}") from err
        self.info.kv_cache_bytes = self.scheduler.cache.nbytes
        return self.scheduler

    def reset_cache(self) -> None:
        self._cache_tokens = []

    # ---------------------------------------------------------------- generation
    def generate(
        self,
        messages: list[dict],
        settings: SamplingSettings | None = None,
        control: GenerationControl | None = None,
        tools: list[dict] | None = None,
        continue_final: bool = False,
    ) -> Iterator[Started | Delta | Finished]:
        """tools: tool definitions for the chat template (an API client's; model_loader.tool_calls).
        continue_final: the last message is an assistant's reply so far, to continue (ChatFormat.render)."""
        t0 = time.perf_counter()  # the first token waits for the prompt's rendering too: TTFT counts it
        prompt = self.chat.render(messages, tools, continue_final)
        final = None
        for event in self.generate_ids(
            prompt.ids, settings, control, in_reasoning=prompt.starts_in_reasoning, started_at=t0
        ):
            final = event
            yield event
        # Asked for the next event after the reply's last (a consumer that reads to the end): tokenize the history
        # with this reply now, while the user reads it, rather than before the next reply's first token.
        if isinstance(final, Finished):
            try:
                self.chat.prepare([*messages, history_message(final.text, final.reasoning, final.answer)])
            except Exception as err:  # only a head start for the next prompt: never a finished reply's failure
                log.debug("tokenizing the history ahead failed: %s", err)

    def generate_ids(
        self,
        prompt_ids: list[int],
        settings: SamplingSettings | None = None,
        control: GenerationControl | None = None,
        in_reasoning: bool = False,
        started_at: float | None = None,
    ) -> Iterator[Started | Delta | Finished]:
        """started_at: when the request began (time.perf_counter()), if before this call (generate() renders the
        prompt first); TTFT and the total count from there."""
        if self.closed:
            raise ModelError("this model was unloaded (Engine.close); load it again to generate")
        if self.scheduler is not None:
            raise ModelError("this engine serves through its scheduler (serve_batched): submit requests there")
        try:
            yield from self._generate(
                prompt_ids, settings or SamplingSettings(), control or GenerationControl(), in_reasoning, started_at
            )
        except torch.cuda.OutOfMemoryError as err:
            self._cache_tokens = []
            torch.cuda.empty_cache()
            raise OutOfMemoryError(f"out of GPU memory while generating; {OOM_ADVICE}") from err
        except BaseException:
            self._cache_tokens = []  # the cache may hold a half-written step; don't trust it
            raise

    def _prefill(self, seq: list[int]) -> tuple[torch.Tensor, int]:
        """Prefill only what is not already cached; returns (last logits [1, V], tokens reused)."""
        limit = min(len(self._cache_tokens), len(seq) - 1)  # at least one token must run to get logits
        reuse = common_prefix(self._cache_tokens, seq, limit)
        self._cache_tokens = self._cache_tokens[:reuse]
        logits = None
        if self.prefill_graphs is not None:
            logits = self.prefill_graphs.run(seq[reuse:], reuse)
        if logits is None:  # no graphs here (CPU, no Triton), or more than the largest bucket
            ids = torch.tensor(seq[reuse:], dtype=torch.int64, device=self.model.device)
            logits = self.model.prefill(ids, reuse)
        self._cache_tokens = list(seq)
        return logits, reuse

    def _generate(
        self, prompt_ids, s: SamplingSettings, control: GenerationControl, in_reasoning: bool, started_at: float | None
    ):
        t_prompt = time.perf_counter()
        t0 = t_prompt if started_at is None else started_at
        use_device(self.model.device)  # held while this generator runs: its consumer's thread does the GPU work
        ctx = self.model.max_ctx
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
            else LogitsPipeline(s, self.model.cfg.vocab_size, self.model.device, prompt_ids, in_reasoning)
        )
        mode = "logits" if pipeline is not None else "greedy" if greedy_mode else "sample"
        seed = s.seed if s.seed is not None else int.from_bytes(os.urandom(4), "little")
        if not self.step.captured(mode):
            self.step.capture(mode)
            self._cache_tokens = []  # capturing ran steps that wrote into the cache
        # the processed path's own random stream on the device, seeded per reply (the graphs' stays as it is)
        host_gen = torch.Generator(self.model.device).manual_seed(seed) if pipeline is not None else None
        if mode == "sample":  # seeded after any capture above, whose steps draw noise too
            self.params.set(s.temperature, s.top_p, s.top_k, self.model.cfg.vocab_size)
            self.params.reseed(seed)  # the fused sampler's noise (16-bit logits on a GPU)
            if self.model.device.type == "cuda":
                torch.cuda.manual_seed(seed)  # the sort-based sampler's on a GPU (fp32): read at every replay
            else:
                self.step.generator = torch.Generator().manual_seed(seed)
        on_cuda = self.model.device.type == "cuda"
        stop_ids = set() if s.ignore_eos else set(self.chat.stop_ids)

        detok = StreamingDetokenizer(self.tokenizer)
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
                scored = pipeline.take_logprobs(tok, self.tokenizer, "reasoning" if splitter.in_reasoning else "answer")
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
        close_push = ClosePush(self.step.forced, self._close_tag)
        self.step.forced.reset()  # before the prefill: it has run by the time a step could take a forced token
        with torch.inference_mode():
            logits, reused = self._prefill(seq)
            # Sampled in the model's dtype, as the decode step does (exact: the fp32 logits were 16-bit values),
            # so the first token takes the sampler the warm-up ran: a sampler first used here would hold up the
            # first reply with its lazy set-up (the sort's).
            if pipeline is not None:
                first = pipeline.choose(logits, host_gen)
                pipeline.observe(first)
            else:
                first = greedy(logits) if mode == "greedy" else self.step.sample(logits.to(self.model.dtype))
        yield Started(prompt_tokens=n_prompt, prefix_reused_tokens=reused, context_length=ctx)
        first_id = int(first.item())
        yield from emit(first_id)
        finish = done(first_id)
        limit = s.new_tokens_within(ctx - n_prompt) - 1  # decode steps allowed
        self.step.token.copy_(first)
        self.step.pos.fill_(n_prompt)
        launched = 0
        pending: collections.deque = collections.deque()
        ring_size = QUEUED_STEPS + 2  # a slot is rewritten only after the host has read it
        forced = self.step.forced
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
            logits = forward[0] if forward[0] is not None else self.step.run(mode, n_prompt + launched)
            forward[0] = None
            if pipeline is not None:
                with torch.inference_mode():
                    self.step.commit(pipeline.choose(logits, host_gen))
                    pipeline.observe(self.step.token)
            if ring is not None:
                ring[slot : slot + 1].copy_(self.step.token, non_blocking=on_cuda)
            if on_cuda:
                events[slot].record()
            if ahead and launched + 1 < limit:
                forward[0] = self.step.run(mode, n_prompt + launched + 1)
            pending.append((slot, n_prompt + launched))
            launched += 1

        # Stop-thinking: the close tag goes to the decode steps already queued (model_loader.forced_tokens): the
        # one running commits its first token instead of a sample, and the tag comes back through the ring like
        # any token, so the answer starts a few steps later with no prefill and nothing waiting. Asked from
        # another thread (the GUI), the push happens there at once; the GPU ignores it if the model has closed
        # its reasoning by itself meanwhile (which only a single-token close tag lets it see).
        if splitter.in_reasoning and self.chat.think_close_id is not None:
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
        stopped_thinking = close_push.pushed and self.step.forced.taken() > 0 and not splitter.in_reasoning
        # Step i took tokens[i] as its input (the first came from the prefill). Steps whose input the host never
        # read wrote K/V too, past the listed tokens: the next prefill overwrites them.
        self._cache_tokens = seq + tokens[:launched]

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
        cache_read = self.info.kv_bytes_per_token * decode_context(n_prompt, len(tokens))
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
            memory=self.memory(),
            stopped_thinking=stopped_thinking,
            seed=None if greedy_mode else seed,
            decode_read_bytes=self.info.decode_weight_bytes + cache_read if len(tokens) > 1 else 0.0,
            decode_cache_read_bytes=cache_read,
        )
        yield Finished(text=text, reasoning=reasoning, answer=answer, token_ids=tokens, stats=stats)
