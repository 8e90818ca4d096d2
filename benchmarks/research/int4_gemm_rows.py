"""Can a 4-bit GEMM that dequantises in registers beat a dense copy of W and cuBLAS for the scheduler's decode
batches (2 to 32 rows), with the weights streamed from DRAM as in a real step (a research tool)?

The AWQ model decodes several sequences with int4_triton.int4_dequantize + cuBLAS per linear: ~6 GB of traffic a
step for ~1 GB of int4 weights, so 8 sequences reach only ~3x one sequence's rate (docs/BENCHMARKS.md, "Many
sequences at once"). The kernel here reads each int4 weight once for all rows: a program owns BLOCK_N output rows
over some packed blocks (K split until the programs cover the GPU), dequantises a run of 16 inputs at a time in
registers and multiplies every row by it on the tensor cores (tl.dot with K = 16), fp32 partial sums then one
reduction. With weights resident in L2 it beat the dense path at every row count; inside the decode graphs it
did not (docs/BENCHMARKS.md, "Many sequences at once"): it is latency-bound once the weights come from DRAM.
A second kernel dequantises whole blocks into one [BLOCK_N, 128 or 256] tile and multiplies it in one dot (not
eight of K = 16), its block loop pipelined. This sweeps its tile, blocks a dot, split, warps and stages over the
1.5B's four linears (the three fastest again with their splits summed by the last split instead of a second
kernel, and launched with PDL), each checked against the dense path's numbers before it is timed, with the first
kernel as it was, the weights rotated over enough copies to miss L2, against the dense path likewise rotated,
torch's int4 kernel (tinygemm, made for a few rows; it would need its own copy of the weights in its layout), and
the dense path a few MiB of rows at a time (its bf16 copy read back from L2, for more launches).

    python -m benchmarks.research.int4_gemm_rows [--rows 8,32] [--json BEST.json] [--compilers 12]
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from model_loader import awq as fmt
from model_loader.kernels import int4_triton
from model_loader.kernels.jit_int4 import MAGIC

# the wide kernel's compiled variants swept (BLOCK_N, blocks a dot, warps, stages): each is a compile per row
# bucket and shape kind, so few enough for the sweep to finish in a couple of minutes
WIDE_TILES = [(64, kb, 4, st) for kb in (1, 2) for st in (2, 3)] + [
    (128, kb, w, st) for kb in (1, 2) for w in (4, 8) for st in (2, 3)
]

SHAPES = {
    "qkv": (2048, 1536, False),
    "o": (1536, 1536, False),
    "gate_up": (17920, 1536, True),
    "down": (1536, 8960, False),
}


@triton.jit
def _int4_gemm_kernel(
    x_ptr,
    qw_ptr,
    s_ptr,
    z_ptr,
    out_ptr,
    part_ptr,
    count_ptr,
    M,
    N,
    KP,
    GROUPS,
    NUM_BLOCKS,
    BLOCKS_PER_SPLIT,
    GROUP: tl.constexpr,
    IB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GATE_UP_PAIRS: tl.constexpr,
    IEEE: tl.constexpr,
    PDL: tl.constexpr,
):
    # A few rows of activations (a batch of decoding sequences) times W: program (c, sp) owns stored rows
    # c*BLOCK_N.. over packed blocks sp*BLOCKS_PER_SPLIT.., each weight read once for all BLOCK_M rows. A block's
    # IB ints per row hold 8 runs of IB inputs (nibble j: inputs 8*IB*b + j*IB ..), each dequantised in
    # registers (2**23 + q, as the dequantiser) into the activations' dtype and multiplied by its run of x on
    # the tensor cores. Unsplit, into out [M, N]; split, split sp's fp32 partial sums into part [splits, M, N]
    # (summed by _int4_gemm_reduce_kernel; count_ptr unused). GATE_UP_PAIRS: stored rows (gate i, up i) go to
    # columns i and N/2 + i, the dense [gate; up] order the callers expect of several rows.
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    m = tl.arange(0, BLOCK_M)
    m_mask = m < M
    i = tl.arange(0, IB)
    k = KP * 8
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    first = tl.program_id(1) * BLOCKS_PER_SPLIT
    last = tl.minimum(first + BLOCKS_PER_SPLIT, NUM_BLOCKS)
    for b in range(first, last):
        packed = tl.load(qw_ptr + rows[:, None] * KP + (b * IB + i)[None, :], mask=row_mask[:, None], other=0)
        g = (b * 8 * IB) // GROUP  # a block lies inside one group
        s = tl.load(s_ptr + rows * GROUPS + g, mask=row_mask, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + rows * GROUPS + g, mask=row_mask, other=0.0).to(tl.float32)
        for j in tl.static_range(8):
            q = (((packed >> (4 * j)) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True)
            w = ((q - (z + MAGIC)[:, None]) * s[:, None]).to(x_ptr.dtype.element_ty)  # [BLOCK_N, IB]
            x = tl.load(x_ptr + m[:, None] * k + (b * 8 * IB + j * IB + i)[None, :], mask=m_mask[:, None], other=0.0)
            if IEEE:
                acc += tl.dot(x, tl.trans(w), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(w))
    if GATE_UP_PAIRS:
        cols = rows // 2 + (rows % 2) * (N // 2)
    else:
        cols = rows
    mask = m_mask[:, None] & row_mask[None, :]
    if tl.num_programs(1) == 1:
        tl.store(out_ptr + m[:, None] * N + cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(part_ptr + (tl.program_id(1) * M + m[:, None]) * N + cols[None, :], acc, mask=mask)


@triton.jit
def _int4_gemm_reduce_kernel(part_ptr, out_ptr, MN, SPLITS, BLOCK: tl.constexpr, PDL: tl.constexpr):
    # out = the splits' fp32 partial sums added in split order (the same sum every run), in out's dtype.
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    total = tl.zeros([BLOCK], tl.float32)
    for sp in range(SPLITS):
        total += tl.load(part_ptr + sp * MN + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _int4_gemm_wide_kernel(
    x_ptr,
    qw_ptr,
    s_ptr,
    z_ptr,
    out_ptr,
    part_ptr,
    count_ptr,
    M,
    N,
    KP,
    GROUPS,
    NUM_BLOCKS,
    BLOCKS_PER_SPLIT,
    GROUP: tl.constexpr,
    IB: tl.constexpr,
    KB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GATE_UP_PAIRS: tl.constexpr,
    STAGES: tl.constexpr,
    LAST_SUMS: tl.constexpr,
    PDL: tl.constexpr,
):
    # As _int4_gemm_kernel, but KB whole packed blocks (KB * 8 * IB inputs) at a time and one tensor-core dot over
    # them: nibble j of int i of block b is input b*8*IB + j*IB + i, so the [BLOCK_N, KB, 8, IB] dequantised
    # tile reshaped to [BLOCK_N, KB*8*IB] lines up with a contiguous run of x. The loop over blocks is pipelined
    # (STAGES), so the next tiles' loads are in flight while this one is multiplied. Split along K: fp32 partial
    # sums in part_ptr, added up by _int4_gemm_reduce_kernel, or (LAST_SUMS) by the last split of a tile to
    # arrive (an atomic count in count_ptr, reset after), in split order, as the int4 GEMV does: no second
    # launch. PDL: launched early behind the kernel before, waiting for it before any load.
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    m = tl.arange(0, BLOCK_M)
    m_mask = m < M
    i = tl.arange(0, IB)
    j = tl.arange(0, 8)
    kb = tl.arange(0, KB)
    k = KP * 8
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    first = tl.program_id(1) * BLOCKS_PER_SPLIT
    last = tl.minimum(first + BLOCKS_PER_SPLIT, NUM_BLOCKS)
    for b in tl.range(first, last, KB, num_stages=STAGES):
        blk = b + kb
        live = row_mask[:, None] & (blk < last)[None, :]  # [BLOCK_N, KB]
        packed = tl.load(
            qw_ptr + rows[:, None, None] * KP + (blk * IB)[None, :, None] + i[None, None, :],
            mask=live[:, :, None],
            other=0,
        )
        g = (blk * 8 * IB) // GROUP  # a block lies inside one group
        s = tl.load(s_ptr + rows[:, None] * GROUPS + g[None, :], mask=live, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + rows[:, None] * GROUPS + g[None, :], mask=live, other=0.0).to(tl.float32)
        q = (((packed[:, :, None, :] >> (4 * j)[None, None, :, None]) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True)
        w = ((q - (z + MAGIC)[:, :, None, None]) * s[:, :, None, None]).to(x_ptr.dtype.element_ty)
        w = tl.reshape(w, (BLOCK_N, KB * 8 * IB))
        cols = b * 8 * IB + tl.arange(0, KB * 8 * IB)
        x = tl.load(
            x_ptr + m[:, None] * k + cols[None, :], mask=m_mask[:, None] & (cols < last * 8 * IB)[None, :], other=0.0
        )
        acc += tl.dot(x, tl.trans(w))
    if GATE_UP_PAIRS:
        out_cols = rows // 2 + (rows % 2) * (N // 2)
    else:
        out_cols = rows
    mask = m_mask[:, None] & row_mask[None, :]
    splits = tl.num_programs(1)
    if splits == 1:
        tl.store(out_ptr + m[:, None] * N + out_cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(part_ptr + (tl.program_id(1) * M + m[:, None]) * N + out_cols[None, :], acc, mask=mask)
        if LAST_SUMS:
            tl.debug_barrier()  # every thread's partials are written before the arrival is counted
            arrived = tl.atomic_add(count_ptr + tl.program_id(0), 1, sem="acq_rel")
            if arrived == splits - 1:
                total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                for c in range(0, splits):
                    total += tl.load(
                        part_ptr + (c * M + m[:, None]) * N + out_cols[None, :],
                        mask=mask,
                        other=0.0,
                        cache_modifier=".cg",
                    )
                tl.store(out_ptr + m[:, None] * N + out_cols[None, :], total.to(out_ptr.dtype.element_ty), mask=mask)
                tl.atomic_xchg(count_ptr + tl.program_id(0), 0)


_COUNTS: dict = {}  # device -> the split arrival counts (int32 zeros; each tile's count is reset by its last split)


def arrival_counts(device) -> torch.Tensor:
    """The shared arrival counts, made on first use (call once before capturing a graph that launches a GEMM):
    kernels in a row may share them, since each waits for the one before (PDL) and leaves its counts at zero."""
    if device not in _COUNTS:
        _COUNTS[device] = torch.zeros(4096, dtype=torch.int32, device=device)
    return _COUNTS[device]


def _launch(
    kernel, x, w, block_n: int, programs_per_sm: int, kb: int, warps: int, stages: int, last_sums=False, **meta
):
    """x @ W.T through one of the kernels above: K split until about programs_per_sm programs an SM (in whole
    groups of kb blocks), fp32 partials summed by _int4_gemm_reduce_kernel where it is split, or by the
    kernel's last split (last_sums, the wide kernel's LAST_SUMS)."""
    n, k = w.shape
    rows = x.shape[0]
    blocks = k // (8 * w.interleave)
    tiles = triton.cdiv(n, block_n)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.device.type == "cuda" else 8
    per_split = triton.cdiv(blocks, min(blocks, max(1, triton.cdiv(programs_per_sm * sms, tiles))))
    per_split = triton.cdiv(per_split, kb) * kb
    splits = triton.cdiv(blocks, per_split)
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    partials = torch.empty((splits, rows, n), dtype=torch.float32, device=x.device) if splits > 1 else out
    counts = arrival_counts(x.device)
    assert tiles <= counts.numel()
    kernel[(tiles, splits)](
        x,
        w.qweight,
        w.scales,
        w.zeros,
        out,
        partials,
        counts,
        rows,
        n,
        k // 8,
        w.scales.shape[1],
        blocks,
        per_split,
        GROUP=w.group_size,
        IB=w.interleave,
        BLOCK_M=max(16, triton.next_power_of_2(rows)),
        BLOCK_N=block_n,
        GATE_UP_PAIRS=w.gate_up_pairs,
        num_warps=warps,
        **meta,
    )
    if splits > 1 and not last_sums:
        _int4_gemm_reduce_kernel[(triton.cdiv(rows * n, 1024),)](partials, out, rows * n, splits, BLOCK=1024, PDL=False)
    return out


def int4_gemm_wide(
    x,
    w,
    block_n: int = 64,
    kb: int = 1,
    programs_per_sm: int = 2,
    warps: int = 4,
    stages: int = 3,
    last_sums: bool = False,
    pdl: bool = False,
):
    """The wide kernel; last_sums: the last split adds the partials up (no reduction kernel); pdl: launched with
    programmatic dependent launch (sm_90+)."""
    return _launch(
        _int4_gemm_wide_kernel,
        x,
        w,
        block_n,
        programs_per_sm,
        kb,
        warps,
        stages,
        last_sums=last_sums,
        KB=kb,
        STAGES=stages,
        LAST_SUMS=last_sums,
        PDL=pdl,
        **({"launch_pdl": True} if pdl else {}),
    )


def int4_gemm(x, w, block_n: int = 64, programs_per_sm: int = 2, warps: int = 4, stages: int = 3):
    return _launch(
        _int4_gemm_kernel, x, w, block_n, programs_per_sm, 1, warps, stages, IEEE=False, PDL=False, num_stages=stages
    )


def dense_in_chunks(x, w, scratch, out_t, chunk_rows: int):
    """The dense path a slice of W's rows at a time, so the bf16 copy cuBLAS reads back is still in L2: each
    chunk's [rows, K] dequantised then multiplied into out_t [N, M] (row order as stored; timing only)."""
    for c0 in range(0, w.out_features, chunk_rows):
        c1 = min(c0 + chunk_rows, w.out_features)
        part = fmt.RowPackedInt4(w.qweight[c0:c1], w.scales[c0:c1], w.zeros[c0:c1], w.group_size, w.interleave)
        torch.mm(int4_triton.int4_dequantize(part, scratch), x.t(), out=out_t[c0:c1])
    return out_t.t().contiguous()


def rotated_us(fn, copies: int, replays: int = 20) -> float:
    """GPU microseconds a call of fn(i) for i over the copies, inside one CUDA graph (no launch gaps)."""
    for i in range(copies):
        fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(copies):
            fn(i)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / (copies * replays)


def packed_weight(n: int, k: int, paired: bool, dev) -> tuple:
    """A random RowPackedInt4 [n, k] (group 128) on dev, and its ints, zeros and scales."""
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (k, n), generator=g).to(dev)
    z = torch.randint(0, 16, (k // 128, n), generator=g).to(dev)
    s = (torch.rand(k // 128, n, generator=g) * 0.05 + 0.001).half().to(dev)
    base = fmt.to_row_packed(q, z, s, 128)
    return (fmt.pair_gate_up(base) if paired else base), q, z, s


def compile_part(rows_list: list[int], part: int, parts: int) -> None:
    """Launch this part's share of the sweep's wide variants once (plain, and with their sums in the kernel and
    PDL), so Triton compiles them into its cache for the timing process."""
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: a dry run under TRITON_INTERPRET=1
    pdl = dev.type == "cuda" and torch.cuda.get_device_capability(dev) >= (9, 0)
    weights: dict = {}
    jobs = itertools.product(SHAPES.values(), rows_list, WIDE_TILES, (1, 2, 4), (False, True))
    for j, ((n, k, paired), rows, (block_n, kb, warps, stages), pps, plus) in enumerate(jobs):
        if j % parts == part:
            if (n, k, paired) not in weights:
                weights[(n, k, paired)] = packed_weight(n, k, paired, dev)[0]
            w = weights[(n, k, paired)]
            x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
            try:
                int4_gemm_wide(x, w, block_n, kb, pps, warps, stages, last_sums=plus, pdl=plus and pdl)
            except Exception:  # a tile this GPU can't run: the sweep skips it too
                pass
    if dev.type == "cuda":
        torch.cuda.synchronize()


def compile_first(rows: str, processes: int) -> None:
    """The wide variants compiled in `processes` processes at once (Triton compiles one kernel at a time in a
    process; the sweep's ~150 variants would take minutes), sharing Triton's file cache with this one."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "benchmarks.research.int4_gemm_rows", "--rows", rows]
    procs = [subprocess.Popen([*cmd, "--compile-part", f"{i}/{processes}"]) for i in range(processes)]
    try:
        for proc in procs:
            proc.wait(timeout=120)
    except subprocess.TimeoutExpired:  # what is left compiles in the sweep itself
        pass
    finally:
        for proc in procs:
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="8,32")
    ap.add_argument("--json", help="the best wide configuration per rows and shape (for int4_gemm_in_step)")
    ap.add_argument("--compilers", type=int, default=0, help="compile the wide variants first in this many processes")
    ap.add_argument("--compile-part", help=argparse.SUPPRESS)  # "I/N": one of those processes
    args = ap.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    if args.compile_part:
        return compile_part(rows_list, *map(int, args.compile_part.split("/")))
    if args.compilers:
        compile_first(args.rows, args.compilers)
    report: dict = {}
    dev = torch.device("cuda")
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 64 << 20)
    print(f"{torch.cuda.get_device_name()}: GPU us a call, weights streamed (copies past 4x L2)")
    for name, (n, k, paired) in SHAPES.items():
        base, q, z, s = packed_weight(n, k, paired, dev)
        copies = max(2, -(-4 * l2 // base.nbytes()))
        ws = [
            fmt.RowPackedInt4(base.qweight.clone(), base.scales.clone(), base.zeros.clone(), 128, 16, paired)
            for _ in range(copies)
        ]
        scratch = torch.empty(n * k, device=dev, dtype=torch.bfloat16)
        # torch's int4 kernel (tinygemm, made for a few rows) on the same numbers in its own layout
        packs = [fmt.to_int4pack(q, z, s, 128) for _ in range(copies)]
        for rows in rows_list:
            x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
            dense = rotated_us(lambda i: F.linear(x, int4_triton.int4_dequantize(ws[i], scratch)), copies)
            ref = F.linear(x, int4_triton.int4_dequantize(ws[0], scratch)).float()
            wrong: list[str] = []

            def checked_us(fn, what: str):
                """fn's time, or None (noted in `wrong`) where its output isn't the dense path's to rounding."""
                err = ((fn(0).float() - ref).abs().max() / ref.abs().max()).item()
                if not err <= 2e-2:
                    wrong.append(f"{what}: relative error {err:.2g}")
                    return None
                return rotated_us(fn, copies)

            results = [
                (checked_us(lambda i: int4_gemm(x, ws[i]), "per-run"), "per-run dots, BLOCK_N 64, 2/SM"),
                (checked_us(lambda i: fmt.int4_linear(x, packs[i]), "tinygemm"), "torch's int4 kernel"),
            ]
            wide: list[dict] = []
            out_t = torch.empty(n, rows, device=dev, dtype=torch.bfloat16)
            for mib in (4, 8, 16):
                chunk = max(16, (mib << 20) // (2 * k) // 16 * 16)
                if chunk < n:  # (rows in stored order: not checked against the dense path's order)
                    us = rotated_us(lambda i: dense_in_chunks(x, ws[i], scratch, out_t, chunk), copies)
                    results.append((us, f"dense in {mib} MiB chunks"))
            for (block_n, kb, warps, stages), pps in itertools.product(WIDE_TILES, (1, 2, 4)):
                config = [block_n, kb, pps, warps, stages]
                try:
                    us = checked_us(lambda i: int4_gemm_wide(x, ws[i], *config), f"wide {config}")
                except Exception:  # a tile that doesn't fit this GPU's shared memory or registers
                    continue
                if us is not None:
                    results.append(
                        (us, f"wide, BLOCK_N {block_n}, {kb} block(s) a dot, {pps}/SM, {warps} warps, {stages} stages")
                    )
                    wide.append({"us": us, "config": config, "last_sums": False, "pdl": False})
            # the three fastest again, their splits summed in the kernel, and launched with PDL where it exists
            pdl = torch.cuda.get_device_capability(dev) >= (9, 0)
            for plain in sorted(wide, key=lambda r: r["us"])[:3]:
                us = checked_us(
                    lambda i: int4_gemm_wide(x, ws[i], *plain["config"], last_sums=True, pdl=pdl), f"{plain} + sums"
                )
                if us is not None:
                    results.append((us, f"wide {plain['config']}, sums in the kernel, PDL {pdl}"))
                    wide.append({**plain, "us": us, "last_sums": True, "pdl": pdl})
            results = [r for r in results if r[0] is not None]
            if wrong:
                print(f"{name:8} {rows} rows: NOT the dense path's numbers: {'; '.join(wrong)}", flush=True)
            results.sort()
            best = "; ".join(f"{us:.1f} us ({what})" for us, what in results[:3])
            others = ", ".join(f"{what} {us:.1f}" for us, what in results[3:] if not what.startswith("wide"))
            print(
                f"{name:8} {n}x{k}, {rows} rows: dense copy + cuBLAS {dense:.1f} us; best: {best}; also: {others}",
                flush=True,
            )
            if wide:
                top = min(wide, key=lambda r: r["us"])
                report.setdefault(str(rows), {})[f"{n}x{k}"] = {"dense_us": dense, "wide_us": top["us"], **top}
                if args.json:  # after every shape: a run cut short by its time limit keeps what it measured
                    Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
