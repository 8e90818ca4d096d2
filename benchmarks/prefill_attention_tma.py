"""The prefill attention over a cached prefix: production's (pointer loads) against a stand-alone kernel that
reads K/V through TMA tensor descriptors and production's kernel as it was with TMA loads (with and without its
NaN guard on V), GPU time per layer through CUDA graphs of 28 layers' caches (no host
launch cost; each layer's K/V its own memory), outputs checked against each other.

Why it is here (2026-12-04, thirteenth session, docs/BENCHMARKS.md): this stand-alone kernel was 15-25% faster
than production's at every long case on the H200 (512 + 2,048: 57 vs 68 us a layer), but the same TMA loads put
into production's kernel (with its key splits, programmatic dependent launch and shared softmax step) were not:
68 / 172 / 100 us against 68 / 192 / 91 at 512 + 2,048 / 4,096 + 2,048 / 4,096 + 1,024, so they were taken out
again. What makes the difference is not yet known; this script is where to look for it (compiled for sm_90 on
a CPU, the two differ in the diagonal loop, where production's guard takes V through registers).

Since the fourteenth session production reads K/V through TMA itself (without the guard, which was all of the
difference); --production-shapes times its kernel with other tile shapes, --packed-shapes with the query heads of
a KV head packed into its row blocks (PACK_GQA, fifteenth session).

usage: python benchmarks/prefill_attention_tma.py [--cases 512+2048,4096+2048,4096+1024] [--shapes 64,64,4,3;...]
           [--production-shapes 64,64,4,2;...] [--packed-shapes 128,64,8,3;...] [--no-old]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model_loader.kernels import triton_ops as T  # noqa: E402
from model_loader.kernels.jit_ops import (LN_2, LOG2_E, _online_softmax_block,  # noqa: E402
                                          _online_softmax_block_exp2, _pdl_start)

LAYERS, HQ, HKV, D = 28, 12, 2, 128


# Production's kernel as it was with TMA loads (commit 7751ed4), GUARD_V: its diagonal loop zeroes V past the new
# tokens (the NaN guard, which takes V through registers); without it the loop feeds the tensor cores from the TMA
# buffer as the stand-alone kernel does (stale NaN rows would then leak in: for timing only).
@triton.jit
def _prod_kv_tile(k_ptr, v_ptr, base, n0, n, d, hi, D: tl.constexpr, MASKED: tl.constexpr, TMA: tl.constexpr,
                  GUARD_V: tl.constexpr):
    """The K and V tiles of keys n = n0 + [0, BLOCK_N) of one KV head (base: its first element; with TMA its
    first row). MASKED: keys from hi on are zeros. A descriptor reads whole tiles (rows past the tensor come back
    as zeros): rows from hi on are stale cache rows, finite unless an earlier reply overflowed, so V's are zeroed
    (a NaN there would survive a zero weight); K's scores are masked by the caller."""
    if TMA:
        row = base // D + n0
        k = k_ptr.load([row, 0])
        v = v_ptr.load([row, 0])
        if MASKED and GUARD_V:
            v = tl.where((n < hi)[:, None], v, 0.0)
    elif MASKED:
        k = tl.load(k_ptr + base + n[:, None] * D + d[None, :], mask=(n < hi)[:, None], other=0.0)
        v = tl.load(v_ptr + base + n[:, None] * D + d[None, :], mask=(n < hi)[:, None], other=0.0)
    else:
        k = tl.load(k_ptr + base + n[:, None] * D + d[None, :])
        v = tl.load(v_ptr + base + n[:, None] * D + d[None, :])
    return k, v


@triton.jit(do_not_specialize=["n_tokens", "splits"])
def _prod_tma_kernel(q_ptr, k_ptr, v_ptr, out_ptr, mid_o_ptr, mid_lse_ptr, start_ptr, n_tokens, max_ctx, scale,
                         splits, NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, IEEE: tl.constexpr,
                         PDL: tl.constexpr, TMA: tl.constexpr, GUARD_V: tl.constexpr):
    # Causal attention of n_tokens new queries at positions start.. over the cache's keys 0..start+n_tokens-1,
    # bottom-right aligned (query i sees keys <= start+i). `start` is read on the device, so one captured graph
    # per length bucket serves any cached prefix; no mask tensor and no repeated K/V (the KV head is indexed).
    # SPLIT (few queries, long prefix): the keys are cut into `splits` ranges whose partial results
    # _prefill_attn_reduce_kernel combines, so short prefills still fill the GPU. The split count is a plain
    # int so that every bucket shares two compiled variants (split or not).
    # TMA (Hopper and newer, 16-bit, not split): k_ptr and v_ptr are tensor descriptors of the caches as
    # [Hkv * max_ctx, D] with [BLOCK_N, D] blocks, so the K/V tiles come in through the tensor memory accelerator
    # instead of per-thread address arithmetic and loads (H200: a follow-up of 4,096 cached + 2,048 new tokens
    # 14.5 -> 13.7 ms; alone, per layer, 192 -> 160 us).
    _pdl_start(PDL)
    mblock = tl.num_programs(0) - 1 - tl.program_id(0)  # the last rows see the most keys: start them first
    head = tl.program_id(1)
    split = tl.program_id(2)
    kvh = head // GROUP
    start = tl.load(start_ptr)
    rows = mblock * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_tokens
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (rows[:, None] * NUM_HEADS + head) * D + d[None, :], mask=row_mask[:, None], other=0.0)
    visible = start + rows  # last key each row may see
    hi = tl.minimum(start + (mblock + 1) * BLOCK_M, start + n_tokens)  # keys this block needs
    chunk = tl.cdiv(tl.cdiv(start + n_tokens, splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(hi, lo + chunk)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    base = kvh * max_ctx * D
    # Keys below start + the block's first row are visible to every row of the block: whole key blocks there
    # need no mask (most of the work of a long prefill); the rest, up to the diagonal, are masked.
    open_blocks = tl.maximum(tl.minimum(start + mblock * BLOCK_M, hi) - lo, 0) // BLOCK_N
    qk_scale = scale * LOG2_E  # 16-bit inputs: m_i in log2 units (_online_softmax_block_exp2)
    for i in range(0, open_blocks):
        n = lo + i * BLOCK_N + tl.arange(0, BLOCK_N)
        k, v = _prod_kv_tile(k_ptr, v_ptr, base, lo + i * BLOCK_N, n, d, hi, D, MASKED=False, TMA=TMA, GUARD_V=GUARD_V)
        if IEEE:
            m_i, l_i, acc = _online_softmax_block(q, k, v, None, m_i, l_i, acc, scale, IEEE, MASKED=False)
        else:
            m_i, l_i, acc = _online_softmax_block_exp2(q, k, v, None, m_i, l_i, acc, qk_scale, MASKED=False)
    for n_start in range(lo + open_blocks * BLOCK_N, hi, BLOCK_N):
        n = n_start + tl.arange(0, BLOCK_N)
        k, v = _prod_kv_tile(k_ptr, v_ptr, base, n_start, n, d, hi, D, MASKED=True, TMA=TMA, GUARD_V=GUARD_V)
        visible_mask = (n[None, :] <= visible[:, None]) & (n[None, :] < hi)
        if IEEE:
            m_i, l_i, acc = _online_softmax_block(q, k, v, visible_mask, m_i, l_i, acc, scale, IEEE)
        else:
            m_i, l_i, acc = _online_softmax_block_exp2(q, k, v, visible_mask, m_i, l_i, acc, qk_scale)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    if not SPLIT:
        tl.store(out_ptr + (rows[:, None] * NUM_HEADS + head) * D + d[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=row_mask[:, None])
    else:  # partial result of this key range; a row that saw none of it gets weight 0 (lse -inf)
        mid = (split * n_tokens + rows) * NUM_HEADS + head
        tl.store(mid_o_ptr + mid[:, None] * D + d[None, :], o, mask=row_mask[:, None])
        if IEEE:
            lse = m_i + tl.log(l_safe)
        else:  # back to natural units, as the reduce kernel reads them
            lse = (m_i + tl.log2(l_safe)) * LN_2
        tl.store(mid_lse_ptr + mid, tl.where(l_i > 0, lse, float("-inf")), mask=row_mask)



@triton.jit
def _pf_tma(q_ptr, k_desc, v_desc, out_ptr, start_ptr, n_tokens, max_ctx, scale,
            NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr):
    mblock = tl.num_programs(0) - 1 - tl.program_id(0)
    head = tl.program_id(1)
    kvh = head // GROUP
    start = tl.load(start_ptr)
    rows = mblock * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_tokens
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (rows[:, None] * NUM_HEADS + head) * D + d[None, :], mask=row_mask[:, None], other=0.0)
    visible = start + rows
    hi = tl.minimum(start + (mblock + 1) * BLOCK_M, start + n_tokens)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    base = kvh * max_ctx
    open_blocks = tl.minimum(start + mblock * BLOCK_M, hi) // BLOCK_N
    qk_scale = scale * LOG2_E
    for i in range(0, open_blocks):
        k = k_desc.load([base + i * BLOCK_N, 0])
        v = v_desc.load([base + i * BLOCK_N, 0])
        s = tl.dot(q, tl.trans(k))
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    for n_start in range(open_blocks * BLOCK_N, hi, BLOCK_N):
        n = n_start + tl.arange(0, BLOCK_N)
        k = k_desc.load([base + n_start, 0])
        v = v_desc.load([base + n_start, 0])
        visible_mask = (n[None, :] <= visible[:, None]) & (n[None, :] < hi)
        s = tl.dot(q, tl.trans(k))
        s = tl.where(visible_mask, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
        m_off = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_off)
        p = tl.math.exp2(s * qk_scale - m_off[:, None])
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    tl.store(out_ptr + (rows[:, None] * NUM_HEADS + head) * D + d[None, :], o.to(out_ptr.dtype.element_ty),
             mask=row_mask[:, None])


def tma_call(q, k, v, st, scale, shape):
    """The stand-alone kernel for one layer (no key splits, no programmatic dependent launch)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    bm, bn, w, stg = shape
    t = q.shape[0]
    out = torch.empty((t, HQ * D), device=q.device, dtype=q.dtype)
    kd = TensorDescriptor.from_tensor(k.view(-1, D), [bn, D])
    vd = TensorDescriptor.from_tensor(v.view(-1, D), [bn, D])
    _pf_tma[(triton.cdiv(t, bm), HQ)](q, kd, vd, out, st, t, k.shape[1], scale, NUM_HEADS=HQ, GROUP=HQ // HKV,
                                       D=D, BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=stg)
    return out



def prod_tma_call(q, k, v, st, scale, guard_v: bool, shape=(64, 64, 4, 3)):
    """Production's kernel structure (key splits off, programmatic dependent launch as production launches it)
    with TMA loads, for one layer."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, warps, stages = shape
    t = q.shape[0]
    out = torch.empty((t, HQ * D), device=q.device, dtype=q.dtype)
    kd = TensorDescriptor.from_tensor(k.view(-1, D), [bn, D])
    vd = TensorDescriptor.from_tensor(v.view(-1, D), [bn, D])
    pdl = T.pdl_launch_args(q.device)
    _prod_tma_kernel[(triton.cdiv(t, bm), HQ, 1)](
        q, kd, vd, out, out, out, st, t, k.shape[1], scale, 1, NUM_HEADS=HQ, GROUP=HQ // HKV, D=D, BLOCK_M=bm,
        BLOCK_N=bn, SPLIT=False, IEEE=False, TMA=True, GUARD_V=guard_v, num_warps=warps, num_stages=stages, **pdl)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="512+2048,4096+2048,512+1024,1024+1024,4096+1024")
    ap.add_argument("--shapes", default="64,64,4,3;128,64,8,3", help="TMA tile shapes: BLOCK_M,BLOCK_N,warps,stages;...")
    ap.add_argument("--production-shapes", default="",
                    help="also production's kernel (TMA since the fourteenth session) with these tile shapes")
    ap.add_argument("--packed-shapes", default="",
                    help="also production's kernel with all query heads of a KV head in a row block (PACK_GQA)")
    ap.add_argument("--no-old", action="store_true", help="leave out the thirteenth session's guard variants")
    args = ap.parse_args()
    cases = [tuple(int(x) for x in c.split("+")) for c in args.cases.split(",")]
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";") if s]
    production_shapes = [tuple(int(x) for x in s.split(",")) for s in args.production_shapes.split(";") if s]
    packed_shapes = [tuple(int(x) for x in s.split(",")) for s in args.packed_shapes.split(";") if s]
    torch.manual_seed(0)
    k = torch.randn(LAYERS, HKV, max(p + n for p, n in cases), D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    for start, t in cases:
        q = torch.randn(t, HQ, D, device="cuda", dtype=torch.bfloat16)
        st = torch.tensor([start], device="cuda", dtype=torch.int32)
        attn = T.PrefillAttention(HQ, HKV, D, "cuda", max_tokens=2048)
        variants = {"production": lambda i: attn(q, k[i], v[i], st, D ** -0.5)}
        ran = {}  # variant -> its PrefillAttention, to report the shape that ran (a refused one falls back)
        for shape in shapes:
            variants[f"TMA {shape}"] = lambda i, shape=shape: tma_call(q, k[i], v[i], st, D ** -0.5, shape)
        for shape in production_shapes:
            shaped = T.PrefillAttention(HQ, HKV, D, "cuda", max_tokens=2048)
            shaped.SHAPES = ((None, shape),)
            variants[f"production {shape}"] = lambda i, a=shaped: a(q, k[i], v[i], st, D ** -0.5)
        for shape in packed_shapes:
            packed = type("Packed", (T.PrefillAttention,), {"PACK_GQA": True, "SHAPES": ((None, shape),)})
            shaped = packed(HQ, HKV, D, "cuda", max_tokens=2048)  # its scratch sized for its own splits
            variants[f"packed {shape}"] = lambda i, a=shaped: a(q, k[i], v[i], st, D ** -0.5)
            ran[f"packed {shape}"] = shaped
        for guard in () if args.no_old else (True, False):
            variants[f"production + TMA, V guard {'on' if guard else 'off'}"] = (
                lambda i, guard=guard: prod_tma_call(q, k[i], v[i], st, D ** -0.5, guard))
        expected = variants["production"](0).float()
        row = []
        for name, fn in variants.items():
            err = (fn(0).float() - expected).abs().max().item()
            for i in range(LAYERS):
                fn(i)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for i in range(LAYERS):
                    fn(i)
            best = float("inf")
            for _ in range(3):
                graph.replay()
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                for _ in range(5):
                    graph.replay()
                end.record()
                end.synchronize()
                best = min(best, begin.elapsed_time(end) * 1000 / 5 / LAYERS)
            fell_back = f", ran as {ran[name].shape_for(t)}" if name in ran and ran[name].shape_for(t) != ran[name]._tuned(t) else ""
            row.append(f"{name} {best:.1f} us (max diff {err:.4f}{fell_back})")
        print(f"{start} cached + {t} new, per layer: " + "; ".join(row), flush=True)


if __name__ == "__main__":
    main()
