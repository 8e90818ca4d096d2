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

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from model_loader.kernels import reference
from model_loader.qwen2 import Qwen2Model

MIN_ROWS_CPU = 8


class PagedKVCache:
    """K and V for every block of a kv_blocks.BlockPool, on the model's device, in its dtype."""

    def __init__(self, model: Qwen2Model, num_blocks: int, block_size: int):
        cfg = model.cfg
        self.num_blocks, self.block_size = num_blocks, block_size
        shape = (cfg.num_hidden_layers, cfg.num_key_value_heads, num_blocks * block_size, cfg.head_dim)
        # zero-filled: a padded attention lane never reads uninitialised memory
        self.k = torch.zeros(shape, device=model.device, dtype=model.dtype)
        self.v = torch.zeros(shape, device=model.device, dtype=model.dtype)

    @staticmethod
    def bytes_per_block(model: Qwen2Model, block_size: int) -> int:
        cfg = model.cfg
        return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * block_size * model.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


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
    """One batched step of a loaded Qwen2Model (its weights, linear kernels and norms) over a PagedKVCache."""

    def __init__(self, model: Qwen2Model, cache: PagedKVCache, batched_decode: bool | None = None):
        """batched_decode: attend for all decoding sequences at once (one gather and one masked SDPA a layer,
        not a few kernels per sequence); the default on a GPU. On the CPU each sequence attends alone, so its
        numbers don't depend on the others' lengths."""
        self.model, self.cache = model, cache
        self.min_rows = MIN_ROWS_CPU if model.device.type == "cpu" else 1
        self.batched_decode = model.device.type != "cpu" if batched_decode is None else batched_decode

    def slots(self, blocks: list[int], start: int, stop: int) -> list[int]:
        bs = self.cache.block_size
        return [blocks[p // bs] * bs + p % bs for p in range(start, stop)]

    @torch.inference_mode()
    def step(self, tokens: list[int], positions: list[int], seqs: list[SeqSlice]) -> torch.Tensor:
        """tokens/positions: [T] new tokens of every sequence, each sequence's rows together (SeqSlice). Writes
        their K/V into the cache and returns fp32 logits [S, V] for the sequences with logits=True, in order."""
        model, cfg, ops = self.model, self.model.cfg, self.model.ops
        dev = model.device
        n = len(tokens)
        pad = max(0, self.min_rows - n)
        slots = [s for seq in seqs for s in self.slots(seq.blocks, seq.context - seq.rows, seq.context)]
        tokens_t = torch.tensor(tokens + [0] * pad, dtype=torch.int64, device=dev)
        pos_t = torch.tensor(positions + [0] * pad, dtype=torch.int64, device=dev)
        slots_t = torch.tensor(slots, dtype=torch.int64, device=dev)
        # the leading decoding sequences (the scheduler puts them first) attend together where batched
        together = 0
        if self.batched_decode:
            while together < len(seqs) and seqs[together].rows == 1:
                together += 1
            together = together if together > 1 else 0
        batch_index = self._decode_index(seqs[:together]) if together else None
        gathers = [self._gather_index(seq) for seq in seqs[together:]]
        h = F.embedding(tokens_t, model.w["embed"])
        cos, sin = model.cos[pos_t][:, None, :], model.sin[pos_t][:, None, :]
        eps, linear = cfg.rms_norm_eps, model.linear
        residual = None
        for i, layer in enumerate(model.w["layers"]):
            x, residual = ops.add_rms_norm(h, residual, layer["ln1"], eps)
            qkv = linear(x, layer["qkv_w"])
            q = self._rope_write(qkv, layer["qkv_b"], cos, sin, i, slots_t, n)
            parts = [self._attend_decoding(q[:together], i, *batch_index)] if together else []
            parts += [self._attend(q[seq.row0:seq.row0 + seq.rows], i, seq, idx)
                      for seq, idx in zip(seqs[together:], gathers)]
            attn = torch.cat(parts + [q.new_zeros(pad, q.shape[1] * q.shape[2])])
            h = linear(attn, layer["o_w"])
            x, residual = ops.add_rms_norm(h, residual, layer["ln2"], eps)
            h = linear.mlp(x, layer["gate_up_w"], layer["down_w"], ops.silu_mul)
        rows = [seq.row0 + seq.rows - 1 for seq in seqs if seq.logits]
        if not rows:
            return torch.empty(0, cfg.vocab_size, device=dev)
        pick = torch.tensor(rows + [rows[-1]] * max(0, self.min_rows - len(rows)), dtype=torch.int64, device=dev)
        x, _ = ops.add_rms_norm(h.index_select(0, pick), residual.index_select(0, pick), model.w["norm"], eps)
        return F.linear(x, model.w["lm_head"]).float()[:len(rows)]

    def _gather_index(self, seq: SeqSlice) -> torch.Tensor:
        """The cache slots of the sequence's first `context` positions, as a device index."""
        return torch.tensor(self.slots(seq.blocks, 0, seq.context), dtype=torch.int64, device=self.model.device)

    def _decode_index(self, seqs: list[SeqSlice]) -> tuple[torch.Tensor, torch.Tensor]:
        """For decoding sequences: the cache slots of each one's context, padded to the longest ([B, L]; padding
        reads slot 0), and the mask of real positions [B, 1, 1, L]."""
        longest = max(seq.context for seq in seqs)
        index = [self.slots(seq.blocks, 0, seq.context) + [0] * (longest - seq.context) for seq in seqs]
        dev = self.model.device
        lengths = torch.tensor([seq.context for seq in seqs], device=dev)
        mask = torch.arange(longest, device=dev)[None, :] < lengths[:, None]
        return torch.tensor(index, dtype=torch.int64, device=dev), mask[:, None, None, :]

    def _attend_decoding(self, q: torch.Tensor, layer: int, index: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q [B, Hq, D], one token of each of B decoding sequences -> [B, Hq * D]."""
        b = q.shape[0]
        k = self.cache.k[layer][:, index].transpose(0, 1)  # [B, Hkv, L, D]
        v = self.cache.v[layer][:, index].transpose(0, 1)
        out = F.scaled_dot_product_attention(q[:, :, None, :], k, v, attn_mask=mask, scale=self.model.scale,
                                             enable_gqa=True)
        return out.reshape(b, -1)

    def _rope_write(self, qkv, bias, cos, sin, layer: int, slots_t: torch.Tensor, n: int) -> torch.Tensor:
        """Add the QKV bias, rotate q and k at each row's own position (as reference.rope_bias_cache does for
        consecutive ones), write the first n rows' k and v into their cache slots; returns q [T, Hq, D]."""
        cfg = self.model.cfg
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        x = (qkv.float() + bias.float()).view(qkv.shape[0], hq + 2 * hkv, d)

        def rotate(v):
            c, s = cos[:v.shape[0]], sin[:v.shape[0]]
            v1, v2 = v[..., : d // 2], v[..., d // 2:]
            return torch.cat((v1 * c - v2 * s, v2 * c + v1 * s), dim=-1)

        q = rotate(x[:, :hq]).to(qkv.dtype)
        k = rotate(x[:n, hq:hq + hkv])
        v = x[:n, hq + hkv:]
        self.cache.k[layer].index_copy_(1, slots_t, k.to(qkv.dtype).transpose(0, 1))
        self.cache.v[layer].index_copy_(1, slots_t, v.to(qkv.dtype).transpose(0, 1))
        return q

    def _attend(self, q: torch.Tensor, layer: int, seq: SeqSlice, index: torch.Tensor) -> torch.Tensor:
        """q [rows, Hq, D] of one sequence -> [rows, Hq * D], over its `context` cached tokens."""
        k = self.cache.k[layer].index_select(1, index)  # [Hkv, context, D]
        v = self.cache.v[layer].index_select(1, index)
        scale = self.model.scale
        if seq.rows == 1:
            return reference.decode_attention(q[0], k, v, None, seq.context, scale).reshape(1, -1)
        return reference.prefill_attention(q, k, v, seq.context - seq.rows, scale)
