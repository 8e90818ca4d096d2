"""The single-token dense GEMV's Triton kernel and its helpers (_finish_rows is jit_int4's too), by themselves:
this module imports Triton and nothing else (no torch), so a first start's compile worker processes
(compile_workers) can load them in a fraction of a second. The host-side wrapper, its configurations and the
autotune are in gemv."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _gemv_chunk(x_ptr, w_chunk, k0, K, BLOCK_K: tl.constexpr):
    cols = k0 + tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
    return w_chunk.to(tl.float32) * x[None, :]


@triton.jit
def _gemv_w(w_ptr, rows, row_mask, k0, K, BLOCK_K: tl.constexpr, W_EVICT: tl.constexpr = ""):
    cols = k0 + tl.arange(0, BLOCK_K)
    return tl.load(
        w_ptr + rows[:, None] * K + cols[None, :],
        mask=row_mask[:, None] & (cols < K)[None, :],
        other=0.0,
        eviction_policy=W_EVICT,
    )


@triton.jit
def _store_rows(out_ptr, total, rows, row_mask, BLOCK_N: tl.constexpr, SILU_OUTPUT: tl.constexpr):
    # total [BLOCK_N] fp32 -> out. SILU_OUTPUT: rows come in (gate, up) pairs (awq.pair_gate_up,
    # linears.pair_gate_up_rows); store SiLU(gate) * up at the pair's index, each rounded to the output dtype first
    # as the separate kernels would (the GEMV's output, then _silu_mul_kernel's reads of it).
    if SILU_OUTPUT:
        gate, up = tl.split(tl.reshape(total.to(out_ptr.dtype.element_ty).to(tl.float32), [BLOCK_N // 2, 2]))
        pair_rows = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        pair_mask = tl.max(tl.reshape(row_mask.to(tl.int32), [BLOCK_N // 2, 2]), axis=1) > 0
        tl.store(out_ptr + pair_rows, (gate / (1.0 + tl.exp(-gate)) * up).to(out_ptr.dtype.element_ty), mask=pair_mask)
    else:
        tl.store(out_ptr + rows, total.to(out_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def _finish_rows(
    out_ptr, part_ptr, count_ptr, total, rows, row_mask, N, splits, BLOCK_N: tl.constexpr, SILU_OUTPUT: tl.constexpr
):
    # A GEMV program's row sums -> out. Split along K (splits > 1, program_id(1) = the split): each split leaves
    # fp32 partial sums; the last split of a row block to finish (an atomic arrival count) adds them up in a
    # fixed order and resets the count. No second kernel launch.
    if splits > 1:
        tl.store(part_ptr + tl.program_id(1) * N + rows, total, mask=row_mask)
        tl.debug_barrier()  # every thread's partials are written before the arrival is counted
        arrived = tl.atomic_add(count_ptr + tl.program_id(0), 1, sem="acq_rel")
        if arrived == splits - 1:
            total = tl.zeros([BLOCK_N], tl.float32)
            for c in range(0, splits):
                total += tl.load(part_ptr + c * N + rows, mask=row_mask, other=0.0, cache_modifier=".cg")
            _store_rows(out_ptr, total, rows, row_mask, BLOCK_N, SILU_OUTPUT)
            tl.atomic_xchg(count_ptr + tl.program_id(0), 0)
    else:
        _store_rows(out_ptr, total, rows, row_mask, BLOCK_N, SILU_OUTPUT)


# splits is a plain int: 1 (no split) and the split counts share one compiled kernel per shape of tile.
@triton.jit(do_not_specialize=["splits"])
def _gemv_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    part_ptr,
    count_ptr,
    N,
    K,
    K_SPLIT,
    splits,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    EARLY: tl.constexpr,
    SILU_OUTPUT: tl.constexpr,
    W_EVICT: tl.constexpr = "",
):
    # One token: out[n] = sum_k x[k] * W[n, k]. Program (r, c) owns BLOCK_N rows of W over columns c*K_SPLIT..
    # (K_SPLIT a multiple of BLOCK_K; one split: all of K) and streams them once; partial products stay in
    # registers and are reduced once at the end. EARLY (0-3): the first EARLY chunks of BLOCK_K columns are
    # requested before the wait for the kernel ahead (programmatic dependent launch): nothing ever writes the
    # weights, so their DRAM latency can overlap that kernel's end (as the int4 GEMV does); only x must wait.
    # The host keeps EARLY chunks within K_SPLIT. SILU_OUTPUT: the MLP's gate/up weight with its rows in pairs:
    # out gets SiLU(gate) * up (no separate kernel, no [gate | up] round trip through memory). W_EVICT: the L2
    # policy of the weight loads ("" or "evict_first": a weight is read once a step, so it need not stay).
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    k_begin = tl.program_id(1) * K_SPLIT
    if EARLY > 0:
        w0 = _gemv_w(w_ptr, rows, row_mask, k_begin, K, BLOCK_K, W_EVICT)
    if EARLY > 1:
        w1 = _gemv_w(w_ptr, rows, row_mask, k_begin + BLOCK_K, K, BLOCK_K, W_EVICT)
    if EARLY > 2:
        w2 = _gemv_w(w_ptr, rows, row_mask, k_begin + 2 * BLOCK_K, K, BLOCK_K, W_EVICT)
    if PDL:
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    if EARLY > 0:
        acc += _gemv_chunk(x_ptr, w0, k_begin, K, BLOCK_K)
    if EARLY > 1:
        acc += _gemv_chunk(x_ptr, w1, k_begin + BLOCK_K, K, BLOCK_K)
    if EARLY > 2:
        acc += _gemv_chunk(x_ptr, w2, k_begin + 2 * BLOCK_K, K, BLOCK_K)
    for k0 in range(k_begin + EARLY * BLOCK_K, tl.minimum(k_begin + K_SPLIT, K), BLOCK_K):
        acc += _gemv_chunk(x_ptr, _gemv_w(w_ptr, rows, row_mask, k0, K, BLOCK_K, W_EVICT), k0, K, BLOCK_K)
    _finish_rows(out_ptr, part_ptr, count_ptr, tl.sum(acc, axis=1), rows, row_mask, N, splits, BLOCK_N, SILU_OUTPUT)
