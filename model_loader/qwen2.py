"""A compact Qwen2 forward pass with a preallocated KV cache (gpt-fast style).

Weights come fused from weights.load_weights (QKV with bias, gate/up). Two entry points:
  prefill(tokens, start)      -> logits; writes positions start..start+T-1 of the cache (chunked, SDPA)
  decode(token_t, pos_t, pos) -> logits for one token; capturable in a CUDA graph on a GPU
The small ops come from kernels.small_ops on CUDA (fused), kernels.torch_graph_ops on a GPU without Triton
(plain PyTorch, positions read on the device so that graphs can be captured) or kernels.reference (the CPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model_loader.awq import Int4Weight, RowPackedInt4
from model_loader.config import Qwen2Config
from model_loader.kernels import reference, torch_graph_ops
from model_loader.kv_cache import KV_8BIT, KV_16BIT, value_cache
from model_loader.linears import Linears


def rope_tables(cfg: Qwen2Config, max_ctx: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [max_ctx, D/2] in fp32, computed as HF's default RoPE does."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = torch.outer(torch.arange(max_ctx, dtype=torch.float32), inv_freq)
    return freqs.cos().to(device), freqs.sin().to(device)


class Qwen2Model:
    PREFILL_CHUNK = 2048  # bounds activation memory for long prompts

    def __init__(
        self,
        cfg: Qwen2Config,
        weights: dict,
        device,
        dtype,
        max_ctx: int,
        use_triton: bool,
        kv_cache: str = KV_16BIT,
        positions_on_device: bool | None = None,
    ):
        self.cfg, self.w, self.device, self.dtype, self.max_ctx = cfg, weights, torch.device(device), dtype, max_ctx
        self.scale = cfg.head_dim**-0.5
        self.cos, self.sin = rope_tables(cfg, max_ctx, device)
        cache_shape = (cfg.num_hidden_layers, cfg.num_key_value_heads, max_ctx, cfg.head_dim)
        # Zero-filled so nothing uninitialised is ever read, even by a masked-off lane. An 8-bit cache holds
        # fp8 (e4m3) K and V rows with one fp32 scale per (layer, KV head, token) row, V transposed (kv_cache.py).
        cache_dtype = torch.float8_e4m3fn if kv_cache == KV_8BIT else dtype
        self.k_cache = torch.zeros(cache_shape, device=device, dtype=cache_dtype)
        self.v_cache = value_cache(cache_shape, device, cache_dtype, transposed=kv_cache == KV_8BIT)
        self.k_scale = self.v_scale = None
        if kv_cache == KV_8BIT:
            self.k_scale = torch.zeros(cache_shape[:-1], device=device, dtype=torch.float32)
            self.v_scale = torch.zeros(cache_shape[:-1], device=device, dtype=torch.float32)
        self.use_triton = use_triton
        # Plain PyTorch ops that read positions on the device: a GPU without Triton captures its graphs with them
        # (None: on a GPU; the tests turn them on for the CPU).
        if positions_on_device is None:
            positions_on_device = self.device.type == "cuda" and not use_triton
        self.positions_on_device = positions_on_device and not use_triton
        self.decode_span: int | None = None  # torch_graph_ops: the cache span the decode attention reads
        # The last layer works on the last token's row only (_layers). A compile walk over a one-layer shape twin
        # turns it off: that layer must stand for all the others, whose prefill attention it would otherwise skip
        # (compile_ahead walks the row path on its own).
        self.last_layer_rows_only = True
        self.linear = Linears(weights, device, dtype)  # kernel per weight kind/shape; tuned by tune_gemv()
        if use_triton:
            from model_loader.kernels import small_ops
            from model_loader.kernels.decode_attention import DECODE_ATTN_CONFIGS, KV8_CONFIGS, DecodeAttention
            from model_loader.kernels.prefill_attention import PrefillAttention

            self.ops = small_ops
            self.linear.pair_dense_gate_up(weights)  # the decode step's gate/up GEMV then outputs SiLU(gate) * up
            # scratch for every shape the warm-up may time (an 8-bit cache's own have more splits)
            configs = DECODE_ATTN_CONFIGS + (KV8_CONFIGS if kv_cache == KV_8BIT else ())
            self.decode_attention = DecodeAttention(
                cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, device, dtype, configs=configs
            )
            self.prefill_attention = PrefillAttention(
                cfg.num_attention_heads,
                cfg.num_key_value_heads,
                cfg.head_dim,
                device,
                max_tokens=min(max_ctx, self.PREFILL_CHUNK),
            )
        else:
            self.ops = torch_graph_ops if self.positions_on_device else reference
            self.decode_attention = reference.decode_attention

    def tune_gemv(self) -> dict:
        """Measure the single-token kernels per weight shape on this GPU and keep the fastest (Linears.tune)."""
        return self.linear.tune(self.w, self.dtype)

    def set_decode_attention_config(self, config) -> None:
        """The configuration the next decode steps (or graph captures) use; None: the default."""
        if self.use_triton:
            from model_loader.kernels.decode_attention import DECODE_ATTN_CONFIGS

            self.decode_attention.config = config or DECODE_ATTN_CONFIGS[0]
        elif self.positions_on_device:  # a span of the cache (torch_graph_ops.decode_spans); None: the context
            self.decode_span = config

    def decode_attention_candidates(self) -> tuple:
        """The decode attention configurations the warm-up times for this model: its GPU, its GEMVs (4-bit or
        not) and its cache's format (decode_attention.decode_attention_candidates; Triton path only)."""
        from model_loader.kernels.decode_attention import decode_attention_candidates

        return decode_attention_candidates(self.device, self.linear.int4_gemv, kv8=self.k_scale is not None)

    @property
    def embed_on_host(self) -> bool:
        return "embed_host" in self.w

    @property
    def weights_bytes(self) -> int:
        """Device memory held by the weights (an embedding table kept in host memory is not counted)."""
        seen, total = set(), 0
        tensors = [self.w["norm"], self.w["lm_head"]] + ([] if self.embed_on_host else [self.w["embed"]])
        tensors += [t for layer in self.w["layers"] for t in layer.values()]
        for t in tensors:
            if isinstance(t, (Int4Weight, RowPackedInt4)):
                total += t.nbytes()
            elif t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
        return total

    @property
    def decode_weight_bytes(self) -> int:
        """Bytes of weights one decode step reads: every weight but the embedding table, of which it reads one
        row (tied embeddings are the LM head, read whole)."""
        if self.embed_on_host or self.cfg.tie_word_embeddings:  # not in weights_bytes / counted as the LM head
            return self.weights_bytes
        return self.weights_bytes - self.w["embed"].numel() * self.w["embed"].element_size()

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of cache a decode step reads for each token of context: its K and V rows in every layer (and an
        8-bit cache's two row scales a layer and KV head)."""
        layers, kv_heads, _, head_dim = self.k_cache.shape
        scales = 0 if self.k_scale is None else 2 * layers * kv_heads * self.k_scale.element_size()
        return 2 * layers * kv_heads * head_dim * self.k_cache.element_size() + scales

    @property
    def kv_cache_bytes(self) -> int:
        scales = 0 if self.k_scale is None else 2 * self.k_scale.numel() * self.k_scale.element_size()
        # the value cache's storage: a transposed one has padding rows (kv_cache.value_cache)
        return self.k_cache.numel() * self.k_cache.element_size() + self.v_cache.untyped_storage().nbytes() + scales

    def cache_scales(self, layer: int):
        """(k_scale, v_scale) [Hkv, max_ctx] of a layer's 8-bit cache, or None (16-bit): what the attention
        and cache-writing kernels take as `scales`."""
        return None if self.k_scale is None else (self.k_scale[layer], self.v_scale[layer])

    def _layers(
        self,
        h: torch.Tensor,
        pos_t: torch.Tensor,
        start: int,
        attend,
        rows: torch.Tensor | None = None,
        attend_rows=None,
    ) -> torch.Tensor:
        """All decoder layers + final norm. h: [T, H] -> normed hidden [T, H], or only the given rows (a device
        index tensor) through the final norm. With attend_rows(q_row, layer) (attention for one row at its
        position) and one row, the last layer runs its attention, O projection and MLP for that row only: no
        other row of the last layer is read by anything (the K/V that later tokens read are written before its
        attention). That saves most of one layer's share of a prefill (the 1.5B: 1/28)."""
        cfg, ops = self.cfg, self.ops
        eps = cfg.rms_norm_eps
        residual = None
        linear = self.linear
        last = len(self.w["layers"]) - 1
        for i, layer in enumerate(self.w["layers"]):
            x, residual = ops.add_rms_norm(h, residual, layer["ln1"], eps)
            qkv = linear(x, layer["qkv_w"])  # bias is added inside the RoPE kernel
            q = ops.rope_bias_cache(
                qkv,
                layer["qkv_b"],
                self.cos,
                self.sin,
                self.k_cache[i],
                self.v_cache[i],
                pos_t,
                start,
                cfg.num_attention_heads,
                cfg.num_key_value_heads,
                scales=self.cache_scales(i),
            )
            if i == last and attend_rows is not None and self.last_layer_rows_only:
                assert rows is not None and rows.shape[0] == 1, "the row path attends for one row"
                q, residual = q.index_select(0, rows), residual.index_select(0, rows)
                h = linear(attend_rows(q, i), layer["o_w"])
                rows = None  # selected
            else:
                h = linear(attend(q, i), layer["o_w"])
            x, residual = ops.add_rms_norm(h, residual, layer["ln2"], eps)
            h = linear.mlp(x, layer["gate_up_w"], layer["down_w"], ops.silu_mul)
        if rows is not None:
            h, residual = h.index_select(0, rows), residual.index_select(0, rows)
        x, _ = ops.add_rms_norm(h, residual, self.w["norm"], eps)
        return x

    def _row_attention(self, pos_t: torch.Tensor, length: int | None, span: int | None = None):
        """attend_rows for _layers: one query row at position pos_t (a [1] int32 device tensor; length = pos + 1
        on the host where known, read by the reference path only) through the decode attention. On the Triton
        path with the configuration that splits by SM, whatever the depth (the prefill graphs serve every prefix
        length); with positions on the device and no length, over the cache's first `span` positions."""

        def attend_rows(q: torch.Tensor, layer: int) -> torch.Tensor:
            if self.use_triton:
                config = self.decode_attention_candidates()[-1]
                out = self.decode_attention(
                    q[0],
                    self.k_cache[layer],
                    self.v_cache[layer],
                    pos_t,
                    length,
                    self.scale,
                    config=config,
                    scales=self.cache_scales(layer),
                )
            elif length is None and self.positions_on_device:  # a fresh prefill's graph: its bucket is the span
                out = torch_graph_ops.decode_attention_span(
                    q[0], self.k_cache[layer], self.v_cache[layer], pos_t, span, self.scale, self.cache_scales(layer)
                )
            else:  # eager: reading the position here costs nothing
                n = length if length is not None else int(pos_t.item()) + 1
                out = self.decode_attention(
                    q[0],
                    self.k_cache[layer],
                    self.v_cache[layer],
                    pos_t,
                    n,
                    self.scale,
                    scales=self.cache_scales(layer),
                )
            return out.reshape(1, -1)

        return attend_rows

    def _prefill_attention(self, start: int | None, t: int, start_t: torch.Tensor):
        """attend(q, layer) for T new tokens at positions start..start+T-1. start None: known only on the device
        (start_t; a follow-up graph), which needs the Triton path. A fresh prompt (start 0) takes SDPA's causal
        flash kernel (about twice our Triton kernel's speed there); after a cached prefix the Triton kernel reads
        the cache with no mask and no repeated K/V (the reference path: an explicit mask)."""
        if start is None or (start and self.use_triton):

            def attend(q: torch.Tensor, layer: int) -> torch.Tensor:
                return self.prefill_attention(
                    q, self.k_cache[layer], self.v_cache[layer], start_t, self.scale, scales=self.cache_scales(layer)
                )

            return attend
        length = start + t

        def attend(q: torch.Tensor, layer: int) -> torch.Tensor:
            scales = self.cache_scales(layer)
            if start:
                return reference.prefill_attention(
                    q, self.k_cache[layer], self.v_cache[layer], start, self.scale, scales=scales
                )
            q4 = q.transpose(0, 1)[None]  # [1, Hq, T, D]: 4-D so SDPA can pick its flash kernel
            # [Hkv, L, D] each (dequantized from an 8-bit cache: the prompt's own tokens attend to what later ones
            # will read)
            k, v = reference.cached_kv(self.k_cache[layer], self.v_cache[layer], length, q.dtype, scales)
            out = F.scaled_dot_product_attention(
                q4, k[None], v[None], is_causal=True, scale=self.scale, enable_gqa=True
            )
            return out[0].transpose(0, 1).reshape(t, -1)

        return attend

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, start: int, all_logits: bool = False) -> torch.Tensor:
        """tokens: [T] int64 at positions start..start+T-1 -> logits [1, V] fp32 (last token) or [T, V]."""
        if start + tokens.numel() > self.max_ctx:
            raise ValueError("prefill past the end of the KV cache")
        outs = []
        for c0 in range(0, tokens.numel(), self.PREFILL_CHUNK):
            chunk = tokens[c0 : c0 + self.PREFILL_CHUNK]
            t = chunk.numel()
            pos_t = torch.tensor([start + c0], device=self.device, dtype=torch.int32)
            h = F.embedding(chunk, self.w["embed"])
            attend = self._prefill_attention(start + c0, t, pos_t)
            if all_logits:
                outs.append(self._layers(h, pos_t, start + c0, attend))
                continue
            last_pos = start + c0 + t - 1  # only this row's last layer is needed (_layers)
            rows = torch.full((1,), t - 1, device=self.device, dtype=torch.int64)
            outs.append(
                self._layers(
                    h,
                    pos_t,
                    start + c0,
                    attend,
                    rows=rows,
                    attend_rows=self._row_attention(pos_t + (t - 1), last_pos + 1),
                )
            )
        x = torch.cat(outs) if all_logits else outs[-1]
        return F.linear(x, self.w["lm_head"]).float()

    def prefill_static(
        self, tokens: torch.Tensor, last_t: torch.Tensor, start_t: torch.Tensor, fresh: bool = True
    ) -> torch.Tensor:
        """New tokens padded to a fixed length, for CUDA-graph capture: tokens [B] int64 at positions start..
        (the real ones first, any padding after: causal attention keeps padding out of the real rows), last_t [1]
        int64 = index of the last real token, start_t [1] int32 = the cached prefix's length (zeros for a fresh
        prompt). fresh=False: the prefix length is read on the device (Triton path), so one graph per bucket
        serves every follow-up. Writes K/V for all B positions (those past the real tokens are overwritten
        before they are ever read; the caller keeps start + B within the cache) and returns the last real
        token's logits [1, V] fp32."""
        h = F.embedding(tokens, self.w["embed"])
        attend = self._prefill_attention(0 if fresh else None, tokens.numel(), start_t)
        # only the last real row goes through the last layer's attention and MLP, the final norm and the LM head
        row_pos_t = (start_t + last_t).to(torch.int32)
        attend_rows = self._row_attention(row_pos_t, None, span=tokens.numel() if fresh else None)
        x = self._layers(h, start_t, 0, attend, rows=last_t, attend_rows=attend_rows)
        return F.linear(x, self.w["lm_head"]).float()

    def decode(self, token_t: torch.Tensor, pos_t: torch.Tensor, pos: int, float_logits: bool = True) -> torch.Tensor:
        """One token. token_t: [1] int64; pos_t: [1] int32 (read on the device: graph-safe on the Triton path);
        pos: the same position as a host int (used only by the reference path). -> logits [1, V] fp32, or in the
        model's dtype with float_logits=False (what the decode step's greedy and sampled choices take)."""
        h = F.embedding(token_t, self.w["embed"])

        span = self.decode_span if self.positions_on_device else None

        def attend(q: torch.Tensor, layer: int) -> torch.Tensor:
            k, v, scales = self.k_cache[layer], self.v_cache[layer], self.cache_scales(layer)
            if span is not None:  # graph-safe: the position is read on the device
                out = torch_graph_ops.decode_attention_span(q[0], k, v, pos_t, span, self.scale, scales)
            else:
                out = self.decode_attention(q[0], k, v, pos_t, pos + 1, self.scale, scales=scales)
            return out.reshape(1, -1)

        x = self._layers(h, pos_t, pos, attend)
        logits = F.linear(x, self.w["lm_head"])
        return logits.float() if float_logits else logits
