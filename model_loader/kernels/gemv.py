"""The single-token dense GEMV (x [1, K] @ W.T, used per weight shape where the warm-up measures it faster than
cuBLAS): its configurations (GEMV_CONFIGS, GEMV_SPLIT_CONFIGS, GEMV_SILU_CONFIGS), the split arrival counters it
shares with the int4 GEMV, the GPU timing through CUDA graphs (time_configs, also int4_triton's) and the warm-up's
choice per weight shape (gemv_autotune). The kernel itself is in jit_gemv.
"""

from __future__ import annotations

import torch
import triton

from model_loader.kernels.features import pdl_launch_args
from model_loader.kernels.jit_gemv import _gemv_kernel
from model_loader.kernels.precompile import launch
from model_loader.kernels.side_stream import graph_capture, side_stream
from model_loader.kernels.small_ops import silu_mul


# (BLOCK_N, BLOCK_K, num_warps[, K splits]) tried against cuBLAS for each weight shape at warm-up (see
# gemv_autotune); no fourth item: one split. For the 1.5B's shapes (benchmarks/dense_gemv_configs.py; docs/
# BENCHMARKS.md, 'Kernel-level numbers (H200)'): (4, 512, 4) is best or close to it for QKV, (8, 256, 4) for gate/up
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
# by a wide margin, the next two come close, and the decode step is clearly faster (docs/BENCHMARKS.md,
# 'Kernel-level numbers (H200)').
GEMV_SPLIT_CONFIGS = ((8, 512, 4, 4), (4, 512, 4, 3))
GEMV_SPLIT_MIN_K = 4096
# For the gate/up weight with its SiLU output, the two of GEMV_CONFIGS close to each other in the warm-up's
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
