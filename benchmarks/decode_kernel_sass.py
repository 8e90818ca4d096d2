"""What registers, shared memory and instructions per K/V tile does the decode attention's split kernel take?

Answered on any machine, without a GPU: the kernel compiled for one, its machine code (SASS) summarised, for the
16-bit and the 8-bit cache side by side.

A kernel that one program per SM runs with few warps is bound by how many instructions each warp issues per
K/V tile (each scheduler has one or two warps to switch between), not by the cache read. This compiles the
split kernel (model_loader.kernels.jit_decode_attention) with Triton's own back end for the chosen architecture,
as a first start on that GPU would, disassembles the cubin with the cuobjdump Triton ships, and prints per
variant: registers and stack (spills), shared memory, all instructions, and the instructions of its main loop
(the largest backward branch: one K/V tile) by opcode. Nothing runs; nothing is timed.

    python -m benchmarks.decode_kernel_sass [--arch 90] [--block-n 128] [--warps 4,8] [--stages 3] [--dump DIR]
                                            [--source FILE]

--source compiles the kernel from another copy of jit_decode_attention.py (a variant of its source under study;
the helpers it shares with the prefill come from jit_common as it is). The installed Triton compiles; the kernels
modules import nothing but Triton, so another Triton in a bare virtual environment works too (`pip install
triton==3.6.0`, the H200's: its 16-bit shape asks for the 139,520 bytes of shared memory measured there).

The 1.5B's shapes (6 query heads per KV head padded to 16 rows, head dim 128), programmatic dependent launch
and the early first tile on (the Hopper candidates, decode_attention.DECODE_ATTN_CONFIGS), a bf16 model.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

_INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)")
_BRANCH = re.compile(r"BRA\s.*?0x([0-9a-f]+)")


def _tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def kernels_module(source: Path | None):
    """model_loader.kernels.jit_decode_attention, or the module in `source` (a modified copy of it)."""
    if source is None:
        from model_loader.kernels import jit_decode_attention

        return jit_decode_attention
    import importlib.util

    spec = importlib.util.spec_from_file_location("jit_decode_attention_variant", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compile_split_kernel(
    kernels,
    fp8: bool,
    arch: int,
    block_n: int,
    warps: int,
    stages: int,
    v_transposed: bool = False,
    whole_tiles: bool = False,
):
    """The split kernel of `kernels` (kernels_module) as a CompiledKernel for sm_<arch> (Triton's compiler, no
    GPU needed). v_transposed: over a transposed value cache (the 8-bit cache's: kv_cache.value_cache), whose
    splits start on 16 tokens (decode_attention.for_value_layout). whole_tiles: DecodeAttnConfig.whole_tiles (the depth
    shapes' whole-tile loop and exp2 softmax)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cache = "*fp8e4nv" if fp8 else "*bf16"
    signature = {
        "q_ptr": "*bf16",
        "k_ptr": cache,
        "v_ptr": cache,
        "pos_ptr": "*i32",
        "mid_o_ptr": "*fp32",
        "mid_lse_ptr": "*fp32",
        "max_ctx": "i32",
        "scale": "fp32",
        "k_scale_ptr": "*fp32",
        "v_scale_ptr": "*fp32",
        "v_rows": "i32",
    }
    constexprs = dict(
        GROUP=6,
        BLOCK_G=16,
        D=128,
        BLOCK_N=block_n,
        MAX_SPLITS=66,
        MIN_CHUNK=128,
        CHUNK_ALIGN=16 if v_transposed else 1,
        PDL=arch >= 90,
        IEEE=False,
        LATE_LAUNCH=False,
        EARLY_TILE=arch >= 90,
        KV_FP8=fp8,
        V_T=v_transposed,
        WHOLE_TILES=whole_tiles,
    )
    signature.update({name: "constexpr" for name in constexprs})
    # as a launch specializes them: pointers and the context length (and row length) divisible by 16
    aligned = [i for i, name in enumerate(signature) if name.endswith("_ptr") or name in ("max_ctx", "v_rows")]
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    return triton.compile(
        ASTSource(kernels._decode_attn_split_kernel, signature, constexprs, attrs),
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": warps, "num_stages": stages},
    )


def disassemble(cubin: bytes, *flags: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([_tool("cuobjdump"), *flags, f.name], capture_output=True, text=True, check=True).stdout


def summary(sass: str) -> tuple[int, collections.Counter]:
    """(all instructions, the main loop's opcodes): the loop is the largest span closed by a backward branch."""
    lines = [
        (int(m.group(1), 16), m.group(2), line) for line in sass.splitlines() for m in [_INSTRUCTION.match(line)] if m
    ]
    index = {addr: i for i, (addr, _, _) in enumerate(lines)}
    loop: list = []
    for i, (addr, op, line) in enumerate(lines):
        branch = _BRANCH.search(line) if op == "BRA" else None
        target = int(branch.group(1), 16) if branch else None
        if target is not None and target < addr and target in index and i + 1 - index[target] > len(loop):
            loop = lines[index[target] : i + 1]
    return len(lines), collections.Counter(op for _, op, _ in loop)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100/H200, 89: RTX 40)")
    ap.add_argument("--block-n", type=int, default=128, help="tokens per K/V tile")
    ap.add_argument("--warps", default="4,8", help="comma-separated warp counts")
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument(
        "--whole-tiles",
        default="0,1",
        help="DecodeAttnConfig.whole_tiles off (0), on (1) or both: the depth shapes' loop",
    )
    ap.add_argument("--top", type=int, default=14, help="opcodes shown per loop")
    ap.add_argument("--dump", type=Path, help="also write each variant's SASS into this folder")
    ap.add_argument(
        "--source", type=Path, help="a modified copy of model_loader/kernels/jit_decode_attention.py to compile"
    )
    ap.add_argument(
        "--layouts",
        default="rows,transposed",
        help="the 8-bit cache's value layouts: rows (row-major), transposed (the model's) or both",
    )
    args = ap.parse_args()
    kernels = kernels_module(args.source)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, said aloud (no warning)
    layouts = [layout == "transposed" for layout in args.layouts.split(",")]
    variants = [
        (warps, fp8, v_t, whole)
        for warps in (int(w) for w in args.warps.split(","))
        for fp8, v_t in [(False, False)] + [(True, v_t) for v_t in layouts]
        for whole in (w == "1" for w in args.whole_tiles.split(","))
    ]
    for warps, fp8, v_t, whole in variants:
        name = (
            f"{'8-bit' if fp8 else '16-bit'} cache{', V transposed' if v_t else ''}, {args.block_n}-token "
            f"tiles, {warps} warps, {args.stages} stages{', whole tiles' if whole else ''}, sm_{args.arch}"
        )
        compiled = compile_split_kernel(kernels, fp8, args.arch, args.block_n, warps, args.stages, v_t, whole)
        cubin = compiled.asm["cubin"]
        sass = disassemble(cubin, "-sass")
        usage = re.search(r"REG:(\d+) STACK:(\d+)", disassemble(cubin, "-res-usage"))
        total, loop = summary(sass)
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            (args.dump / (re.sub(r"[^a-z0-9]+", "_", name.lower()) + ".sass")).write_text(sass)
        print(
            f"{name}: {usage.group(1)} registers, {usage.group(2)} bytes of stack, "
            f"{compiled.metadata.shared:,} bytes of shared memory; {total:,} instructions, "
            f"{sum(loop.values()):,} in the loop (a warp's share of one tile)"
        )
        print("    loop: " + ", ".join(f"{op} {n}" for op, n in loop.most_common(args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
