"""The prefill's attention: causal attention over a cached prefix (or none), the prefix length read on the
device, K/V through tensor descriptors (TMA) on Hopper, key splits for short prefills. Its tile shapes
(PrefillAttention.SHAPES, FALLBACKS) are beside it; the kernels themselves are in jit_prefill_attention.
"""

from __future__ import annotations

import torch
import triton

from model_loader.kernels import precompile
from model_loader.kernels.features import launch_first_that_fits, pdl_launch_args, prefill_tma_supported
from model_loader.kernels.jit_prefill_attention import _prefill_attn_kernel, _prefill_attn_reduce_kernel
from model_loader.kernels.precompile import launch
from model_loader.kernels.small_ops import value_layout


class PrefillAttention:
    """Causal attention for a prefill over a cached prefix (or none), start read from a device tensor. The
    split scratch is allocated once for the largest prefill (PREFILL_CHUNK tokens) it is asked to split."""

    # (up to this many new tokens, (BLOCK_M, BLOCK_N, num_warps, num_stages)). With the exp2 softmax one shape is the
    # fastest or close to it for every prefill a sweep of tile shapes timed, and faster than the earlier
    # per-length shapes ((64, 32, 4, 2), (128, 64, 4, 2)); `python -m benchmarks.prefill_attention_sweep` times it.
    # One shape is also two compile variants on a first start (in one pass or in key splits) instead of three.
    SHAPES = ((None, (64, 64, 4, 3)),)
    # Where a shape above needs more shared memory than the GPU has, the first of these that fits: fewer pipeline
    # stages, then smaller tiles. (64, 64, 4, 3) may take ~112 KB in bf16 (q and three K/V stages, our estimate),
    # over the 99 KB of an RTX 30/40-series card (sm_86/89), where (64, 64, 4, 2) (~80 KB; a few percent slower
    # where both fit) keeps the loads pipelined; fp32 models (128 x 128 at head dim 128: 393 KB) and 64 KB Turing
    # cards go further down.
    FALLBACKS = ((64, 64, 4, 2), (64, 64, 4, 1), (32, 32, 4, 1), (16, 16, 2, 1))
    # A row block holds BLOCK_M // group tokens of all the query heads of one KV head (_prefill_attn_kernel's
    # PACK_GQA) rather than BLOCK_M tokens of one query head: each K/V tile is read once for the group, which makes
    # the kept (64, 64, 4, 3) faster for the long prefills and no slower for the rest (docs/BENCHMARKS.md,
    # 'Kernel-level numbers (H200)'). Of the other tile shapes packed, only (128, 128, 8, 3) wins, at 4,096 cached +
    # 2,048 new alone, and it loses clearly elsewhere.
    PACK_GQA = True
    MAX_SPLITS = 16
    REDUCE_ROWS = 16  # (token, head) rows per program of the split reduce

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, device, max_tokens: int):
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.group = num_heads // num_kv_heads
        self.device = torch.device(device)
        self.sms = (
            torch.cuda.get_device_properties(self.device).multi_processor_count if self.device.type == "cuda" else 8
        )
        self.working: dict[tuple, tuple] = {}  # tuned shape -> the shape that compiled for this GPU and dtype
        self.tma = prefill_tma_supported(self.device)  # 16-bit K/V through tensor descriptors (see _kv_args)
        # A row block holds every query head of one KV head (see _prefill_attn_kernel), where a block fits the
        # group (block_m >= group for every shape this may run: the smallest fallback's 16 rows hold a group of 16)
        self.pack_gqa = self.PACK_GQA and 1 < self.group <= 16
        self._descriptors: dict[tuple, tuple] = {}
        # Allocated now for the most any prefill of up to max_tokens splits into: it must exist before graph
        # capture (and stays the same memory for every graph). A fallback shape has smaller row blocks, so it
        # splits into no more than this.
        rows = max(self.splits_for(t) * t for t in range(1, max_tokens + 1)) * num_heads
        self.mid_o = torch.empty((rows, head_dim), device=self.device, dtype=torch.float32)
        self.mid_lse = torch.empty((rows,), device=self.device, dtype=torch.float32)

    def _tuned(self, n_tokens: int) -> tuple[int, int, int, int]:
        return next(shape for upto, shape in self.SHAPES if upto is None or n_tokens <= upto)

    def shape_for(self, n_tokens: int) -> tuple[int, int, int, int]:
        """The tile shape a prefill of n_tokens runs with here (the tuned one, or the fallback that fit)."""
        tuned = self._tuned(n_tokens)
        return self.working.get(tuned, tuned)

    def _kv_args(self, k_cache, v_cache, block_n: int) -> tuple:
        """Tensor descriptors of the caches as [Hkv * max_ctx, D] rows in [block_n, D] tiles, made once per
        cache and tile height (they hold the address and shape: a CUDA graph captures them as launch
        arguments)."""
        key = (k_cache.data_ptr(), v_cache.data_ptr(), tuple(k_cache.shape), block_n)
        if key not in self._descriptors:
            from triton.tools.tensor_descriptor import TensorDescriptor

            d = k_cache.shape[-1]
            self._descriptors[key] = tuple(
                TensorDescriptor.from_tensor(c.view(-1, d), [block_n, d]) for c in (k_cache, v_cache)
            )
        return self._descriptors[key]

    def grid_rows(self, n_tokens: int, block_m: int) -> tuple[int, int]:
        """(row blocks, heads) of the attention's grid: with PACK_GQA a block holds block_m // group tokens of
        all the query heads of one KV head."""
        if self.pack_gqa:
            return triton.cdiv(n_tokens, block_m // self.group), self.num_kv_heads
        return triton.cdiv(n_tokens, block_m), self.num_heads

    def splits_for(self, n_tokens: int, shape: tuple | None = None) -> int:
        """Key splits so that the programs fill every SM once: 1 for long prefills (a 2,048-token one has 192
        programs for the H200's 132 SMs: splitting it only adds the reduce), up to MAX_SPLITS for short ones."""
        blocks, heads = self.grid_rows(n_tokens, (shape or self.shape_for(n_tokens))[0])
        programs = blocks * heads
        splits = 1
        while splits < self.MAX_SPLITS and programs * splits < self.sms:
            splits *= 2
        return splits

    def __call__(self, q, k_cache, v_cache, start_t, scale, splits: int | None = None, scales=None):
        # q: [T, Hq, D] (contiguous); k_cache/v_cache: [Hkv, max_ctx, D]; start_t: [1] int32 -> [T, Hq*D];
        # scales: (k_scale, v_scale) [Hkv, max_ctx] of an 8-bit cache, else None
        k_scale, v_scale = scales or (k_cache, v_cache)  # unread without an 8-bit cache
        v_t, v_rows = value_layout(v_cache)
        t = q.shape[0]
        out = torch.empty((t, self.num_heads * self.head_dim), device=q.device, dtype=q.dtype)
        pdl = pdl_launch_args(q.device)
        tuned = self._tuned(t)
        if tuned in self.working:
            candidates = [self.working[tuned]]
        else:
            candidates = [tuned] + [f for f in self.FALLBACKS if f[0] <= tuned[0] and f != tuned]

        def attention_kernel(shape: tuple) -> int:
            n_splits = splits or self.splits_for(t, shape)
            if n_splits * t * self.num_heads > self.mid_lse.numel():
                raise ValueError(f"a {t}-token prefill in {n_splits} splits needs more scratch than was allocated")
            block_m, block_n, warps, stages = shape
            # Not for key splits (short prefills over a prefix): there each program reads a few tiles and TMA's
            # set-up costs more than it saves; one variant each way.
            # An 8-bit cache: plain loads (its tiles go into the dots upcast, with their rows' scales).
            tma = self.tma and q.dtype != torch.float32 and n_splits == 1 and scales is None and not v_t
            k_arg, v_arg = self._kv_args(k_cache, v_cache, block_n) if tma else (k_cache, v_cache)
            launch(_prefill_attn_kernel, (*self.grid_rows(t, block_m), n_splits))(
                q,
                k_arg,
                v_arg,
                out,
                self.mid_o,
                self.mid_lse,
                start_t,
                t,
                k_cache.shape[1],
                scale,
                n_splits,
                k_scale,
                v_scale,
                v_rows,
                KV_FP8=scales is not None,
                V_T=v_t,
                NUM_HEADS=self.num_heads,
                GROUP=self.group,
                D=self.head_dim,
                BLOCK_M=block_m,
                BLOCK_N=block_n,
                SPLIT=n_splits > 1,
                IEEE=q.dtype == torch.float32,
                TMA=tma,
                PACK_GQA=self.pack_gqa,
                num_warps=warps,
                num_stages=stages,
                **pdl,
            )
            return n_splits

        shape, splits = launch_first_that_fits(candidates, attention_kernel)
        if not precompile.active():  # a compile-only pass proves nothing about shared memory
            self.working[tuned] = shape
        if splits > 1:
            rows = t * self.num_heads
            launch(_prefill_attn_reduce_kernel, (triton.cdiv(rows, self.REDUCE_ROWS),))(
                self.mid_o, self.mid_lse, out, rows, splits, D=self.head_dim, ROWS=self.REDUCE_ROWS, num_warps=4, **pdl
            )
        return out
