"""The engine: load a Qwen2 folder onto a device, warm it up, and stream replies.

Contract: Engine.generate(messages, settings, control) yields Delta events (text tagged reasoning/answer)
and then one Finished event with the full text, the generated ids and the stats. It owns the KV cache and
reuses the longest cached prefix of every new prompt. On CUDA with Triton the decode step (forward +
sampling + position update) is one CUDA graph replayed once per token, and the host runs one step ahead of
the token it is waiting for, so the GPU never idles between tokens. CUDA graphs belong to the thread that
captured them: load, warm_up and generate must all run on the same thread.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Iterator

import torch

from model_loader.chat import (
    STOP_THINKING_TEXT,
    ChatFormat,
    history_message,
)
from model_loader.kv_cache import KV_16BIT
from model_loader.errors import ModelError, OutOfMemoryError
from model_loader.events import Delta, Finished, GenerationControl, SamplingSettings, Started
from model_loader import kernel_cache
from model_loader.locate import ModelFolder
from model_loader.qwen2 import Qwen2Model
from model_loader.sampling import SamplerParams
from model_loader.stats import memory_stats
from model_loader.device import use_device
from model_loader.decode_graphs import DecodeStep, PrefillGraphs
from model_loader.loading import OOM_ADVICE, EngineInfo, load_model
from model_loader.variants import kernel_variant as variant_of
from model_loader.warm_up import warm_up as run_warm_up
from model_loader.decode_loop import decode_reply

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, folder: ModelFolder, model: Qwen2Model, chat: ChatFormat, info: EngineInfo):
        self.folder, self.model, self.chat, self.info = folder, model, chat, info
        self.tokenizer = chat.tokenizer
        self.params = SamplerParams(model.device)
        self.step = DecodeStep(model, self.params, use_graphs=info.cuda_graphs, think_close_id=chat.think_close_id)
        self.prefill_graphs = PrefillGraphs(model) if info.cuda_graphs else None
        # encoded once: a reply needs it between its first token and its first decode step
        self.close_tag = chat.encode_plain(STOP_THINKING_TEXT)
        self.cache_tokens: list[int] = []  # ids whose K/V are valid at positions 0..len-1
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
        self.cache_tokens = []
        # No gc.collect(): the tensors are freed as their last references go (none is in a cycle), and the window
        # collects garbage on its GUI thread only, while this may run on the engine thread (a failed warm-up).
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def memory(self):
        kv = self.scheduler.cache.nbytes if self.scheduler is not None else self.model.kv_cache_bytes
        return memory_stats(self.model.device, self.model.weights_bytes, kv)

    AUTO_PARALLEL_CAP = 16  # `serve`'s default: beyond it each reply's share of a step's time grows for little more

    def parallel_that_fits(self, cap: int = AUTO_PARALLEL_CAP, block_size: int = 64, free_bytes: int | None = None):
        """How many replies at once the GPU's free memory holds at this engine's whole context, its own KV cache
        counted as free (serve_batched gives it back), up to cap: what `serve` decodes together by default. 1 on a
        CPU, or where two don't fit: the single-reply engine then serves, the fastest alone."""
        from model_loader.scheduler import Scheduler

        if self.model.device.type != "cuda" and free_bytes is None:
            return 1
        if free_bytes is None:
            device = self.model.device
            free_bytes, _ = torch.cuda.mem_get_info(device)
            # what torch holds in its cache unused goes back before the paged cache is sized (serve_batched)
            free_bytes += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        free_bytes += self.model.kv_cache_bytes if self.model.k_cache is not None else 0
        blocks = Scheduler.blocks_that_fit(self.model, block_size, free_bytes, kind=self.info.kv_cache)
        return max(1, min(cap, blocks // -(-self.model.max_ctx // block_size)))

    def serve_batched(self, max_seqs: int, block_size: int = 64):
        """Hand this engine's memory to a scheduler that runs up to max_seqs sequences at once (continuous
        batching: model_loader.scheduler) and return it. The single-sequence KV cache and its graphs are freed
        first, so the paged cache gets their memory; generate() is unavailable afterwards. Call after warm_up(),
        on the thread that will step the scheduler (it captures its decode graphs there)."""
        from model_loader.scheduler import Scheduler, SchedulerConfig

        use_device(self.model.device)
        self.step.graphs.clear()
        self.step.outputs.clear()
        if self.prefill_graphs is not None:
            self.prefill_graphs.graphs.clear()
            self.prefill_graphs.outputs.clear()
        self.model.k_cache = self.model.v_cache = self.model.k_scale = self.model.v_scale = None
        self.cache_tokens = []
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)
            torch.cuda.empty_cache()
        try:
            kind = self.info.kv_cache
            blocks = Scheduler.blocks_for_device(self.model, block_size, max_seqs, kind)
            config = SchedulerConfig(max_seqs=max_seqs, block_size=block_size, kv_cache=kind)
            if os.environ.get("R1DESK_PREFILL_TOKENS"):  # an A/B switch (docs/BENCHMARKS.md)
                config.prefill_tokens = int(os.environ["R1DESK_PREFILL_TOKENS"])
            self.scheduler = Scheduler(self.model, self.chat, blocks, config)
        except torch.cuda.OutOfMemoryError as err:
            torch.cuda.empty_cache()
            raise OutOfMemoryError(f"out of GPU memory for {max_seqs} replies at once; {OOM_ADVICE}") from err
        self.info.kv_cache_bytes = self.scheduler.cache.nbytes
        return self.scheduler

    def reset_cache(self) -> None:
        self.cache_tokens = []

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
            yield from decode_reply(
                self,
                prompt_ids,
                settings or SamplingSettings(),
                control or GenerationControl(),
                in_reasoning,
                started_at,
            )
        except torch.cuda.OutOfMemoryError as err:
            self.cache_tokens = []
            torch.cuda.empty_cache()
            raise OutOfMemoryError(f"out of GPU memory while generating; {OOM_ADVICE}") from err
        except BaseException:
            self.cache_tokens = []  # the cache may hold a half-written step; don't trust it
            raise
