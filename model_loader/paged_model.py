"""The Qwen2 forward pass for a batch of sequences over a paged KV cache: one step of continuous batching.

A step runs any mix of sequences: some feed one token (decoding), some a chunk of their prompt (prefilling). Their
new tokens are laid end to end ([T] rows, vLLM's "flattened" batch), so every linear layer is one GEMM over all of
them; only attention is per sequence, over the cache slots its block table names (kv_blocks.py).

Cache layout: K and V are [layers, KV heads, slots, head_dim] with slot = block * block_size + offset, so a block
of one head is one contiguous [block_size, head_dim] tile (what a paged attention kernel reads), and a sequence
whose blocks are consecutive is a plain slice of the same shape as the single-sequence engine's cache.

Batch-invariant on the CPU: a sequence's numbers do not depend on what else shares its step. Linear layers give
each row the same bits whatever the row count once there are enough rows (oneDNN takes other kernels for one to a
few rows, whose sums run in another order), so a step's rows are padded to MIN_ROWS on the CPU; attention is
computed per sequence; prefill chunks end at fixed positions (the scheduler's). On a GPU cuBLAS picks its kernel
by the row count, so outputs match a sequence run alone only to rounding (docs/BENCHMARKS.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from model_loader.kernels import reference
from model_loader.kv_cache import KV_8BIT, KV_16BIT, check_kv_cache
from model_loader.qwen2 import Qwen2Model

MIN_ROWS_CPU = 8
# Decode graphs are captured for at least this many rows, more than the sequences decoding at once: a step's short
# prompt continuations (a cached prefix's new turn) replay them row by row (PagedForward._plan).
MIN_GRAPH_ROWS = 32
# The cached tokens that the rows of multi-row sequences may read in all in a decode graph's replay: each row
# attends on its own there, so a continuation of r rows over c tokens reads its context r times (the eager step's
# attention reads it once). 2^18 tokens of the 1.5B's cache are ~7 GB, ~2 ms of an H100: a few eager launches.
ROW_GRAPH_READS = 1 << 18


class PagedKVCache:
    """K and V for every block of a kv_blocks.BlockPool, on the model's device: in the model's dtype (16-bit), or
    (8-bit) fp8 e4m3 rows with an fp32 scale per (layer, KV head, slot) row, quantized as the single-sequence
    cache's rows are (kv_cache.py; here V is row-major like K: the paged kernels read it a block's rows at a time)."""

    def __init__(self, model: Qwen2Model, num_blocks: int, block_size: int, kind: str = KV_16BIT):
        cfg = model.cfg
        self.kind = check_kv_cache(kind)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.dtype = model.dtype  # what attention reads
        shape = (cfg.num_hidden_layers, cfg.num_key_value_heads, num_blocks * block_size, cfg.head_dim)
        stored = torch.float8_e4m3fn if kind == KV_8BIT else model.dtype
        # zero-filled: a padded attention lane never reads uninitialised memory
        self.k = torch.zeros(shape, device=model.device, dtype=stored)
        self.v = torch.zeros(shape, device=model.device, dtype=stored)
        self.k_scale = self.v_scale = None
        if kind == KV_8BIT:
            self.k_scale = torch.zeros(shape[:-1], device=model.device, dtype=torch.float32)
            self.v_scale = torch.zeros(shape[:-1], device=model.device, dtype=torch.float32)

    @staticmethod
    def bytes_per_block(model: Qwen2Model, block_size: int, kind: str = KV_16BIT) -> int:
        cfg = model.cfg
        rows = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * block_size  # K and V rows of a block
        return rows * (cfg.head_dim + 4 if kind == KV_8BIT else cfg.head_dim * model.dtype.itemsize)

    @property
    def nbytes(self) -> int:
        tensors = (self.k, self.v) + ((self.k_scale, self.v_scale) if self.k_scale is not None else ())
        return sum(t.numel() * t.element_size() for t in tensors)

    def scales(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(k_scale, v_scale) [Hkv, slots] of a layer of an 8-bit cache; None for a 16-bit one."""
        return None if self.k_scale is None else (self.k_scale[layer], self.v_scale[layer])

    def gather(self, layer: int, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A layer's K and V at the slots in `index` (any shape): [Hkv, *index.shape, D] in the model's dtype,
        dequantized from an 8-bit cache as reference.cached_kv does."""
        if self.k_scale is None:
            return self.k[layer][:, index], self.v[layer][:, index]
        # fp8 moved as bytes: PyTorch's CPU indexing has no float8 kernels
        k, v = (t[layer].view(torch.uint8)[:, index].view(t.dtype) for t in (self.k, self.v))
        ks, vs = self.k_scale[layer][:, index], self.v_scale[layer][:, index]
        return (k.float() * ks[..., None]).to(self.dtype), (v.float() * vs[..., None]).to(self.dtype)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """K and V rows [n, Hkv, D] (fp32) into a layer's slots [n], rounded to the model's dtype or quantized
        (reference.quantize_fp8_rows, as the single-sequence cache writer)."""
        for cache, scale, rows in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
            rows = rows.transpose(0, 1)  # [Hkv, n, D]
            if scale is None:
                cache[layer].index_copy_(1, slots, rows.to(self.dtype))
            else:
                data, row_scale = reference.quantize_fp8_rows(rows)
                cache[layer].view(torch.uint8).index_copy_(1, slots, data.view(torch.uint8))
                scale[layer].index_copy_(1, slots, row_scale)


@dataclass
class SeqSlice:
    """One sequence's part of a step: rows row0..row0+rows-1 of the step's tokens, ending at position
    `context - 1` (so it attends over `context` cached tokens), its block table, and whether the step must return
    logits for its last row (a decode token, or the chunk that ends its prompt)."""

    row0: int
    rows: int
    context: int
    blocks: list[int]
    logits: bool


class PagedForward:
    """One batched step of a loaded Qwen2Model (its weights, linear kernels and norms) over a PagedKVCache.

    Where the model runs Triton's kernels, the cache writes and the decode attention are paged_ops' kernels, and
    a step runs as CUDA graphs wherever it can (eagerly, a step's ~450 launches from Python take longer than the
    GPU's work):
    - every sequence decoding: the decode graph captured for their count rounded up to a bucket
      (capture_decode_graphs), as the single-sequence engine's decode step does;
    - otherwise by sequence (_plan): a fresh prompt's chunk replays the prefill graph of its length rounded up to
      a bucket (capture_prefill_graphs), computing what it computes alone; decoding sequences and short
      continuations (a cached prefix's new turn) replay the decode graphs with one row per token, each row
      attending to the positions before it, packed up to the largest bucket a replay; what fits neither (a long
      prompt's later chunks, a long continuation) runs eagerly and attends per sequence with PyTorch ops (gather
      the context, then SDPA)."""

    GRAPH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
    PREFILL_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048)

    def __init__(self, model: Qwen2Model, cache: PagedKVCache, batched_decode: bool | None = None, max_batch: int = 8):
        """batched_decode: attend for all decoding sequences at once (one kernel, or one gather and one masked
        SDPA, a layer; not a few kernels per sequence); the default on a GPU. On the CPU each sequence attends
        alone, so its numbers don't depend on the others' lengths."""
        self.model, self.cache = model, cache
        self.min_rows = MIN_ROWS_CPU if model.device.type == "cpu" else 1
        self.batched_decode = model.device.type != "cpu" if batched_decode is None else batched_decode
        self.max_batch = max_batch
        # decode graphs' rows: beyond max_batch, for continuations replayed row by row (_plan), and a whole bucket
        # (so a step of max_batch decoding sequences has its graph)
        rows = max(max_batch, MIN_GRAPH_ROWS)
        self.max_rows = next((b for b in self.GRAPH_BUCKETS if b >= rows), rows)
        # the most blocks a sequence can hold, rounded up to 16: Triton specializes the kernels on whether an int
        # argument divides by 16, so every context length takes the one variant the kernel store holds
        self.table_width = -(-model.max_ctx // cache.block_size // 16) * 16
        self.kernels = None
        if model.use_triton:
            from model_loader.kernels.paged_ops import PagedDecodeAttention

            cfg = model.cfg
            self.kernels = PagedDecodeAttention(
                cfg.num_attention_heads,
                cfg.num_key_value_heads,
                cfg.head_dim,
                cache.block_size,
                self.max_rows,
                model.device,
                model.dtype,
            )
        self.graphs: dict[int, tuple] = {}  # batch bucket -> (graph, logits)
        self._static: dict | None = None  # the graphs' inputs
        self.prefill_graphs: dict[int, tuple] = {}  # tokens bucket -> (graph, logits of the last real row)
        self._prefill_static: dict | None = None
        self._pool = None  # one memory pool for every graph: no two of them run at once

    def slots(self, blocks: list[int], start: int, stop: int) -> list[int]:
        bs = self.cache.block_size
        return [blocks[p // bs] * bs + p % bs for p in range(start, stop)]

    # ---------------------------------------------------------------- a step
    @torch.inference_mode()
    def step(self, tokens: list[int] | torch.Tensor, positions: list[int], seqs: list[SeqSlice]) -> torch.Tensor:
        """tokens/positions: [T] new tokens of every sequence, each sequence's rows together (SeqSlice), the
        decoding ones first; tokens may be a device tensor (the scheduler's samples of the step before, which
        the host has not read yet). Writes their K/V into the cache and returns logits [S, V] for the sequences
        with logits=True, in order (a decode step's graph returns them in the model's dtype, other steps fp32)."""
        if self.graphs and all(seq.rows == 1 for seq in seqs):
            bucket = self._graph_bucket(len(seqs))
            if bucket is not None:
                return self._replay(bucket, tokens, positions, seqs)
        plan = self._plan(seqs) if self.graphs or self.prefill_graphs else None
        if plan is not None:
            return self._replay_plan(tokens, positions, seqs, *plan)
        return self._eager(tokens, positions, seqs)

    def _eager(self, tokens: list[int] | torch.Tensor, positions: list[int], seqs: list[SeqSlice]) -> torch.Tensor:
        """The step without graphs: one launch per kernel, attention per sequence where it isn't batched."""
        model, dev = self.model, self.model.device
        n = len(tokens)
        pad = max(0, self.min_rows - n)
        slots = [s for seq in seqs for s in self.slots(seq.blocks, seq.context - seq.rows, seq.context)]
        if isinstance(tokens, torch.Tensor):  # the previous step's samples, on the device
            tokens_t = torch.cat([tokens.to(torch.int64), tokens.new_zeros(pad, dtype=torch.int64)])
        else:
            tokens_t = torch.tensor(tokens + [0] * pad, dtype=torch.int64, device=dev)
        pos_t = torch.tensor(positions + [0] * pad, dtype=torch.int64, device=dev)
        slots_t = torch.tensor(slots + [-1] * pad, dtype=torch.int64, device=dev)
        # the leading decoding sequences (the scheduler puts them first) attend together where batched
        together = 0
        if self.batched_decode or self.kernels is not None:
            while together < len(seqs) and seqs[together].rows == 1:
                together += 1
            if self.kernels is None and together < 2:
                together = 0
        decoders = seqs[:together]
        if not together:
            decode = None
        elif self.kernels is not None:
            tables = torch.tensor(
                [seq.blocks + [0] * (self.table_width - len(seq.blocks)) for seq in decoders],
                dtype=torch.int32,
                device=dev,
            )
            lengths = torch.tensor([seq.context for seq in decoders], dtype=torch.int32, device=dev)
            decode = self._kernel_attention(tables, lengths)
        else:
            decode = self._gathered_attention(*self._decode_index(decoders))
        gathers = [self._gather_index(seq) for seq in seqs[together:]]

        def attend(q: torch.Tensor, layer: int) -> torch.Tensor:
            parts = [decode(q[:together], layer)] if together else []
            parts += [
                self._attend(q[seq.row0 : seq.row0 + seq.rows], layer, seq, idx)
                for seq, idx in zip(seqs[together:], gathers)
            ]
            return torch.cat(parts + [q.new_zeros(pad, q.shape[1] * q.shape[2])])

        h, residual = self._layers(tokens_t, pos_t, slots_t, attend)
        rows = [seq.row0 + seq.rows - 1 for seq in seqs if seq.logits]
        if not rows:
            return torch.empty(0, model.cfg.vocab_size, device=dev)
        pick = torch.tensor(rows + [rows[-1]] * max(0, self.min_rows - len(rows)), dtype=torch.int64, device=dev)
        return self._logits(h.index_select(0, pick), residual.index_select(0, pick))[: len(rows)].float()

    def _layers(self, tokens_t, pos_t, slots_t, attend, last_rows=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Every decoder layer over the step's rows: (hidden, residual) [T, H] before the final norm. last_rows
        (an index on the device): only those rows go on past the last layer's attention (the others' K/V is
        written, and nothing reads their outputs), as the engine's prefill does: [len(last_rows), H]."""
        last_layer = len(self.model.w["layers"]) - 1
        model, cfg, ops = self.model, self.model.cfg, self.model.ops
        eps, linear = cfg.rms_norm_eps, model.linear
        h = F.embedding(tokens_t, model.w["embed"])
        residual = None
        if self.kernels is None:
            cos, sin = model.cos[pos_t][:, None, :], model.sin[pos_t][:, None, :]
        for i, layer in enumerate(model.w["layers"]):
            x, residual = ops.add_rms_norm(h, residual, layer["ln1"], eps)
            qkv = linear(x, layer["qkv_w"])
            if self.kernels is not None:
                from model_loader.kernels.paged_ops import paged_rope_write

                q = paged_rope_write(
                    qkv,
                    layer["qkv_b"],
                    model.cos,
                    model.sin,
                    self.cache.k[i],
                    self.cache.v[i],
                    pos_t,
                    slots_t,
                    cfg.num_attention_heads,
                    cfg.num_key_value_heads,
                    scales=self.cache.scales(i),
                )
            else:
                q = self._rope_write(qkv, layer["qkv_b"], cos, sin, i, slots_t)
            a = attend(q, i)
            if last_rows is not None and i == last_layer:
                a, residual = a.index_select(0, last_rows), residual.index_select(0, last_rows)
            h = linear(a, layer["o_w"])
            x, residual = ops.add_rms_norm(h, residual, layer["ln2"], eps)
            h = linear.mlp(x, layer["gate_up_w"], layer["down_w"], ops.silu_mul)
        return h, residual

    def _logits(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        x, _ = self.model.ops.add_rms_norm(h, residual, self.model.w["norm"], self.model.cfg.rms_norm_eps)
        return F.linear(x, self.model.w["lm_head"])

    # ---------------------------------------------------------------- decode graphs
    def _bucket(self, batch: int) -> int | None:
        """The bucket that `batch` rows are captured in (before capture too)."""
        return next((b for b in self.GRAPH_BUCKETS if b >= batch and b <= self.max_rows), None)

    def _graph_bucket(self, rows: int) -> int | None:
        """The smallest captured decode graph for `rows` rows, if any."""
        return min((b for b in self.graphs if b >= rows), default=None)

    def graph_buckets(self) -> list[int]:
        """The row counts of the decode graphs capture_decode_graphs makes."""
        top = self._bucket(self.max_rows) or self.max_rows
        return [b for b in self.GRAPH_BUCKETS if b <= top]

    def capture_decode_graphs(self) -> None:
        """Capture a decode step for each batch bucket up to max_rows (Triton path on CUDA only). Their inputs
        are static buffers; rows past a step's sequences are padding: token 0 at position 0, no cache write,
        attending to one slot of block 0. They write nothing into the cache, so capturing is safe at any time
        no step runs."""
        from model_loader.kernels.side_stream import graph_capture, side_stream

        if self.kernels is None or self.model.device.type != "cuda":
            return
        dev = self.model.device
        self.make_decode_inputs(self._bucket(self.max_rows) or self.max_rows)
        pool = self._graph_pool()
        for bucket in sorted(self.graph_buckets(), reverse=True):  # largest first: the pool
            stream = side_stream(dev)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), torch.inference_mode():
                self._static_step(bucket)  # outside the graph first: Triton compiles, cuBLAS sets up
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with graph_capture(graph, dev, pool), torch.inference_mode():
                logits = self._static_step(bucket)
            self.graphs[bucket] = (graph, logits)

    def make_decode_inputs(self, top: int) -> None:
        """The decode graphs' static inputs, for buckets up to `top` sequences."""
        dev = self.model.device
        self._static = {
            "tokens": torch.zeros(top, dtype=torch.int64, device=dev),
            "positions": torch.zeros(top, dtype=torch.int64, device=dev),
            "slots": torch.full((top,), -1, dtype=torch.int64, device=dev),
            "tables": torch.zeros((top, self.table_width), dtype=torch.int32, device=dev),
            "lengths": torch.ones(top, dtype=torch.int32, device=dev),
        }

    def _graph_pool(self):
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    def capture_prefill_graphs(self, chunk: int) -> None:
        """Capture a fresh prompt's prefill for each length bucket up to `chunk` (Triton path on CUDA only). The
        inputs are static buffers; rows past the prompt are padding (token 0, no cache write): causal attention
        keeps them out of every real row. Like the decode graphs, safe to capture whenever no step runs."""
        from model_loader.kernels.side_stream import graph_capture, side_stream

        if self.kernels is None or self.model.device.type != "cuda":
            return
        buckets = sorted((b for b in self.PREFILL_BUCKETS if b <= min(chunk, self.model.max_ctx)), reverse=True)
        if not buckets:
            return
        dev = self.model.device
        self.make_prefill_inputs(buckets[0])
        for bucket in buckets:  # largest first: the pool
            stream = side_stream(dev)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), torch.inference_mode():
                self._static_prefill(bucket)  # outside the graph first: Triton compiles, cuBLAS sets up
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with graph_capture(graph, dev, self._graph_pool()), torch.inference_mode():
                logits = self._static_prefill(bucket)
            self.prefill_graphs[bucket] = (graph, logits)
        self.prefill_graphs = dict(sorted(self.prefill_graphs.items()))  # smallest first: step() takes the first fit

    def make_prefill_inputs(self, top: int) -> None:
        """The prefill graphs' static inputs, for buckets up to `top` tokens."""
        dev = self.model.device
        self._prefill_static = {
            "tokens": torch.zeros(top, dtype=torch.int64, device=dev),
            "positions": torch.zeros(top, dtype=torch.int64, device=dev),
            "slots": torch.full((top,), -1, dtype=torch.int64, device=dev),
            "gather": torch.zeros(top, dtype=torch.int64, device=dev),  # the slots, padding reading slot 0
            "last": torch.zeros(1, dtype=torch.int64, device=dev),  # the prompt's last row
        }

    def _static_prefill(self, bucket: int) -> torch.Tensor:
        st = self._prefill_static
        gather = st["gather"][:bucket]
        scale = self.model.scale

        def attend(q: torch.Tensor, layer: int) -> torch.Tensor:  # causal over the prompt's own rows
            k, v = self.cache.gather(layer, gather)
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None], k[None], v[None], is_causal=True, scale=scale, enable_gqa=True
            )
            return out[0].transpose(0, 1).reshape(bucket, -1)

        tokens, positions, slots = st["tokens"][:bucket], st["positions"][:bucket], st["slots"][:bucket]
        return self._logits(*self._layers(tokens, positions, slots, attend, last_rows=st["last"]))

    def _prefill_bucket(self, rows: int) -> int | None:
        return next((b for b in self.prefill_graphs if b >= rows), None)

    def _plan(self, seqs: list[SeqSlice]) -> tuple[list[int], list[int], list[int]] | None:
        """Which sequences of a step replay the decode graphs row by row, which their prompt's prefill graph, and
        which run eagerly (indices into seqs); None where all would run eagerly."""
        top = max(self.graphs, default=0)
        rowwise, prompts, eager = [], [], []
        reads = 0
        for i, seq in enumerate(seqs):
            if seq.rows == 1 and top:
                rowwise.append(i)
            elif seq.rows == seq.context and self._prefill_bucket(seq.rows) is not None:
                prompts.append(i)  # a fresh prompt: reads no earlier chunk's K/V
            elif seq.rows <= top and reads + seq.rows * seq.context <= ROW_GRAPH_READS:
                reads += seq.rows * seq.context
                rowwise.append(i)
            else:
                eager.append(i)
        return None if len(eager) == len(seqs) else (rowwise, prompts, eager)

    def _replay_plan(
        self,
        tokens: list[int] | torch.Tensor,
        positions: list[int],
        seqs: list[SeqSlice],
        rowwise: list[int],
        prompts: list[int],
        eager: list[int],
    ) -> torch.Tensor:
        """A step run as _plan says; logits in fp32, in the order of seqs. Each replay's logits are copied out of
        its graph's output before the next replay: one bucket's graph may replay twice in a step, and the graphs
        share a memory pool (a graph's output may be another's scratch). Sequences don't read each other's K/V, so
        the parts may run in any order."""
        on_device = isinstance(tokens, torch.Tensor)  # the scheduler's unread samples: all-decoding steps only
        if on_device and (prompts or eager):
            tokens, on_device = tokens.tolist(), False
        out: dict[int, torch.Tensor] = {}
        for group in self._packed(seqs, rowwise):
            rows: list[SeqSlice] = []
            last = []
            for i in group:
                seq = seqs[i]
                first = seq.context - seq.rows
                rows += [SeqSlice(seq.row0 + j, 1, first + j + 1, seq.blocks, False) for j in range(seq.rows)]
                last.append(len(rows) - 1)
            row_tokens = tokens[[r.row0 for r in rows]] if on_device else [tokens[r.row0] for r in rows]
            row_positions = [positions[r.row0] for r in rows]
            logits = self._replay(self._graph_bucket(len(rows)), row_tokens, row_positions, rows)
            picked = logits.index_select(0, torch.tensor(last, device=logits.device)).float()
            out.update((i, picked[k : k + 1]) for k, i in enumerate(group))
        for i in prompts:
            seq = seqs[i]
            rows_of = tokens[seq.row0 : seq.row0 + seq.rows]
            out[i] = self._replay_prefill(self._prefill_bucket(seq.rows), rows_of, seq)
        if eager:
            sub_tokens, sub_positions, sub_seqs = [], [], []
            for i in eager:
                seq = seqs[i]
                sub_seqs.append(replace(seq, row0=len(sub_tokens)))
                sub_tokens += tokens[seq.row0 : seq.row0 + seq.rows]
                sub_positions += positions[seq.row0 : seq.row0 + seq.rows]
            logits = iter(self._eager(sub_tokens, sub_positions, sub_seqs))
            out.update((i, next(logits)[None]) for i in eager if seqs[i].logits)
        parts = [out[i] for i, seq in enumerate(seqs) if seq.logits and i in out]
        if not parts:
            return torch.empty(0, self.model.cfg.vocab_size, device=self.model.device)
        return torch.cat(parts)

    def _packed(self, seqs: list[SeqSlice], chosen: list[int]) -> list[list[int]]:
        """The chosen sequences in groups of at most the largest decode graph's rows, in order, none split."""
        top = max(self.graphs, default=0)
        groups, rows = [], top
        for i in chosen:
            if rows + seqs[i].rows > top:
                groups.append([])
                rows = 0
            groups[-1].append(i)
            rows += seqs[i].rows
        return groups

    def _replay_prefill(self, bucket: int, tokens: list[int], seq: SeqSlice) -> torch.Tensor:
        st, n = self._prefill_static, seq.rows
        pad = bucket - n
        slots = self.slots(seq.blocks, 0, n)
        rows = torch.tensor(
            [tokens + [0] * pad, list(range(n)) + [0] * pad, slots + [-1] * pad, slots + [0] * pad], dtype=torch.int64
        )
        st["tokens"][:bucket].copy_(rows[0], non_blocking=True)
        st["positions"][:bucket].copy_(rows[1], non_blocking=True)
        st["slots"][:bucket].copy_(rows[2], non_blocking=True)
        st["gather"][:bucket].copy_(rows[3], non_blocking=True)
        st["last"].fill_(n - 1)
        graph, logits = self.prefill_graphs[bucket]
        graph.replay()
        if not seq.logits:  # a long prompt's first chunk: its K/V was all it was for
            return torch.empty(0, self.model.cfg.vocab_size, device=self.model.device)
        return logits.to(torch.float32, copy=True)  # out of the graph's output before another replay

    def _static_step(self, bucket: int) -> torch.Tensor:
        st = self._static
        attend = self._kernel_attention(st["tables"][:bucket], st["lengths"][:bucket])
        h, residual = self._layers(st["tokens"][:bucket], st["positions"][:bucket], st["slots"][:bucket], attend)
        return self._logits(h, residual)

    def _replay(self, bucket: int, tokens: list[int], positions: list[int], seqs: list[SeqSlice]) -> torch.Tensor:
        st, b = self._static, len(seqs)
        pad = bucket - b
        slots = [
            seq.blocks[(seq.context - 1) // self.cache.block_size] * self.cache.block_size
            + (seq.context - 1) % self.cache.block_size
            for seq in seqs
        ]
        on_device = isinstance(tokens, torch.Tensor)  # the previous step's samples, not yet read by the host
        rows = torch.tensor(
            [[0] * bucket if on_device else tokens + [0] * pad, positions + [0] * pad, slots + [-1] * pad],
            dtype=torch.int64,
        )
        st["tokens"][:bucket].copy_(rows[0], non_blocking=True)
        if on_device:
            st["tokens"][:b].copy_(tokens)
        st["positions"][:bucket].copy_(rows[1], non_blocking=True)
        st["slots"][:bucket].copy_(rows[2], non_blocking=True)
        tables = torch.zeros((bucket, self.table_width), dtype=torch.int32)
        for i, seq in enumerate(seqs):
            tables[i, : len(seq.blocks)] = torch.tensor(seq.blocks, dtype=torch.int32)
        st["tables"][:bucket].copy_(tables, non_blocking=True)
        st["lengths"][:bucket].copy_(
            torch.tensor([seq.context for seq in seqs] + [1] * pad, dtype=torch.int32), non_blocking=True
        )
        graph, logits = self.graphs[bucket]
        graph.replay()
        return logits[:b]  # in the model's dtype: argmax and the sampler take it as it is (no fp32 copy of B rows)

    # ---------------------------------------------------------------- attention
    def _kernel_attention(self, tables: torch.Tensor, lengths: torch.Tensor):
        """attend(q, layer) for decoding rows through paged_ops (q [B, Hq, D] -> [B, Hq * D])."""

        def attend(q: torch.Tensor, layer: int) -> torch.Tensor:
            cache = self.cache
            out = self.kernels(
                q, cache.k[layer], cache.v[layer], tables, lengths, self.model.scale, cache.scales(layer)
            )
            return out.reshape(q.shape[0], -1)

        return attend

    def _gathered_attention(self, index: torch.Tensor, mask: torch.Tensor):
        """attend(q, layer) for decoding rows with PyTorch ops: one gather of every context, one masked SDPA."""

        def attend(q: torch.Tensor, layer: int) -> torch.Tensor:
            b = q.shape[0]
            k, v = (t.transpose(0, 1) for t in self.cache.gather(layer, index))  # [B, Hkv, L, D]
            out = F.scaled_dot_product_attention(
                q[:, :, None, :], k, v, attn_mask=mask, scale=self.model.scale, enable_gqa=True
            )
            return out.reshape(b, -1)

        return attend

    def _block_slots(self, tables: list[list[int]]) -> torch.Tensor:
        """Every slot of each table's blocks, in text order: [len(tables), blocks of the longest * block_size]
        (shorter tables padded with block 0). Built on the device from the block ids: a list of every slot of
        many sequences' contexts costs milliseconds of Python a step."""
        bs, dev = self.cache.block_size, self.model.device
        width = max(len(t) for t in tables)
        ids = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int64, device=dev)
        return (ids[:, :, None] * bs + torch.arange(bs, device=dev)).reshape(len(tables), -1)

    def _gather_index(self, seq: SeqSlice) -> torch.Tensor:
        """The cache slots of the sequence's first `context` positions, as a device index."""
        return self._block_slots([seq.blocks])[0, : seq.context]

    def _decode_index(self, seqs: list[SeqSlice]) -> tuple[torch.Tensor, torch.Tensor]:
        """For decoding sequences: the cache slots of each one's context, padded to the longest ([B, L]; padding
        reads other slots, masked off), and the mask of real positions [B, 1, 1, L]."""
        longest = max(seq.context for seq in seqs)
        dev = self.model.device
        index = self._block_slots([seq.blocks for seq in seqs])[:, :longest]
        lengths = torch.tensor([seq.context for seq in seqs], device=dev)
        mask = torch.arange(longest, device=dev)[None, :] < lengths[:, None]
        return index, mask[:, None, None, :]

    def _rope_write(self, qkv, bias, cos, sin, layer: int, slots_t: torch.Tensor) -> torch.Tensor:
        """Add the QKV bias, rotate q and k at each row's own position (as reference.rope_bias_cache does for
        consecutive ones), write k and v into their cache slots (rows with slot -1 are padding: not written);
        returns q [T, Hq, D]."""
        cfg = self.model.cfg
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        x = (qkv.float() + bias.float()).view(qkv.shape[0], hq + 2 * hkv, d)

        def rotate(v):
            v1, v2 = v[..., : d // 2], v[..., d // 2 :]
            return torch.cat((v1 * cos - v2 * sin, v2 * cos + v1 * sin), dim=-1)

        q = rotate(x[:, :hq]).to(qkv.dtype)
        real = slots_t >= 0
        self.cache.write(layer, slots_t[real], rotate(x[:, hq : hq + hkv])[real], x[:, hq + hkv :][real])
        return q

    def _attend(self, q: torch.Tensor, layer: int, seq: SeqSlice, index: torch.Tensor) -> torch.Tensor:
        """q [rows, Hq, D] of one sequence -> [rows, Hq * D], over its `context` cached tokens."""
        k, v = self.cache.gather(layer, index)  # [Hkv, context, D]
        scale = self.model.scale
        if seq.rows == 1:
            return reference.decode_attention(q[0], k, v, None, seq.context, scale).reshape(1, -1)
        if seq.rows == seq.context:  # a whole prompt in one chunk: causal over its own tokens (SDPA's flash kernel)
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None], k[None], v[None], is_causal=True, scale=scale, enable_gqa=True
            )
            return out[0].transpose(0, 1).reshape(seq.rows, -1)
        return reference.prefill_attention(q, k, v, seq.context - seq.rows, scale)
