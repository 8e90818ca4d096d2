"""Triton kernels that fuse the small per-layer ops of a decode step (design.md §3: at batch 1 on a fast
GPU the kernel count, not the FLOPs, sets the speed). Each one replaces several PyTorch launches:

  add_rms_norm        residual add + RMSNorm (fp32 math)                      2-6 launches -> 1
  rope_bias_cache     QKV bias + RoPE on q and k + KV-cache write             ~12 launches -> 1
  silu_mul            SiLU(gate) * up                                         3 launches -> 1
  decode_attention    split-K flash decoding over the cache, GQA-aware        SDPA + mask -> 2

Positions are read from a device tensor (pos_t), never baked in, so one captured CUDA graph serves every
step. Shapes and semantics are those of kernels.reference, which the tests compare against.
On Hopper (sm90+) every kernel here and in int4_triton is launched with programmatic dependent launch (pdl_launch_args):
a kernel's grid is set up while the previous one finishes, which at ~10 small kernels per layer is a large
share of a decode step.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from model_loader.kernels import precompile
from model_loader.kernels.jit_ops import (
    _add_rms_norm_kernel,
    _commit_token_kernel,
    _decode_attn_reduce_kernel,
    _decode_attn_split_kernel,
    _gemv_kernel,
    _prefill_attn_kernel,
    _prefill_attn_reduce_kernel,
    _rope_bias_cache_kernel,
    _silu_mul_kernel,
)
from model_loader.kernels.precompile import launch
from model_loader.kernels.side_stream import graph_capture, side_stream

_PDL_OK: dict = {}


def pdl_supported(device) -> bool:
    """Programmatic dependent launch: Hopper or newer, a Triton that exposes it, not the CPU interpreter.
    R1DESK_NO_PDL=1 turns it off (to rule it out when chasing a problem)."""
    device = torch.device(device)
    if device not in _PDL_OK:
        _PDL_OK[device] = (
            device.type == "cuda"
            and os.environ.get("TRITON_INTERPRET") != "1"
            and os.environ.get("R1DESK_NO_PDL") != "1"
            and torch.cuda.get_device_capability(device) >= (9, 0)
            and hasattr(getattr(tl.extra, "cuda", None), "gdc_wait")
        )
    return _PDL_OK[device]


_TMA_OK: dict = {}


def prefill_tma_supported(device) -> bool:
    """The prefill attention may read K/V through tensor descriptors (TMA): Hopper or newer, a Triton with
    host-side tensor descriptors, not the CPU interpreter. R1DESK_NO_TMA=1 turns it off."""
    device = torch.device(device)
    if device not in _TMA_OK:
        ok = (
            device.type == "cuda"
            and os.environ.get("TRITON_INTERPRET") != "1"
            and os.environ.get("R1DESK_NO_TMA") != "1"
            and torch.cuda.get_device_capability(device) >= (9, 0)
        )
        if ok:
            try:
                from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
            except ImportError:
                ok = False
        _TMA_OK[device] = ok
    return _TMA_OK[device]


def pdl_launch_args(device) -> dict:
    """Launch arguments for programmatic dependent launch: each decode kernel lets the next one start as soon as
    it has started itself, and waits for the previous one before reading what it wrote (weights and tables,
    never written, may be read before). Where pdl_supported is false: plain launches."""
    return {"PDL": True, "launch_pdl": True} if pdl_supported(device) else {"PDL": False}


def add_rms_norm(x, residual, weight, eps, out=None, residual_out=None):
    """See reference.add_rms_norm. residual None -> a new residual buffer holding x."""
    t, h = x.shape
    has_res = residual is not None
    if residual is None:
        residual = residual_out if residual_out is not None else torch.empty_like(x)
    out = torch.empty_like(x) if out is None else out
    launch(_add_rms_norm_kernel, (t,))(
        x,
        residual,
        weight,
        out,
        h,
        eps,
        HAS_RES=has_res,
        BLOCK=triton.next_power_of_2(h),
        num_warps=4,
        **pdl_launch_args(x.device),
    )
    return out, residual


def rms_norm(x, weight, eps):
    out = torch.empty_like(x)
    scratch = torch.empty_like(x)
    # With no residual, the kernel's residual store is just a copy of x into scratch.
    launch(_add_rms_norm_kernel, (x.shape[0],))(
        x,
        scratch,
        weight,
        out,
        x.shape[1],
        eps,
        HAS_RES=False,
        BLOCK=triton.next_power_of_2(x.shape[1]),
        num_warps=4,
        **pdl_launch_args(x.device),
    )
    return out


def value_layout(v_cache) -> tuple[bool, int]:
    """(transposed, row length) of a layer's value cache [Hkv, max_ctx, D]: row-major (the 16-bit cache; its row
    length is max_ctx), or a transposed view whose storage is [Hkv, D, rows] with rows >= max_ctx (the 8-bit
    cache: kv_cache.value_cache), what the kernels take as V_T and v_rows."""
    hkv, max_ctx, d = v_cache.shape
    if v_cache.stride() == (max_ctx * d, d, 1):
        return False, max_ctx
    rows = v_cache.stride(-1)
    if v_cache.stride() != (d * rows, 1, rows) or rows < max_ctx:
        raise ValueError(
            f"a value cache must be [Hkv, max_ctx, D] row-major or a transposed view; strides "
            f"{v_cache.stride()} for shape {tuple(v_cache.shape)}"
        )
    return True, rows


def rope_bias_cache(
    qkv, bias, cos, sin, k_cache, v_cache, pos_t, start, num_heads, num_kv_heads, q_out=None, scales=None
):
    # scales: (k_scale, v_scale) [Hkv, max_ctx] fp32 of an 8-bit cache (kv_cache.py), else None
    t = qkv.shape[0]
    v_t, v_rows = value_layout(v_cache)
    d = k_cache.shape[-1]
    q = torch.empty((t, num_heads, d), dtype=qkv.dtype, device=qkv.device) if q_out is None else q_out
    block_t = 1 if t == 1 else 16
    k_scale, v_scale = scales or (k_cache, v_cache)  # unread without an 8-bit cache
    launch(_rope_bias_cache_kernel, (triton.cdiv(t, block_t), num_heads + 2 * num_kv_heads))(
        qkv,
        bias,
        cos,
        sin,
        q,
        k_cache,
        v_cache,
        pos_t,
        t,
        k_cache.shape[1],
        k_scale,
        v_scale,
        v_rows,
        NUM_HEADS=num_heads,
        NUM_KV=num_kv_heads,
        D=d,
        BLOCK_T=block_t,
        num_warps=1 if t == 1 else 4,
        KV_FP8=scales is not None,
        V_T=v_t,
        **pdl_launch_args(qkv.device),
    )
    return q


def commit_token(nxt, token, pos, state, queue, ring) -> None:
    """The decode step's next input token and position in one kernel: see forced_tokens.commit_reference. The
    committed token also goes to ring[pos % len(ring)] (pos before the step). `queue` and `ring` may be pinned
    host memory (CPU tensors): the kernel reads and writes them across the bus."""
    assert ring.numel() & (ring.numel() - 1) == 0, "the ring's size is a power of two (a cheap modulo)"
    launch(_commit_token_kernel, (1,))(nxt, token, pos, state, queue, ring, RING=ring.numel(), num_warps=1)


def silu_mul(gate_up, out=None, paired: bool = False):
    """SiLU(gate) * up from [gate | up] rows, or paired: from rows laid out (gate 0, up 0, gate 1, ...), what a
    gate/up weight with its rows in pairs (linears.pair_gate_up_rows) outputs."""
    t, two_i = gate_up.shape
    i = two_i // 2
    out = torch.empty((t, i), dtype=gate_up.dtype, device=gate_up.device) if out is None else out
    block = 1024
    launch(_silu_mul_kernel, (t, triton.cdiv(i, block)))(
        gate_up, out, i, BLOCK=block, PAIRED=paired, num_warps=4, **pdl_launch_args(gate_up.device)
    )
    return out


@dataclass(frozen=True)
class DecodeAttnConfig:
    """How the decode attention splits the cache: up to max_splits programs per KV head (SM_SPLITS: as many as
    give every SM splits_per_sm programs, see sm_splits), each at least min_chunk tokens (a multiple of
    chunk_align, 0: of block_n), block_n tokens per loop step."""

    max_splits: int
    min_chunk: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2
    late_launch: bool = False  # the next kernels launch only after the K/V reads (see the split kernel)
    # The reduce: splits combined per pass (0: all the scratch holds, in one pass) and dimensions of a head per
    # program. One pass over 16 dimensions is faster from 4k tokens on than passes of 32 splits, which add a second
    # dependent round of loads per layer, and the same at 512 (benchmarks/decode_step_by_attention.py --reduce).
    reduce_splits: int = 0
    reduce_dims: int = 16
    chunk_align: int = 0
    early_tile: bool = False  # the first K/V tile is requested before the wait for q (see the split kernel)
    # With max_splits SM_SPLITS: programs per SM (2: two resident programs an SM, each scheduler then has two
    # warps to switch between; shapes whose shared memory lets two fit, DecodeAttention.resolve). Not read with
    # an explicit max_splits: leave it at 1 there.
    splits_per_sm: int = 1
    # The loop over whole tiles: with early_tile over a 16-bit cache, the early tile takes the split's part tile
    # (its tokens past a whole number of tiles), so the loop's tiles need no mask; and 16-bit models take the exp2
    # softmax (m in log2 units, as the prefill). At sm_90 this takes over a third of the split-per-SM loop's
    # instructions a tile away, about a tenth of the 8-bit cache's (exp2 only) (benchmarks/decode_kernel_sass.py).
    # The 32-token shape that serves short contexts is slower with it, so it keeps the plain loop (its machine code
    # unchanged; docs/BENCHMARKS.md, 'Tried and rejected'). The depth shapes take it: about even on an H100, where
    # the kernel waits on memory (docs/BENCHMARKS.md, 'Speed by context depth'), and meant for GPUs with more
    # bandwidth per SM (the H200), where the loop's instructions bound it.
    whole_tiles: bool = False

    @property
    def align(self) -> int:
        return self.chunk_align or self.block_n

    def __str__(self) -> str:
        splits = (
            f"{self.max_splits} splits"
            if self.max_splits != SM_SPLITS
            else "a split per SM"
            if self.splits_per_sm == 1
            else f"{self.splits_per_sm} splits per SM"
        )
        return (
            f"{splits} x >={self.min_chunk} tokens, block {self.block_n}, {self.num_warps} warps, "
            f"{self.num_stages} stages"
            + (", late launch" if self.late_launch else "")
            + (
                f", reduce {self.reduce_splits or 'all'}x{self.reduce_dims}"
                if (self.reduce_splits, self.reduce_dims) != (0, 16)
                else ""
            )
            + (f", chunks aligned to {self.chunk_align}" if self.chunk_align else "")
            + (", first tile early" if self.early_tile else "")
            + (", whole tiles" if self.whole_tiles else "")
        )


SM_SPLITS = 0  # max_splits: KV heads x splits = the GPU's SM count x splits_per_sm (DecodeAttention resolves it)

# Candidates for each depth bucket, timed at warm-up inside the whole decode step (decode_graphs.DecodeStep.tune). The
# first is the default where nothing was tuned (CPU interpreter, reference runs). Timing attention alone over many
# shapes (benchmarks/decode_attention_depths.py) picks the first; in the whole step
# (benchmarks/decode_step_by_attention.py) it is best for 4-bit up to ~1k tokens, and late_launch best for 4-bit
# from 4k on (its GEMVs request their weights early, which competes with long cache reads). Reading each split's
# first K/V tile before the wait for q (early_tile; same tool, --sm-fill) makes the step faster at every depth,
# bf16 and 4-bit, short contexts included, and with it one split per SM (66 x 2 KV heads on 132 SMs, chunks aligned
# to 1 token) beats 64 splits at long contexts. 128 splits of >= 256 tokens, 132 x 64-token tiles, 8 warps, 64- and
# 256-token tiles win nowhere by enough to be worth a compile.
DECODE_ATTN_CONFIGS = (
    DecodeAttnConfig(32, 32, 32, 4, 2, early_tile=True),
    DecodeAttnConfig(SM_SPLITS, 128, 128, 4, 3, chunk_align=1, early_tile=True, whole_tiles=True),
    DecodeAttnConfig(SM_SPLITS, 128, 128, 4, 3, chunk_align=1, early_tile=True, late_launch=True, whole_tiles=True),
)
# Not a candidate for 4-bit models: with their GEMVs' early weight reads the same shape with late launch is faster
# at every depth, so it never wins there, and each candidate is one more compile (the early tile's second softmax
# step) on a first start. For bf16 the two trade places by depth and machine (by about 1%), so both stay.
NOT_FOR_INT4 = (DECODE_ATTN_CONFIGS[1],)
# Candidates for an 8-bit cache only, timed at its warm-up against the others per depth bucket
# (decode_graphs.DecodeStep.tune; each is one more compile on an 8-bit cache's first start). Its split kernel converts
# every fp8 pair to fp16 on the way into the dots: with V transposed a 128-token tile takes about a quarter more
# instructions a warp in the loop at 4 warps than the 16-bit kernel (sm_90: benchmarks/decode_kernel_sass.py), and
# with one 4-warp program an SM each scheduler has one warp, which waits out every dependent instruction. Hence more
# warps to switch between: 8 warps a program (AWQ's fastest from 4k on), or two programs an SM of 64-token tiles (3
# stages: 40,960 bytes each), which in bf16 beats both 8 warps and the split-per-SM 4-warp shape at every depth: each
# scheduler has two warps to switch between, and a split half as long (benchmarks/decode_step_by_attention.py
# --kv-cache 8-bit --sm-fill).
KV8_CONFIGS = (
    DecodeAttnConfig(SM_SPLITS, 128, 128, 8, 3, chunk_align=1, early_tile=True, whole_tiles=True),
    DecodeAttnConfig(SM_SPLITS, 64, 64, 4, 3, chunk_align=1, early_tile=True, splits_per_sm=2, whole_tiles=True),
)


def sm_splits(device, num_kv_heads: int) -> int:
    """Splits per KV head that give every SM one program (132 SMs, 2 KV heads: 66); fewer leave SMs idle at
    depth. Rounded down where the SMs don't divide by the KV heads (114 SMs, 4 KV heads: 28 x 4 = 112 programs):
    a few idle SMs cost less than a second wave of a few programs, which would take as long as the first. Not a
    GPU (Triton's interpreter): 32."""
    device = torch.device(device)
    if device.type != "cuda":
        return 32
    return max(1, torch.cuda.get_device_properties(device).multi_processor_count // num_kv_heads)


def decode_attention_candidates(device, int4: bool = False, kv8: bool = False) -> tuple:
    """The DECODE_ATTN_CONFIGS that differ on this device. Without programmatic dependent launch late_launch
    changes nothing (it would only be one more compile and a coin toss in the tuning), and early_tile only
    re-reads a tile: there the plain kernel, which also compiles faster (Triton 3.6, sm_90, a 2-core machine: ~0.9
    s per variant, ~2.2 s with the early tile's second copy of the softmax step). int4: a model with 4-bit GEMVs,
    which leaves out NOT_FOR_INT4 (a late-launch question: only where programmatic dependent launch runs). kv8:
    an 8-bit cache, which adds KV8_CONFIGS ahead of the last candidate (the last stays the split-per-SM shape the
    prefill's last row runs: Qwen2Model._row_attention), with late launch for 4-bit GEMVs."""
    pdl = pdl_supported(device)

    def here(c: DecodeAttnConfig) -> DecodeAttnConfig:
        return c if pdl else dataclasses.replace(c, early_tile=False, late_launch=False)

    configs = [here(c) for c in DECODE_ATTN_CONFIGS if not (pdl and int4 and c in NOT_FOR_INT4)]
    if kv8:  # with late launch where the model's GEMVs are 4-bit, as their split-per-SM shape (NOT_FOR_INT4)
        configs[-1:-1] = (here(dataclasses.replace(c, late_launch=c.late_launch or int4)) for c in KV8_CONFIGS)
    # one of each, the last occurrence kept: the plain split-per-SM kernel stays last without PDL
    return tuple(reversed(dict.fromkeys(reversed(configs))))


def decode_tile_bytes(k_cache, v_cache) -> int:
    """Shared-memory bytes a value of the decode kernel's K/V tiles takes (DecodeAttention.candidates): the
    cache's, but 2 for an 8-bit cache with V row-major, whose tiles reach the dots through an fp16 copy there;
    with V transposed (the model's 8-bit cache: value_layout) they go in as they are."""
    if k_cache.element_size() == 1 and not value_layout(v_cache)[0]:
        return 2
    return k_cache.element_size()


def for_value_layout(config: DecodeAttnConfig, transposed: bool) -> DecodeAttnConfig:
    """config as it runs over a value cache of this layout (value_layout): a transposed one's V tiles are read
    along their tokens, 16 a load, so each split starts on a 16-token boundary (chunks aligned to a multiple of
    16). The split-per-SM shapes' chunks aligned to 1 token become 16: at the depths where that leaves splits
    idle (32,768 over 66 splits: 64 of 512 tokens instead of 66 of 497) each split still runs 4 tiles of 128."""
    if not transposed or config.align % 16 == 0:
        return config
    return dataclasses.replace(config, chunk_align=16)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def decode_splits(config: DecodeAttnConfig, length: int) -> int:
    """How many splits the kernels use at this depth (what _decode_chunk computes on the device), for a config
    whose max_splits is resolved (DecodeAttention.resolve)."""
    assert config.max_splits > 0, "resolve SM_SPLITS first (DecodeAttention.resolve)"
    chunk = _ceil_div(_ceil_div(length, config.max_splits), config.align) * config.align
    chunk = max(chunk, config.min_chunk)
    return -(-length // chunk)


def launch_first_that_fits(shapes: list, launch_one):
    """launch_one(shape) for each of `shapes` in turn until one launches: Triton refuses a kernel that needs more
    shared memory than this GPU has (OutOfResources) at launch, before anything runs. Returns (the shape that
    ran, what launch_one returned); the last shape's refusal is raised."""
    from triton.runtime.errors import OutOfResources

    for shape in shapes:
        try:
            return shape, launch_one(shape)
        except OutOfResources:
            if shape == shapes[-1]:
                raise


def decode_attention_fallbacks(config: DecodeAttnConfig) -> list[DecodeAttnConfig]:
    """What to run where `config` needs more shared memory than the GPU has, in order: fewer pipeline stages,
    then smaller key tiles. The split-per-SM shape's 3 stages of 128-token K/V tiles take 139,520 bytes (Triton
    3.6, 16-bit, head dim 128, sm_80-90: the same on each), over the 99 KB of an RTX 30/40-series card (sm_86/89),
    where its 2 stages take 73,984; fp32 models (IEEE) need 64-token tiles there (2 stages: 77,888)."""
    out = [dataclasses.replace(config, num_stages=s) for s in (2, 1) if s < config.num_stages]
    out += [
        dataclasses.replace(config, block_n=b, num_stages=min(config.num_stages, 2))
        for b in (64, 32)
        if b < config.block_n and config.chunk_align
    ]  # split lengths not tied to the tile
    return out


def max_shared_memory(device) -> int | None:
    """The most shared memory one program may have on this GPU (what Triton checks a launch against: the opt-in
    limit, 101,376 bytes on an RTX 30/40/50-series card, 232,448 on the H200); None off CUDA or where torch
    doesn't say."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    limit = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", None)
    return limit if limit and limit > 0 else None


DECODE_MIN_QUERY_ROWS = 16  # the split kernel's query tile: the group of query heads, padded to 16 rows at least


def decode_pipeline_bytes(config: DecodeAttnConfig, head_dim: int, kv_bytes: int, pipelined: bool = True) -> int:
    """Shared memory a decode shape needs at the least: the K and V tiles its software pipeline keeps in flight
    (num_stages - 1 of each) and the query tile. Triton 3.6 asks for that plus a little (139,520 bytes for 3 stages
    of 128 x 128 16-bit tiles against 135,168 here, 73,984 for 2 against 69,632; compiled for sm_86/89/90/120;
    each shape of the chains, 16-bit and fp32, checked in tests/test_triton_compile.py), so a shape over a GPU's
    limit by this bound is refused there for certain. pipelined=False: a GPU before compute capability 8.0, where
    Triton makes no asynchronous copies and any number of stages holds one K and one V tile (73,728 bytes at 128 x
    128 fp16 on sm_75 against 69,632 here: over a Turing card's 64 KB, so that shape is not even compiled)."""
    stages = max(config.num_stages - 1, 0) if pipelined else 1
    return (stages * 2 * config.block_n + DECODE_MIN_QUERY_ROWS) * head_dim * kv_bytes


@functools.lru_cache(maxsize=None)
def _with_splits(config: DecodeAttnConfig, splits: int) -> DecodeAttnConfig:
    # cached: an eager decode resolves its config in every layer of every step
    return dataclasses.replace(config, max_splits=splits)


class DecodeAttention:
    """Split-K flash decoding with its scratch buffers preallocated (they must outlive graph capture). The
    number of splits follows the depth on the device (_decode_chunk); `config` picks the kernel shape and can be
    switched between graph captures (one decode graph per depth bucket, decode_graphs.DecodeStep)."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, device, dtype, configs=DECODE_ATTN_CONFIGS):
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.group = num_heads // num_kv_heads
        self.config = configs[0]
        self.sm_splits = sm_splits(device, num_kv_heads)
        self.max_splits = max(self.resolve(c).max_splits for c in configs)
        self.mid_o = torch.empty((num_heads, self.max_splits, head_dim), device=device, dtype=torch.float32)
        self.mid_lse = torch.empty((num_heads, self.max_splits), device=device, dtype=torch.float32)
        self.out = torch.empty((num_heads, head_dim), device=device, dtype=dtype)
        self.working: dict[DecodeAttnConfig, DecodeAttnConfig] = {}  # a config -> the fallback that runs here
        self.shared_limit = max_shared_memory(device)
        self.pipelined = torch.device(device).type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 0)

    def candidates(self, config: DecodeAttnConfig, cache_bytes: int) -> list[DecodeAttnConfig]:
        """config and its fallbacks in the order they are tried, less those this GPU refuses for certain
        (decode_pipeline_bytes over its limit; the last is always kept), for a cache of cache_bytes a value: a shape
        that can't run is then neither compiled ahead on a first start nor compiled just to be refused at the warm-up's
        launch. On an RTX 30/40/50-series card that is the split-per-SM shape's 3 stages: its 2 stages compile ahead
        instead (they fit: 73,984 bytes), where each was otherwise compiled on the loading thread after the refusal
        (1-2 s). Before sm_80 (Turing) one shape per tile size: there 1, 2 or 3 stages of 128-token tiles all
        take 73,728 bytes, over its 64 KB, and each was compiled in turn on a first start only to be refused; now
        none of them is (the bound counts the query tile too), and the 64-token shape is the first tried."""
        # cache_bytes: 2 for a 16-bit cache; an 8-bit cache's row-major tiles are upcast to fp16 on their way into
        # the dots, through shared memory: they count as 16-bit there (sm_89: 108,800 bytes for 3 stages, over an
        # RTX 40's 99 KB); with V transposed (the model's) they don't: 1 (73,728 bytes at sm_90, Triton 3.6)
        chain = [config, *decode_attention_fallbacks(config)]
        if not self.pipelined:  # no asynchronous copies: another stage count is the same kernel, refused alike
            chain = [c for i, c in enumerate(chain) if all(c.block_n != d.block_n for d in chain[:i])]
        if self.shared_limit is None:
            return chain
        plausible = [
            c
            for c in chain
            if decode_pipeline_bytes(c, self.head_dim, cache_bytes, self.pipelined) <= self.shared_limit
        ]
        return plausible or chain[-1:]

    def resolve(self, config: DecodeAttnConfig) -> DecodeAttnConfig:
        """The configuration with SM_SPLITS replaced by this GPU's count (times its splits_per_sm)."""
        if config.max_splits != SM_SPLITS:
            return config
        return _with_splits(config, self.sm_splits * config.splits_per_sm)

    def __call__(self, q, k_cache, v_cache, pos_t, length, scale, config: DecodeAttnConfig | None = None, scales=None):
        # q: [Hq, D]; k_cache/v_cache: [Hkv, max_ctx, D]; scales: (k_scale, v_scale) [Hkv, max_ctx] of an 8-bit
        # cache, else None; returns [Hq, D] (a reused buffer)
        v_t, v_rows = value_layout(v_cache)
        asked = self.resolve(config or self.config)
        assert asked.max_splits <= self.max_splits
        pdl = pdl_launch_args(q.device)
        k_scale, v_scale = scales or (k_cache, v_cache)  # unread without an 8-bit cache

        def split_kernel(c: DecodeAttnConfig) -> None:
            launch(_decode_attn_split_kernel, (self.num_kv_heads, c.max_splits))(
                q,
                k_cache,
                v_cache,
                pos_t,
                self.mid_o,
                self.mid_lse,
                k_cache.shape[1],
                scale,
                k_scale,
                v_scale,
                v_rows,
                KV_FP8=scales is not None,
                V_T=v_t,
                GROUP=self.group,
                BLOCK_G=max(16, triton.next_power_of_2(self.group)),
                D=self.head_dim,
                BLOCK_N=c.block_n,
                MAX_SPLITS=c.max_splits,
                MIN_CHUNK=c.min_chunk,
                CHUNK_ALIGN=c.align,
                IEEE=q.dtype == torch.float32,
                LATE_LAUNCH=c.late_launch,
                EARLY_TILE=c.early_tile,
                WHOLE_TILES=c.whole_tiles,
                num_warps=c.num_warps,
                num_stages=c.num_stages,
                **pdl,
            )

        tries = (
            [self.working[asked]]
            if asked in self.working
            else self.candidates(asked, decode_tile_bytes(k_cache, v_cache))
        )
        # as they run over this cache's value layout: the split and reduce kernels must cut the same splits
        c, _ = launch_first_that_fits([for_value_layout(t, v_t) for t in tries], split_kernel)
        if not precompile.active():  # a compile-only pass proves nothing about shared memory
            self.working[asked] = c
        block_d = min(c.reduce_dims, self.head_dim)
        launch(_decode_attn_reduce_kernel, (self.num_heads, self.head_dim // block_d))(
            self.mid_o,
            self.mid_lse,
            self.out,
            pos_t,
            c.align,
            c.max_splits,
            c.min_chunk,
            D=self.head_dim,
            BLOCK_D=block_d,
            BLOCK_S=c.reduce_splits or triton.next_power_of_2(self.max_splits),
            num_warps=2,
            **pdl,
        )
        return self.out


class PrefillAttention:
    """Causal attention for a prefill over a cached prefix (or none), start read from a device tensor. The
    split scratch is allocated once for the largest prefill (PREFILL_CHUNK tokens) it is asked to split."""

    # (up to this many new tokens, (BLOCK_M, BLOCK_N, num_warps, num_stages)). With the exp2 softmax one shape is the
    # fastest or within 2% of it for every prefill a sweep of tile shapes timed, and faster than the earlier
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
        programs for the H200's 132 SMs: splitting it only added the reduce), up to MAX_SPLITS for short ones."""
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
            # set-up did not pay (H200: 512 cached + 256 new 2.5-2.6 -> 2.8 ms); one variant each way, as before.
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


# Depth buckets of the decode graphs: each gets the attention configuration that was fastest for its depths.
DEPTH_BUCKETS = (1024, 4096, 16384, 32768)


def depth_buckets(max_ctx: int) -> list[int]:
    """Upper depths of the buckets a context of max_ctx tokens needs (the last one is max_ctx)."""
    return [b for b in DEPTH_BUCKETS if b < max_ctx] + [max_ctx]


# (BLOCK_N, BLOCK_K, num_warps[, K splits]) tried against cuBLAS for each weight shape at warm-up (see
# gemv_autotune); no fourth item: one split. For the 1.5B's shapes (benchmarks/dense_gemv_configs.py; docs/
# BENCHMARKS.md, 'Kernel-level numbers (H200)'): (4, 512, 4) is best or within 1% for QKV, (8, 256, 4) for gate/up
# with its SiLU output (faster than a GEMV then a SiLU kernel); cuBLAS wins none. (32, 512, 8), best for O in that
# sweep, loses to (4, 512, 4) in the warm-up's own timing, so it is not a candidate.
GEMV_CONFIGS = ((4, 512, 4), (8, 256, 4), (16, 256, 8))
# Chunks of BLOCK_K weight columns each GEMV program requests before waiting for its input (see _gemv_kernel);
# a module setting so that benchmarks can compare (benchmarks/profile_decode.py --gemv-early).
GEMV_EARLY_CHUNKS = 3
# The L2 policy of the GEMVs' weight loads, dense and 4-bit ("" = the default): a weight is read once a step and the
# weights are far larger than L2 (3.1 GB against 50 MB), so their lines need not stay there and push out what is
# read again (activations, split partials, the attention's scratch). evict_first makes the whole decode step faster
# at every depth, bf16 and AWQ (benchmarks/l2_prefetch.py; docs/BENCHMARKS.md, 'Bounds: what bytes, FLOPs and
# bandwidth allow'). A module setting, so that benchmarks can compare.
GEMV_WEIGHT_EVICTION = "evict_first"
# Configs that split K across programs (fp32 partials, summed by the last split to finish), tried for weights of
# at least GEMV_SPLIT_MIN_K inputs: the MLP's down projection, whose programs otherwise each stream all of its
# 8,960 columns (1.5B). In the same sweep 4 splits of (8, 512, 4) beat cuBLAS and the best config without a split
# by a wide margin, the next two within 7%, and the decode step measured clearly faster (docs/BENCHMARKS.md,
# 'Kernel-level numbers (H200)').
GEMV_SPLIT_CONFIGS = ((8, 512, 4, 4), (4, 512, 4, 3))
GEMV_SPLIT_MIN_K = 4096
# For the gate/up weight with its SiLU output, the two of GEMV_CONFIGS within 4% of each other in the warm-up's
# timing ((16, 256, 8) is well behind): each candidate is one more compile on a first start.
GEMV_SILU_CONFIGS = ((8, 256, 4), (4, 512, 4))


_COUNTERS: dict = {}
MAX_ROW_BLOCKS = 1 << 16


def split_counters(device) -> torch.Tensor:
    """Arrival counts for the split GEMVs (dense and int4), one per row block, zero between calls (the last split
    resets its own). Made once per device, before any CUDA-graph capture uses it (Linears does so at load); kernels on
    one stream run one at a time, so every GEMV can share it."""
    device = torch.device(device)
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros(MAX_ROW_BLOCKS, dtype=torch.int32, device=device)
    return _COUNTERS[device]


def gemv_split(k: int, config: tuple) -> tuple[int, int]:
    """(columns per split, splits) for a GEMV config over k inputs: whole BLOCK_K chunks per split."""
    block_k = config[1]
    requested = config[3] if len(config) > 3 else 1
    per_split = triton.cdiv(triton.cdiv(k, requested), block_k) * block_k
    return per_split, triton.cdiv(k, per_split)


def gemv(x: torch.Tensor, w: torch.Tensor, config: tuple, silu_output: bool = False) -> torch.Tensor:
    """x [1, K] @ W[N, K].T -> [1, N] (what F.linear computes, for a single token). silu_output: W is the MLP's
    gate/up weight with its rows in pairs (linears.pair_gate_up_rows) -> SiLU(gate) * up [1, N/2]."""
    n, k = w.shape
    block_n, block_k, warps = config[:3]
    per_split, splits = gemv_split(k, config)
    if splits > 1 and triton.cdiv(n, block_n) > MAX_ROW_BLOCKS:
        raise ValueError(f"GEMV: {n} outputs in blocks of {block_n} exceed {MAX_ROW_BLOCKS} row blocks")
    out = torch.empty((1, n // 2 if silu_output else n), dtype=x.dtype, device=x.device)
    partials = torch.empty((splits, n), dtype=torch.float32, device=x.device) if splits > 1 else out
    early = min(GEMV_EARLY_CHUNKS, triton.cdiv(per_split, block_k))  # a K of one or two chunks: all of it early
    launch(_gemv_kernel, (triton.cdiv(n, block_n), splits))(
        x,
        w,
        out,
        partials,
        split_counters(x.device),
        n,
        k,
        per_split,
        splits,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        EARLY=early,
        SILU_OUTPUT=silu_output,
        W_EVICT=GEMV_WEIGHT_EVICTION,
        num_warps=warps,
        **pdl_launch_args(x.device),
    )
    return out


def _graph_time_us(fn, calls: int) -> float:
    """GPU time of one call, from a CUDA graph of `calls` calls (no launch overhead in the measurement)."""
    stream = side_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with graph_capture(graph):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / (5 * calls)


def time_configs(ws: list, configs, call) -> dict:
    """GPU microseconds per call of call(w, config) for each config, timed in a CUDA graph over all the weights
    ws (one per layer, so each read comes from HBM as in decoding, not from L2). Configs this GPU can't run
    (shared memory, registers) are left out."""
    results = {}
    for config in configs:

        def fn(config=config):
            for w in ws:
                call(w, config)

        try:
            results[config] = _graph_time_us(fn, len(ws))
        except Exception:
            continue
    return results


def gemv_candidates(k: int, silu_output: bool = False) -> tuple:
    """The GEMV configs tried (and compiled) for a weight of k inputs (the gate/up one with its SiLU output)."""
    if silu_output:
        return GEMV_SILU_CONFIGS
    return GEMV_CONFIGS + (GEMV_SPLIT_CONFIGS if k >= GEMV_SPLIT_MIN_K else ())


def gemv_autotune(weights_by_use: dict) -> dict:
    """weights_by_use: {(shape, SiLU output?): [weights]}. For each use, the fastest of cuBLAS (config None; with
    SiLU output: cuBLAS then silu_mul on the paired rows) and our GEMV configs on this GPU, timed on the call the
    decoder makes. Returns {"choice": {use: config or None (cuBLAS)}, "timings_us": {use: {config: us}}}."""
    import torch.nn.functional as F

    choice, timings = {}, {}
    for (shape, silu), ws in weights_by_use.items():
        x = torch.randn(1, shape[1], device=ws[0].device, dtype=ws[0].dtype)

        def call(w, config):
            if config is not None:
                return gemv(x, w, config, silu_output=silu)
            return silu_mul(F.linear(x, w), paired=True) if silu else F.linear(x, w)

        results = time_configs(ws, (None,) + gemv_candidates(shape[1], silu), call)
        choice[(shape, silu)] = min(results, key=results.get)
        timings[(shape, silu)] = results
    return {"choice": choice, "timings_us": timings}
