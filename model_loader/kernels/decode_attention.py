"""The decode step's attention: split-K flash decoding over the cache, GQA-aware (SDPA + mask -> 2 launches:
the split kernel and the reduce), whose split count follows the depth on the device. Its shapes
(DecodeAttnConfig), their tables (DECODE_ATTN_CONFIGS, NOT_FOR_INT4, KV8_CONFIGS), the candidates a warm-up times
per depth bucket (depth_buckets), the fallbacks where shared memory is short, and DecodeAttention, which holds the
scratch buffers and launches. The kernels themselves are in jit_decode_attention.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import triton

from model_loader.kernels import precompile
from model_loader.kernels.features import launch_first_that_fits, max_shared_memory, pdl_launch_args, pdl_supported
from model_loader.kernels.jit_decode_attention import _decode_attn_reduce_kernel, _decode_attn_split_kernel
from model_loader.kernels.precompile import launch
from model_loader.kernels.small_ops import value_layout


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
# step) on a first start. For bf16 the two trade places by depth and machine (by little), so both stay.
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
    re-reads a tile: there the plain kernel, which also compiles faster (the early tile adds a second copy of the
    softmax step to compile). int4: a model with 4-bit GEMVs,
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
        instead (they fit: 73,984 bytes), rather than the 3 stages being compiled on the loading thread after the
        refusal. Before sm_80 (Turing) one shape per tile size: there 1, 2 or 3 stages of 128-token tiles all
        take 73,728 bytes, over its 64 KB, so none of them is compiled on a first start only to be refused (the
        bound counts the query tile too), and the 64-token shape is the first tried."""
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


# Depth buckets of the decode graphs: each gets the attention configuration that was fastest for its depths.
DEPTH_BUCKETS = (1024, 4096, 16384, 32768)


def depth_buckets(max_ctx: int) -> list[int]:
    """Upper depths of the buckets a context of max_ctx tokens needs (the last one is max_ctx)."""
    return [b for b in DEPTH_BUCKETS if b < max_ctx] + [max_ctx]
