"""Continuous batching: many sequences share every step of one model.

Contract: submit() takes a prompt's token ids, its own sampling settings, its own GenerationControl (cancel,
stop thinking) and a sink, and returns at once; each call of step() runs one forward pass for a batch of sequences
and sends every sequence's events to its sink: Started once its prompt is in the cache, Delta as its text grows,
then one Finished (or one Failed). Sequences join and leave between steps (iteration-level scheduling, as in
vLLM and nano-vllm). Knows nothing about Qt or HTTP: the CLI, the local server and the window drive it.

A step holds every decoding sequence (one token each) and prefill chunks of the sequences still reading their
prompts: at most `chunk` tokens of each, `prefill_tokens` in all, so a long prompt that arrives pauses the others for
about one chunk's prefill, not its whole prompt, and prompts that arrive together are read together. Chunks end at
multiples of `chunk` (or at the prompt's end), whatever else runs: with paged_model's batch-invariant rows, a greedy
sequence's text is the same alone or in any batch on the CPU.

Memory: a sequence holds KV blocks (kv_blocks.BlockPool) for its text. It is admitted when blocks for its whole
prompt are free (after reusing the prompt's cached prefix); each decode step that crosses a block boundary takes
one more. When none is free, the sequence admitted last is preempted: its blocks go back, it returns to the front
of the queue with the text it has so far, and is recomputed later (mostly from the prefix cache). A reply is never
killed for want of memory. n parallel samples of one prompt (submit_samples) wait for the first one's prefill, then
reuse its full blocks from the prefix cache and compute only the partial last block each.

Sampling is per sequence: its temperature, top-p, top-k, its own random generator seeded from its seed, so a seed
gives the same text whether the sequence runs alone or beside others; an API client's further options (penalties,
logit bias, logprobs, a grammar) through its own logits_processing.LogitsPipeline.

A step that raises fails no one yet: every running sequence is set aside, the step's own are recomputed one at a
time up to where it failed, and only the one whose step fails alone gets Failed. The others go on.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch

from model_loader.chat import STOP_THINKING_TEXT
from model_loader.errors import ContextFullError, ModelError, check_room
from model_loader.events import Failed, Finished, GenerationControl, GenerationStats, SamplingSettings, Started
from model_loader.kv_blocks import BlockPool, BlockTable
from model_loader.kv_cache import KV_16BIT
from model_loader.paged_model import PagedForward, PagedKVCache, SeqSlice
from model_loader.reply_text import ReplyText
from model_loader.logits_processing import LogitsPipeline
from model_loader.sampling import SamplerParams, sort_sample

log = logging.getLogger(__name__)

Sink = Callable[[object], None]


@dataclass
class SchedulerConfig:
    max_seqs: int = 8  # sequences in a step at most
    chunk: int = 512  # prefill tokens a sequence feeds a step at most
    # prefill tokens a step takes in all (whole chunks of several sequences): requests arriving together start
    # together. 16 HTTP clients whose replies end together come back as 16 prompts: at one a step the last one's
    # first token waits 16 prefill steps, at four a step four (docs/BENCHMARKS.md, 'Under real HTTP clients').
    prefill_tokens: int = 2048
    block_size: int = 64  # tokens a KV block holds
    kv_cache: str = KV_16BIT  # the paged cache's format: "16-bit" (the model's dtype) or "8-bit" (kv_cache.py)
    # a fresh prompt alone in a step replays a captured graph (PagedForward.capture_prefill_graphs); the
    # environment's R1DESK_PREFILL_GRAPHS=0 turns that off everywhere a scheduler is made (an A/B switch)
    prefill_graphs: bool = dataclasses.field(
        default_factory=lambda: os.environ.get("R1DESK_PREFILL_GRAPHS", "1") != "0"
    )
    # while the same sequences decode, the next step is launched with the samples still on the device, before the
    # host reads them and does its bookkeeping (text, events, blocks): the GPU does not idle between steps. The
    # environment's R1DESK_OVERLAP=0 turns that off (an A/B switch)
    overlap: bool = dataclasses.field(default_factory=lambda: os.environ.get("R1DESK_OVERLAP", "1") != "0")


class Sequence:
    """One request's state: its text so far (prompt + generated), how much of it is in the cache, its blocks."""

    def __init__(
        self,
        seq_id: int,
        prompt_ids: list[int],
        settings: SamplingSettings,
        control: GenerationControl,
        reply: ReplyText,
        sink: Sink,
        seed: int,
        after: "Sequence | None",
    ):
        self.id = seq_id
        self.tokens = list(prompt_ids)
        self.n_prompt = len(prompt_ids)
        self.settings, self.control, self.reply, self.sink = settings, control, reply, sink
        self.seed = seed
        self.after = after  # a sibling sample whose prompt prefill this one waits for (its prefix to reuse)
        self.table = BlockTable()
        self.computed = 0  # leading tokens whose K/V are in the cache
        self.reused: int | None = None  # prompt tokens found in the prefix cache at first admission
        self.status = "waiting"  # waiting | running | finished
        self.isolate_until = 0  # after a failed step: run alone until this many tokens are computed
        self.forced: deque[int] = deque()  # tokens to take instead of samples (stop thinking's close tag)
        self.pushed_close = False
        self.forced_taken = 0
        self.submitted_at = time.perf_counter()
        self.times: list[float] = []  # when each generated token reached the host
        self.first_answer_at: float | None = None
        self.generator: torch.Generator | None = None
        self.params: SamplerParams | None = None
        self.pipeline: LogitsPipeline | None = None  # settings past temperature/top-p/top-k (API clients)

    @property
    def output(self) -> list[int]:
        return self.tokens[self.n_prompt :]

    @property
    def pending(self) -> int:
        """Tokens of its text not yet in the cache: 1 while decoding, more while (re)reading its prompt."""
        return len(self.tokens) - self.computed

    @property
    def greedy(self) -> bool:
        return self.settings.temperature <= 0


@dataclass
class LaunchedStep:
    """A decode step given to the device whose samples the host has not read yet: `ids` on the device, on a GPU
    copied into pinned memory behind an event, so reading them waits for this step alone, not for a step
    launched after it."""

    batch: list[tuple[Sequence, int]]
    ids: torch.Tensor
    host: torch.Tensor | None = None
    ready: object = None  # torch.cuda.Event

    @classmethod
    def of(cls, batch: list[tuple[Sequence, int]], ids: torch.Tensor) -> "LaunchedStep":
        if ids.device.type != "cuda":
            return cls(batch, ids)
        host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
        host.copy_(ids, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return cls(batch, ids, host, ready)

    def read(self) -> list[int]:
        if self.ready is None:
            return self.ids.tolist()
        self.ready.synchronize()
        return self.host.tolist()


class Scheduler:
    def __init__(self, model, chat, num_blocks: int, config: SchedulerConfig | None = None):
        """model: a loaded qwen2.Qwen2Model; chat: its chat.ChatFormat (tokenizer, stop ids, the reasoning's close
        tag); num_blocks: KV blocks of config.block_size tokens to allocate (see blocks_that_fit). Must be made on
        the thread that will call step(): on a GPU it captures the decode steps' CUDA graphs."""
        self.model, self.chat = model, chat
        self.config = config or SchedulerConfig()
        if self.config.chunk % self.config.block_size:
            raise ValueError("the prefill chunk must be a whole number of KV blocks")
        self.pool = BlockPool(num_blocks, self.config.block_size)
        self.cache = PagedKVCache(model, num_blocks, self.config.block_size, self.config.kv_cache)
        self.forward = PagedForward(model, self.cache, max_batch=self.config.max_seqs)
        self.int4pack_rows: dict = {}  # Linears.choose_int4pack_rows' timings, where it timed any
        if model.device.type == "cuda":
            # a 4-bit model in torch's layout: its decode rows through the faster of torch's int4 kernel and
            # dequantise + cuBLAS, chosen before the graphs capture them
            self.int4pack_rows = model.linear.choose_int4pack_rows(model.w, self.forward.graph_buckets())
            self.forward.capture_decode_graphs()  # on this thread, the one that will call step()
            if self.config.prefill_graphs:
                self.forward.capture_prefill_graphs(self.config.chunk)
        self.max_ctx = model.max_ctx
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is preempted first
        self._incoming: deque[Sequence] = deque()  # submit() from any thread; step() takes them in
        self._solo: deque[Sequence] = deque()  # sequences of a failed step, to run one at a time
        self._ids = 0
        self._lock = threading.Lock()  # submit() from several threads: sequence ids
        self._close_tag = chat.encode_plain(STOP_THINKING_TEXT) if chat.think_close_id is not None else []
        self._launched: LaunchedStep | None = None  # with config.overlap: a step whose samples are unread
        self.steps = 0
        self.overlapped_steps = 0  # steps launched before the host read the samples of the step before
        self.tokens_generated = 0
        self.preemptions = 0

    # ---------------------------------------------------------------- sizing
    @staticmethod
    def blocks_that_fit(model, block_size: int, free_bytes: int, share: float = 0.9, kind: str = KV_16BIT) -> int:
        """How many KV blocks `share` of free_bytes holds (the rest stays for activations and the allocator)."""
        return max(0, int(free_bytes * share) // PagedKVCache.bytes_per_block(model, block_size, kind))

    @classmethod
    def blocks_for_device(cls, model, block_size: int, max_seqs: int, kind: str = KV_16BIT) -> int:
        """A paged cache for max_seqs sequences of the whole context each, or what the device's free memory holds
        if less (a GPU's: 90% of it; the CPU's: half of the available RAM). ModelError if not even one sequence
        of the whole context fits."""
        from model_loader.context import host_memory

        per_seq = -(-model.max_ctx // block_size)
        if model.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(model.device)
            fit = cls.blocks_that_fit(model, block_size, free, kind=kind)
        else:
            available, _ = host_memory()
            fit = (
                per_seq * max_seqs
                if available is None
                else cls.blocks_that_fit(model, block_size, available, 0.5, kind=kind)
            )
        if fit < per_seq:
            tokens = fit * block_size
            raise ModelError(
                f"the GPU has room for a KV cache of {tokens:,} tokens, less than the context of "
                f"{model.max_ctx:,}: choose a shorter context length or 4-bit (AWQ) weights"
            )
        return min(fit, per_seq * max_seqs + 1)

    # ---------------------------------------------------------------- clients (any thread)
    def submit(
        self,
        prompt_ids: list[int],
        settings: SamplingSettings | None = None,
        control: GenerationControl | None = None,
        in_reasoning: bool = False,
        sink: Sink | None = None,
        after: Sequence | None = None,
    ) -> Sequence:
        """Queue a prompt. Its events go to sink (called on the thread that runs step()). Raises
        ContextFullError for a prompt that can never run here (longer than the context, or than the whole
        cache)."""
        settings = settings or SamplingSettings()
        n = len(prompt_ids)
        if n == 0:
            raise ModelError("empty prompt")
        if n >= self.max_ctx:
            raise ContextFullError(
                f"the conversation is {n} tokens and the context holds {self.max_ctx}; "
                "start a new chat or raise the context length"
            )
        check_room(n, settings, self.max_ctx)
        if self.pool.blocks_for(n + 1) > self.pool.num_blocks:
            raise ContextFullError(
                f"the conversation is {n} tokens and the KV cache holds "
                f"{self.pool.num_blocks * self.pool.block_size}; start a new chat"
            )
        vocab = self.model.cfg.vocab_size
        if any(not 0 <= t < vocab for t in prompt_ids):
            raise ModelError(f"the prompt holds a token id outside the model's vocabulary (0..{vocab - 1})")
        seed = settings.seed if settings.seed is not None else int.from_bytes(os.urandom(4), "little")
        stop_ids = frozenset() if settings.ignore_eos else self.chat.stop_ids
        reply = ReplyText(self.chat.tokenizer, stop_ids, in_reasoning, settings.verbatim)
        with self._lock:
            self._ids += 1
            seq = Sequence(
                self._ids,
                prompt_ids,
                settings,
                control or GenerationControl(),
                reply,
                sink or (lambda event: None),
                seed,
                after,
            )
            self._incoming.append(seq)
        return seq

    def submit_samples(
        self,
        prompt_ids: list[int],
        settings: SamplingSettings,
        n: int,
        in_reasoning: bool = False,
        sinks: list[Sink] | None = None,
        controls: list[GenerationControl] | None = None,
    ) -> list[Sequence]:
        """n samples of one prompt: seeds seed, seed+1, ... (random if unset); all but the first wait for the
        first's prefill and reuse its blocks."""
        base = settings.seed if settings.seed is not None else int.from_bytes(os.urandom(4), "little")
        seqs: list[Sequence] = []
        for i in range(n):
            s = dataclasses.replace(settings, seed=(base + i) % (1 << 63))
            seqs.append(
                self.submit(
                    prompt_ids,
                    s,
                    controls[i] if controls else None,
                    in_reasoning,
                    sinks[i] if sinks else None,
                    after=seqs[0] if seqs else None,
                )
            )
        return seqs

    def snapshot(self) -> dict:
        """Counts for a metrics page, safe to read from another thread: each is a plain int or a length, consistent
        on its own (not with the others: a step may run between two of them)."""
        pool = self.pool
        return {
            "running": len(self.running),
            "waiting": len(self.waiting) + len(self._incoming),
            "kv_blocks_used": pool.used_blocks,
            "kv_blocks_free": pool.free_blocks,
            "kv_block_tokens": pool.block_size,
            "prefix_cache_hits": pool.hits,
            "prefix_cache_lookups": pool.lookups,
            "preemptions": self.preemptions,
            "steps": self.steps,
            "tokens_generated": self.tokens_generated,
        }

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self._incoming or self._launched)

    def end_all(self, reason: str = "cancelled", message: str = "") -> None:
        """End every sequence now, on the stepping thread: "cancelled" finishes each with what it wrote so far
        (Finished); any other reason fails it (Failed(message, kind=reason)). The cache stays usable."""
        self._drop_launched()
        while self._incoming:
            self.waiting.append(self._incoming.popleft())
        for seq in [*self.running, *self.waiting]:
            if reason == "cancelled":
                self._finish(seq, "cancelled")
            else:
                self._leave(seq)
                self._send(seq, Failed(message, kind=reason))

    def close(self) -> None:
        """End what is still queued or running (Failed "unloaded"), then free the paged cache and the decode
        graphs. Call on the thread that steps the scheduler."""
        self.end_all("unloaded", "the model was unloaded before this reply ended")
        self.forward.graphs.clear()
        self.forward.prefill_graphs.clear()
        self.cache.k = self.cache.v = self.cache.k_scale = self.cache.v_scale = None

    def run_until_idle(self) -> None:
        while self.has_work():
            self.step()

    # ---------------------------------------------------------------- the step
    def step(self) -> bool:
        """One forward pass over a batch of sequences. False when there was nothing to run."""
        if self._launched is not None:
            return self._read_launched()
        while self._incoming:
            self.waiting.append(self._incoming.popleft())
        self._apply_controls()
        batch = self._schedule()
        if not batch:
            return False
        tokens, positions, slices = [], [], []
        for seq, stop in batch:
            start = seq.computed
            slices.append(SeqSlice(len(tokens), stop - start, stop, seq.table.blocks, stop == len(seq.tokens)))
            tokens += seq.tokens[start:stop]
            positions += range(start, stop)
        overlap = self.config.overlap and all(self._samples_on_device(seq, stop) for seq, stop in batch)
        try:
            logits = self.forward.step(tokens, positions, slices)
            if overlap:
                self._launched = LaunchedStep.of(batch, self._device_samples([seq for seq, _ in batch], logits))
            else:
                chosen = self._sample([seq for seq, stop in batch if stop == len(seq.tokens)], logits)
        except Exception as err:  # noqa: BLE001 - isolated below: only the sequence that fails alone is told
            self._step_failed(batch, err)
            return True
        if overlap:
            return self._read_launched()
        self._complete(batch, chosen)
        return True

    def _complete(self, batch: list[tuple[Sequence, int]], chosen: list[tuple[Sequence, int]]) -> None:
        """A step's results: its tokens are in the cache, its samples join their sequences. A sequence that ended
        after an overlapped step was launched has its row skipped; one cancelled since the step began takes no
        more tokens (the next step ends it with what it had when the cancel came)."""
        self.steps += 1
        for seq, stop in batch:
            if seq.status != "running":
                continue
            stop = min(stop, len(seq.tokens))  # an overlapped step's row past a sample dropped for a cancel
            seq.computed = stop
            self.pool.register(seq.table, seq.tokens, stop)
            if self._solo and seq is self._solo[0] and stop >= seq.isolate_until:
                self._solo.popleft()
        now = time.perf_counter()
        for seq, token in chosen:
            if seq.status == "running" and not seq.control.cancelled:
                self._take_token(seq, token, now)

    # ---------------------------------------------------------------- overlapped decode steps
    def _samples_on_device(self, seq: Sequence, stop: int) -> bool:
        """Whether this batch row's sample can stay on the device for the step after: a decoding sequence that
        samples without host work (no logits pipeline, no forced close tag)."""
        return seq.pending == 1 and stop == len(seq.tokens) and seq.pipeline is None and not seq.forced

    def _device_samples(self, seqs: list[Sequence], logits: torch.Tensor) -> torch.Tensor:
        """Each sequence's next token, by its own settings and random stream, as a device tensor [B]."""
        if all(seq.greedy for seq in seqs):
            return torch.argmax(logits, dim=-1)
        rows = [
            torch.argmax(logits[i : i + 1], dim=-1)
            if seq.greedy
            else sort_sample(logits[i : i + 1], seq.params, seq.generator)
            for i, seq in enumerate(seqs)
        ]
        return torch.cat(rows)

    def _read_launched(self) -> bool:
        """Launch the next step of the same sequences first where it can go (`_launch_next`), then read this
        step's samples and do the host's part while the device runs it."""
        launched, self._launched = self._launched, None
        following = self._launch_next(launched)
        try:
            ids = launched.read()
        except Exception as err:  # noqa: BLE001 - an asynchronous device error: as any failed step
            self._step_failed([(seq, stop) for seq, stop in launched.batch if seq.status == "running"], err)
            return True
        self._complete(launched.batch, [(seq, token) for (seq, _), token in zip(launched.batch, ids)])
        self._launched = following
        return True

    def _launch_next(self, launched: LaunchedStep) -> LaunchedStep | None:
        """The next decode step of the sequences of `launched`, fed its unread samples, where nothing can change
        that step: no arrival could join it (or no slot is free), every running sequence is in it and will go on
        after this sample (its token limit and the context permitting), none is cancelled or asked to stop
        thinking, and a KV block for the new position is free for each without preempting anyone. None where it
        can't go, or if launching it raised (the step then runs again unoverlapped, where a failure is isolated
        as always)."""
        if not self.config.overlap or self._solo or self._incoming:
            return None
        if self.waiting and (
            len(self.running) < self.config.max_seqs or any(s.control.cancelled for s in self.waiting)
        ):
            return None
        seqs = [seq for seq, _ in launched.batch]
        if len(seqs) != len(self.running):
            return None
        for seq in seqs:
            n = len(seq.tokens) + 1  # its text once this sample joins it
            limit = seq.settings.max_new_tokens
            if seq.status != "running" or seq.control.cancelled or self._would_stop_thinking(seq):
                return None
            if n >= self.max_ctx or (limit is not None and n - seq.n_prompt >= limit):
                return None
        bs = self.pool.block_size
        growing = [seq for seq in seqs if len(seq.table.blocks) * bs < len(seq.tokens) + 1]
        if len(growing) > self.pool.free_blocks:
            return None
        for seq in growing:
            self.pool.grow(seq.table, len(seq.tokens) + 1)
        positions = [len(seq.tokens) for seq in seqs]
        slices = [SeqSlice(i, 1, p + 1, seq.table.blocks, True) for i, (seq, p) in enumerate(zip(seqs, positions))]
        streams = [(seq.generator, seq.generator.get_state()) for seq in seqs if seq.generator is not None]
        try:
            logits = self.forward.step(launched.ids, positions, slices)
            following = LaunchedStep.of(
                [(seq, p + 1) for seq, p in zip(seqs, positions)], self._device_samples(seqs, logits)
            )
        except Exception as err:  # noqa: BLE001 - run again without overlap: _step_failed isolates it there
            for generator, state in streams:  # the rerun draws what this one drew: a seed keeps its text
                generator.set_state(state)
            log.warning("an overlapped step failed to launch (%s: %s); running it on its own", type(err).__name__, err)
            return None
        self.overlapped_steps += 1
        return following

    def _would_stop_thinking(self, seq: Sequence) -> bool:
        """A stop-thinking request that the next unoverlapped step would act on (as _apply_controls does)."""
        return (
            seq.control.stop_thinking_asked
            and seq.reply.in_reasoning
            and not seq.pushed_close
            and bool(self._close_tag)
        )

    def _drop_launched(self) -> None:
        """Wait for a launched step and forget its samples (the sequences are ending)."""
        launched, self._launched = self._launched, None
        if launched is not None:
            try:
                launched.read()
            except Exception:  # noqa: BLE001 - the step's sequences end anyway
                log.debug("a launched step failed while its sequences ended", exc_info=True)

    def _schedule(self) -> list[tuple[Sequence, int]]:
        """The step's sequences and where each one's new tokens end."""
        if self._solo:
            return self._schedule_solo(self._solo[0])
        batch: list[tuple[Sequence, int]] = []
        for seq in [s for s in self.running if s.pending == 1]:
            if seq.status == "running" and self._make_room(seq):
                batch.append((seq, len(seq.tokens)))
        decoding = len(batch)
        budget = max(self.config.chunk, self.config.prefill_tokens) + decoding
        used = decoding

        def fits(n: int) -> bool:  # a step always takes one prefill chunk, more while they fit
            return used == decoding or used + n <= budget

        for seq in [s for s in self.running if s.pending > 1]:
            stop = self._chunk_end(seq)
            if fits(stop - seq.computed):
                batch.append((seq, stop))
                used += stop - seq.computed
        for seq in list(self.waiting):
            if len(self.running) >= self.config.max_seqs or not fits(1):
                break
            if seq.after is not None and seq.after.status != "finished" and seq.after.computed < seq.n_prompt:
                continue  # a sibling sample: its prompt's blocks come from the first sample once that has run
            if not self._admit(seq):
                break  # first come, first served: a later, smaller prompt does not pass it
            stop = self._chunk_end(seq)
            if fits(stop - seq.computed):
                batch.append((seq, stop))
                used += stop - seq.computed
        return batch

    def _schedule_solo(self, seq: Sequence) -> list[tuple[Sequence, int]]:
        if seq.status == "waiting":
            if not self._admit(seq):
                return []
        elif seq.pending == 1 and not self._make_room(seq):
            return []
        return [(seq, self._chunk_end(seq))]

    def _chunk_end(self, seq: Sequence) -> int:
        chunk = self.config.chunk
        return min(len(seq.tokens), (seq.computed // chunk + 1) * chunk)

    def _admit(self, seq: Sequence) -> bool:
        n = len(seq.tokens)
        if self.pool.blocks_needed(seq.tokens, n, n - 1) > self.pool.free_blocks:
            return False
        seq.computed = self.pool.allocate(seq.table, seq.tokens, n, n - 1)
        if seq.reused is None:
            seq.reused = seq.computed
        self.waiting.remove(seq)
        self.running.append(seq)
        seq.status = "running"
        if seq.pipeline is None and not seq.settings.plain:
            seq.pipeline = LogitsPipeline(
                seq.settings,
                self.model.cfg.vocab_size,
                self.model.device,
                seq.tokens[: seq.n_prompt],
                seq.reply.in_reasoning,
            )
        if seq.generator is None and not seq.greedy:
            seq.generator = torch.Generator(device=self.model.device).manual_seed(seq.seed)
            seq.params = SamplerParams(self.model.device)
            seq.params.set(seq.settings.temperature, seq.settings.top_p, seq.settings.top_k, self.model.cfg.vocab_size)
        return True

    def _make_room(self, seq: Sequence) -> bool:
        """A block for the token this decoding sequence feeds next, preempting the sequences admitted last
        while none is free. False if `seq` itself had to go."""
        while len(seq.table.blocks) * self.pool.block_size < len(seq.tokens):
            if self.pool.free_blocks:
                self.pool.grow(seq.table, len(seq.tokens))
                return True
            log.info(
                "preempting sequence %d (%d tokens) for lack of KV blocks",
                self.running[-1].id,
                len(self.running[-1].tokens),
            )
            victim = self.running[-1]
            self._preempt(victim)
            self.preemptions += 1
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        """Give its blocks back and queue it first: it is recomputed from its text so far when blocks free up."""
        self.pool.release(seq.table)
        seq.computed = 0
        seq.status = "waiting"
        self.running.remove(seq)
        self.waiting.appendleft(seq)

    # ---------------------------------------------------------------- tokens
    def _sample(self, seqs: list[Sequence], logits: torch.Tensor) -> list[tuple[Sequence, int]]:
        """Each sequence's next token from its row of logits, by its own settings and random stream."""
        if not seqs:
            return []
        greedy_rows = [i for i, seq in enumerate(seqs) if seq.greedy and seq.pipeline is None]
        picks: list = [None] * len(seqs)
        if greedy_rows:
            rows = torch.tensor(greedy_rows, device=logits.device)
            for i, tok in zip(greedy_rows, torch.argmax(logits.index_select(0, rows), dim=-1).tolist()):
                picks[i] = tok
        for i, seq in enumerate(seqs):
            if seq.pipeline is not None:
                picks[i] = seq.pipeline.choose(logits[i : i + 1], seq.generator)
            elif not seq.greedy:
                picks[i] = sort_sample(logits[i : i + 1], seq.params, seq.generator)
        return [(seq, int(tok)) for seq, tok in zip(seqs, picks)]

    def _take_token(self, seq: Sequence, token: int, now: float) -> None:
        forced = bool(seq.forced)
        if forced:
            token = seq.forced.popleft()
            seq.forced_taken += 1
        seq.tokens.append(token)
        seq.times.append(now)
        self.tokens_generated += 1
        if len(seq.times) == 1:
            self._send(
                seq,
                Started(prompt_tokens=seq.n_prompt, prefix_reused_tokens=seq.reused or 0, context_length=self.max_ctx),
            )
        if seq.pipeline is not None:
            seq.pipeline.observe(token)
            scored = seq.pipeline.take_logprobs(
                token, self.chat.tokenizer, "reasoning" if seq.reply.in_reasoning else "answer"
            )
            if scored is not None:
                self._send(seq, scored)
        was_reasoning = seq.reply.in_reasoning
        deltas = seq.reply.add(token)
        if seq.pipeline is not None:
            seq.pipeline.accept(token, seq.reply.in_reasoning)
        if was_reasoning and not seq.reply.in_reasoning and not forced:
            seq.forced.clear()  # the model closed its reasoning itself: no tag goes into its answer
        if seq.first_answer_at is None and any(d.kind == "answer" for d in deltas):
            seq.first_answer_at = now
        for delta in deltas:
            self._send(seq, delta)
        finish = self._finish_reason(seq, token)
        if finish is not None:
            self._finish(seq, finish)

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        if token in seq.reply.stop_ids:
            return "eos"
        if seq.settings.max_new_tokens is not None and len(seq.output) >= seq.settings.max_new_tokens:
            return "max_new_tokens"
        if len(seq.tokens) >= self.max_ctx:
            return "context_full"
        return None

    def _apply_controls(self) -> None:
        """Cancels end their sequences; a stop-thinking request queues the close tag in place of the next
        samples."""
        for seq in [s for s in (*self.running, *self.waiting) if s.control.cancelled]:
            self._finish(seq, "cancelled")
        for seq in self.running:
            if seq.reply.in_reasoning and not seq.pushed_close and self._close_tag and seq.control.take_stop_thinking():
                seq.forced.extend(self._close_tag)
                seq.pushed_close = True

    def _leave(self, seq: Sequence) -> None:
        self.pool.release(seq.table)
        if seq.status == "running":
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self._solo:
            self._solo.remove(seq)
        seq.status = "finished"

    def _finish(self, seq: Sequence, reason: str) -> None:
        self._leave(seq)
        for delta in seq.reply.flush():
            self._send(seq, delta)
        end = time.perf_counter()
        times = seq.times
        decode_s = times[-1] - times[0] if len(times) > 1 else 0.0
        stats = GenerationStats(
            finish_reason=reason,
            prompt_tokens=seq.n_prompt,
            completion_tokens=len(seq.output),
            reasoning_tokens=seq.reply.reasoning_tokens,
            prefix_reused_tokens=seq.reused or 0,
            context_length=self.max_ctx,
            ttft_ms=(times[0] - seq.submitted_at) * 1000.0 if times else 0.0,
            first_answer_ms=(seq.first_answer_at - seq.submitted_at) * 1000.0 if seq.first_answer_at else None,
            decode_tok_s=(len(times) - 1) / decode_s if decode_s > 0 else 0.0,
            total_s=end - seq.submitted_at,
            token_latencies_ms=[(b - a) * 1000.0 for a, b in zip(times, times[1:])],
            stopped_thinking=seq.forced_taken > 0 and not seq.reply.in_reasoning,
            seed=None if seq.greedy else seq.seed,
        )
        reply = seq.reply
        self._send(
            seq,
            Finished(
                text=reply.text, reasoning=reply.reasoning, answer=reply.answer, token_ids=seq.output, stats=stats
            ),
        )

    def _step_failed(self, batch: list[tuple[Sequence, int]], err: Exception) -> None:
        """A step raised. Alone, its sequence fails. Together, each is recomputed alone up to where the step
        stopped (the cache past what they had computed may hold half a step, never a registered block)."""
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # an asynchronous error surfaces here, not in the next step
        if len(batch) == 1:
            seq = batch[0][0]
            log.error("sequence %d failed: %s: %s", seq.id, type(err).__name__, err)
            self._leave(seq)
            self._send(seq, Failed(*_failure(err)))
            return
        log.warning(
            "a step of %d sequences failed (%s: %s); running them one at a time", len(batch), type(err).__name__, err
        )
        for seq, stop in batch:
            seq.isolate_until = stop
        for seq in reversed(self.running):  # all of them: the one running alone must find its blocks free
            self._preempt(seq)
        self._solo.extend(seq for seq, _ in batch)

    def _send(self, seq: Sequence, event) -> None:
        try:
            seq.sink(event)
        except Exception:  # noqa: BLE001 - a client's sink must not stop the others' steps
            log.exception("sequence %d's event sink failed; cancelling it", seq.id)
            seq.control.cancel()


def _failure(err: Exception) -> tuple[str, str]:
    """(message, kind) of a sequence's failure: "oom", "error" (a ModelError: its message is for the user) or
    "internal" (a bug: its text is for logs, which _step_failed wrote)."""
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return "out of GPU memory while generating; try a shorter context length or 4-bit (AWQ) weights", "oom"
    if isinstance(err, ModelError):
        return str(err), "error"
    return f"generation failed inside the engine ({type(err).__name__}: {err})", "internal"
