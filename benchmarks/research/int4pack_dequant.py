"""Is a torch-layout dequantiser that loads each packed int32 once faster than model_loader's, which computes the
address and loads the word for every output element? It prefills a 4-bit model in torch's int4 layout (the
default on RTX 30/40 cards) and serves a scheduler's rows where torch's kernel loses, so it sits in their TTFT and
in 4-bit batches of 24-32 rows (docs/BENCHMARKS.md, "4-bit, several at once": 64 against 42 µs for the gate/up
weight's dequantise + cuBLAS in the row-packed layout). Correct in Triton's interpreter (the same numbers to the
bit); never timed on a GPU.

    python -m benchmarks.research.int4pack_dequant [--shapes 2048x1536,1536x1536,17920x1536,1536x8960]

Prints, per shape, GPU µs a call of each kernel over copies of the weight past the L2 (as a prefill streams them),
and whether the two wrote the same dense weight. Under TRITON_INTERPRET=1 on the CPU: the check alone.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from model_loader import awq as fmt
from model_loader.kernels import int4_triton


@triton.jit
def _int4pack_dequantize_words_kernel(
    packed_ptr, sz_ptr, w_ptr, N, K, K_OUTER, IKT2, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr
):
    # Dense W [N, K] from torch's CUDA int4 tile layout (see awq.cuda_int4pack_layout), CHUNKS runs of 32 k a
    # program (within one group). Each int32 is loaded once: lane t of row n in chunk c holds, for i = 0..3,
    # k = 32c + 8i + 2t (bits 4i) and that k + 1 (bits 16 + 4i); so [n, c, i, t, e] is already k's order.
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    c = tl.program_id(1) * CHUNKS + tl.arange(0, CHUNKS)
    t = tl.arange(0, 4)
    n_mask = n < N
    lane = (n % 8)[:, None, None] * 4 + t[None, None, :]
    word = (((n // 8)[:, None, None] * K_OUTER + (c // IKT2)[None, :, None]) * 32 + lane) * IKT2 + (c % IKT2)[
        None, :, None
    ]
    mask = n_mask[:, None, None] & (c < K // 32)[None, :, None]
    packed = tl.load(packed_ptr + word, mask=mask, other=0)  # [n, c, t]
    shift = (4 * tl.arange(0, 4))[:, None, None] + (16 * tl.arange(0, 2))[None, None, :]  # [i, 1, e]
    q = (packed[:, :, None, :, None] >> shift[None, None, :, :, :]) & 0xF  # [n, c, i, t, e]
    q = tl.reshape(q, (BLOCK_N, CHUNKS * 32))
    group = (tl.program_id(1) * CHUNKS * 32) // GROUP
    sz = sz_ptr + (group * N + n) * 2
    s = tl.load(sz, mask=n_mask, other=0.0).to(tl.float32)
    zero = tl.load(sz + 1, mask=n_mask, other=0.0).to(tl.float32)
    w = (q.to(tl.float32) - 8.0) * s[:, None] + zero[:, None]  # torch's int4 kernel: (q - 8) * scale + zero
    k = tl.program_id(1) * CHUNKS * 32 + tl.arange(0, CHUNKS * 32)
    out_mask = n_mask[:, None] & (k < K)[None, :]
    tl.store(w_ptr + n[:, None] * K + k[None, :], w.to(w_ptr.dtype.element_ty), mask=out_mask)


def dequantize_words(w: fmt.Int4Weight, out: torch.Tensor, block_n: int = 16) -> torch.Tensor:
    n, k = w.out_features, w.in_features
    dense = out.view(-1)[: n * k].view(n, k)
    chunks = min(4, w.group_size // 32)  # 32 k a chunk; a program's chunks lie in one group
    _int4pack_dequantize_words_kernel[(triton.cdiv(n, block_n), triton.cdiv(k, 32 * chunks))](
        w.packed, w.scales_and_zeros, dense, n, k, w.packed.shape[1], w.packed.shape[3],
        GROUP=w.group_size, BLOCK_N=block_n, CHUNKS=chunks, num_warps=4,
    )  # fmt: skip
    return dense


def weight(n: int, k: int, group: int, device) -> fmt.Int4Weight:
    q = torch.randint(0, 16, (k, n))
    z = torch.randint(0, 16, (k // group, n))
    s = (torch.rand(k // group, n) * 0.05 + 0.001).half()
    w_uint8, sz = fmt.int4pack_inputs(q, z, s)
    tiles = fmt.inner_k_tiles(k)
    if device == "cuda":
        return fmt.to_int4pack(q.cuda(), z.cuda(), s.cuda(), group)
    return fmt.Int4Weight(fmt.cuda_int4pack_layout(w_uint8, tiles), sz, group, n, k)


def gpu_us(fn, copies: list, calls: int = 5) -> float:
    for w in copies:
        fn(w)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        for w in copies:
            fn(w)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / (calls * len(copies))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="2048x1536,1536x1536,17920x1536,1536x8960", help="NxK, comma-separated")
    ap.add_argument("--group", type=int, default=128)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        w = weight(n, k, args.group, device)
        a = torch.empty(n * k, device=device, dtype=dtype)
        b = torch.empty(n * k, device=device, dtype=dtype)
        same = torch.equal(int4_triton.int4pack_dequantize(w, a), dequantize_words(w, b))
        line = f"{shape}: the same dense weight: {same}"
        if device == "cuda":
            l2 = torch.cuda.get_device_properties(0).L2_cache_size
            copies = [weight(n, k, args.group, device) for _ in range(max(2, 4 * l2 // (n * k // 2) + 1))]
            old = gpu_us(lambda w: int4_triton.int4pack_dequantize(w, a), copies)
            new = gpu_us(lambda w: dequantize_words(w, b), copies)
            line += f"; model_loader's {old:.1f} µs, one load a word {new:.1f} µs"
        print(line, flush=True)


if __name__ == "__main__":
    main()
