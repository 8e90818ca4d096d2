"""The single-sequence engine's CUDA graphs: the decode step (one graph per sampling mode and per depth bucket's
decode attention shape, tuned at warm-up) and the prefill (one graph per length bucket, fresh prompts and prompts
after a cached prefix). Both belong to the thread that captured them (engine.py's contract)."""

from __future__ import annotations

import logging

import torch

from model_loader.forced_tokens import ForcedTokens
from model_loader.kernels.side_stream import graph_capture, side_stream
from model_loader.qwen2 import Qwen2Model
from model_loader.sampling import SamplerParams, greedy, sample

log = logging.getLogger(__name__)


class DecodeStep:
    """Static input/output buffers for one decode step, and its CUDA graphs: one per sampling mode and decode
    attention configuration. `plan` maps depth buckets to the configuration tuned for them at warm-up (tune());
    the host knows each step's position, so it picks the graph without asking the GPU anything."""

    TUNE_REPLAYS = 4  # timed replays per configuration, depth and round (after one untimed one)
    TUNE_ROUNDS = 3

    def __init__(self, model: Qwen2Model, params: SamplerParams, use_graphs: bool, think_close_id: int | None):
        self.model, self.params, self.use_graphs = model, params, use_graphs
        self.token = torch.zeros(1, dtype=torch.int64, device=model.device)  # input; the committed token after
        self.pos = torch.zeros(1, dtype=torch.int32, device=model.device)
        self.forced = ForcedTokens(model.device, think_close_id, use_triton=model.use_triton)
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}  # (mode, attention config) -> graph
        self.outputs: dict[tuple, torch.Tensor] = {}  # (mode, attention config) -> the graph's logits [1, V]
        self.plan: list[tuple[int, object]] = [(model.max_ctx, None)]  # (largest depth, config); None = default
        self.generator: torch.Generator | None = None  # CPU only; CUDA uses the graph-safe default generator
        self.tuned_us: dict = {}  # tune(): {upper depth: {config: us per step}}

    def config_for(self, length: int):
        """The attention configuration for a step that attends over `length` cached tokens."""
        return next((config for upper, config in self.plan if length <= upper), self.plan[-1][1])

    def _step(self, mode: str, pos: int, config) -> torch.Tensor:
        """mode: "greedy" or "sample" (the step chooses and commits the next token), or "logits" (it stops at
        the logits [1, V]: the host's logits_processing chooses, then commit() takes it)."""
        self.model.set_decode_attention_config(config)
        logits = self.model.decode(self.token, self.pos, pos, float_logits=False)  # no fp32 copy of 152k logits
        if mode == "logits":
            return logits
        nxt = greedy(logits) if mode == "greedy" else self.sample(logits)
        self.forced.commit(nxt, self.token, self.pos)  # token <- nxt or a forced token; pos += 1
        return logits

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        """The sampled next token [1]: the fused sampler only where the model runs Triton's kernels."""
        return sample(logits, self.params, self.generator, fused=self.model.use_triton)

    def use_spans(self, spans: list[int]) -> None:
        """Without Triton: one graph per span of the cache the decode attention reads (torch_graph_ops), each
        serving the depths up to it; nothing to tune."""
        self.plan = [(span, span) for span in spans]

    def commit(self, nxt: torch.Tensor) -> None:
        """After a "logits" step: the chosen token [1] (or a forced one) becomes the next step's input."""
        self.forced.commit(nxt, self.token, self.pos)

    def captured(self, mode: str) -> bool:
        return not self.use_graphs or all((mode, config) in self.graphs for _, config in self.plan)

    def capture(self, mode: str) -> None:
        """Capture this mode's graph for every configuration in the plan (once each)."""
        for config in dict.fromkeys(config for _, config in self.plan):
            if not self.use_graphs or (mode, config) in self.graphs:
                continue
            stream = side_stream(self.model.device)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), torch.inference_mode():
                for _ in range(2):  # warm-up outside the graph: Triton JIT, cuBLAS workspaces
                    self.pos.zero_()
                    self._step(mode, 0, config)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            self.pos.zero_()
            with graph_capture(graph, self.model.device), torch.inference_mode():
                self.outputs[(mode, config)] = self._step(mode, 0, config)
            self.graphs[(mode, config)] = graph

    def tune(self, configs, buckets: list[int]) -> dict:
        """Choose each depth bucket's decode attention configuration by timing the whole decode step: a greedy
        graph captured per configuration, replayed at the top of each bucket. Timed alone, the attention ranks
        its shapes differently than inside the step, where its kernels overlap their neighbours (programmatic
        dependent launch): the shape that is fastest alone at short contexts makes the bf16 step measurably slower
        than another. The configurations take turns, TUNE_ROUNDS rounds of TUNE_REPLAYS replays each, and each
        one's median counts, so a passing clock change doesn't pick the winner. Sets `plan`, keeps the chosen
        graphs and returns {"plan", "timings_us": {upper depth: {config: us per step}}}. Configurations this GPU
        can't run are skipped."""
        for config in configs:
            self.plan = [(self.model.max_ctx, config)]
            try:
                self.capture("greedy")
            except torch.cuda.OutOfMemoryError:
                raise  # not this configuration's fault: the warm-up reports it
            except Exception as err:  # e.g. more shared memory than this GPU has: the others still serve
                log.warning("decode attention %s can't run here: %s", config, err)
        timings, plan = {}, []
        for upper in buckets:
            # replays from `first` on: the last timed one attends over `upper` tokens
            first = max(0, upper - 1 - self.TUNE_REPLAYS)
            runs: dict = {config: [] for config in configs if ("greedy", config) in self.graphs}
            for _ in range(self.TUNE_ROUNDS):
                for config, times in runs.items():
                    times.append(self.time_replays(self.graphs[("greedy", config)], first))
            row = {config: sorted(times)[len(times) // 2] for config, times in runs.items()}
            # none could run: the default, whose capture below then reports why
            plan.append((upper, min(row, key=row.get) if row else configs[0]))
            timings[upper] = {str(config): round(us, 1) for config, us in row.items()}
        chosen = {config for _, config in plan}
        for config in configs:
            if config not in chosen:
                self.graphs.pop(("greedy", config), None)
                self.outputs.pop(("greedy", config), None)
        self.plan, self.tuned_us = plan, timings
        return {"plan": plan, "timings_us": timings}

    def time_replays(self, graph, first: int, replays: int | None = None) -> float:
        """GPU microseconds per replay of a decode graph from position `first` (each replay advances it; one
        untimed replay first). replays: TUNE_REPLAYS unless given (benchmarks time more)."""
        replays = replays or self.TUNE_REPLAYS
        self.pos.fill_(first)
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000.0 / replays

    def run(self, mode: str, pos: int) -> torch.Tensor:
        """One step; returns its logits [1, V] (a graph's own buffer: read it before the next replay)."""
        config = self.config_for(pos + 1)
        graph = self.graphs.get((mode, config))
        if graph is not None:
            graph.replay()
            return self.outputs[(mode, config)]
        with torch.inference_mode():
            return self._step(mode, pos, config)


class PrefillGraphs:
    """Prefills by CUDA graphs captured per length bucket: the new tokens are padded to the next bucket, so a
    512-token prefill is one replay instead of ~450 launches from Python, which would make time to first token
    depend on the host CPU. Two graphs per bucket: fresh prompts (SDPA's causal flash attention) and prompts after a
    cached prefix (follow-up turns, the stop-thinking injection, regenerate), whose prefix length is a device
    input read by our Triton attention, so one graph serves any prefix; without Triton only the fresh ones (a
    follow-up prefills eagerly). All are captured at warm-up (nothing is compiled or captured after "ready") and
    share one memory pool (they never run at once)."""

    BUCKETS = (16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048)

    def __init__(self, model: Qwen2Model):
        self.model = model
        self.buckets = self.buckets_for(model.max_ctx, model.PREFILL_CHUNK)
        largest = self.buckets[-1]
        self.tokens = torch.zeros(largest, dtype=torch.int64, device=model.device)
        self.staging = torch.zeros(largest, dtype=torch.int64, pin_memory=model.device.type == "cuda")
        self.staging_np = self.staging.numpy()
        self.staged = None  # a CUDA event: the last copy out of the staging buffer has run
        self.last = torch.zeros(1, dtype=torch.int64, device=model.device)
        self.start = torch.zeros(1, dtype=torch.int32, device=model.device)  # 0 for the fresh graphs
        self.graphs: dict[tuple[bool, int], torch.cuda.CUDAGraph] = {}  # (fresh, bucket) -> graph
        self.outputs: dict[tuple[bool, int], torch.Tensor] = {}
        self.pool = None

    @classmethod
    def buckets_for(cls, max_ctx: int, chunk: int) -> tuple[int, ...]:
        """The buckets captured for a context of max_ctx tokens (none longer than a prefill chunk)."""
        return tuple(b for b in cls.BUCKETS if b <= min(max_ctx, chunk)) or cls.BUCKETS[:1]

    def bucket_for(self, n: int, start: int) -> int | None:
        """The smallest bucket that holds n new tokens and, padded, still ends inside the cache."""
        return next((b for b in self.buckets if b >= n and start + b <= self.model.max_ctx), None)

    def capture(self, bucket: int) -> None:
        for fresh in (True, False) if self.model.use_triton else (True,):
            key = (fresh, bucket)
            if key in self.graphs:
                continue
            tokens = self.tokens[:bucket]
            self.start.zero_()
            stream = side_stream(self.model.device)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), torch.inference_mode():
                self.model.prefill_static(tokens, self.last, self.start, fresh)  # warm-up outside the graph
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            with graph_capture(graph, self.model.device, self.pool), torch.inference_mode():
                self.outputs[key] = self.model.prefill_static(tokens, self.last, self.start, fresh)
            self.graphs[key] = graph

    def run(self, ids: list[int], start: int) -> torch.Tensor | None:
        """Logits [1, V] of the last of `ids` (new tokens at positions start..), or None if no captured bucket
        fits (then the caller prefills eagerly)."""
        key = (start == 0, self.bucket_for(len(ids), start))
        if key not in self.graphs:
            return None
        # Through a pinned staging buffer written by numpy: torch.tensor(list) is slow for thousands of ids, and
        # all of it comes ahead of the prefill on a follow-up's time to first token. The copy is queued ahead of the
        # replay on the same stream; the staging is rewritten only once the last copy out of it has run (it
        # has, unless a reply was abandoned before its first token was read).
        if self.staged is not None:
            self.staged.synchronize()
        self.staging_np[: len(ids)] = ids
        self.tokens[: len(ids)].copy_(self.staging[: len(ids)], non_blocking=True)
        if self.staging.is_pinned():
            self.staged = self.staged or torch.cuda.Event()
            self.staged.record()
        self.last.fill_(len(ids) - 1)
        self.start.fill_(start)
        self.graphs[key].replay()
        return self.outputs[key]
