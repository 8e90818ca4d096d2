"""How fast is each 4-bit kernel per linear shape, against bf16 cuBLAS and torch's int4 kernel (CUDA GPU)?

A development tool, not part of the app.

For each linear shape of DeepSeek-R1-Distill-Qwen-1.5B, over 28 random weights (one per layer, so reads come
from HBM as when decoding): single-token time of bf16 cuBLAS, torch's int4 kernel and each of our int4 GEMV
configs (gate/up also with its rows in pairs and its SiLU(gate) * up output, as the decoder calls it); 512-row (prefill)
time of bf16 cuBLAS, torch's int4 kernel and our dequantise + cuBLAS. Also checks our kernels against the
dequantised weight. Prints one JSON object.
usage: python -m benchmarks.profile_int4 [--group 128] [--sweep] [--precompile PROCESSES] [--shapes 1.5b,7b]
  --sweep       time a wide grid of GEMV configs instead of the autotuner's list (to choose that list)
  --precompile  compile every config first in that many processes (Triton caches them on disk)
  --shapes      which models' linear shapes (keys of MODEL_SHAPES; the report has one entry per model)
"""

import argparse
import itertools
import json
import multiprocessing

import torch
import torch.nn.functional as F

from model_loader import awq as fmt
from model_loader.kernels import gemv, int4_triton, small_ops

MODEL_SHAPES = {  # (N, K) of each linear: DeepSeek-R1-Distill-Qwen-1.5B, and -7B
    "1.5b": {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960)},
    "7b": {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584), "down": (3584, 18944)},
}
_SHAPES = MODEL_SHAPES["1.5b"]  # the shapes main() and _compile() measure
LAYERS = 28


def sweep_configs() -> list:
    """(BLOCK_N, NB, warps, CHUNKS): rows per program, packed blocks per tile (K splits follow), warps, tiles
    per program."""
    grid = [
        (bn, nb, warps, 1)
        for bn, nb, warps in itertools.product((32, 64, 128, 256), (1, 2, 4, 8), (2, 4, 8))
        if bn * nb * 4 >= 32 * warps
    ] + [(16, 2, 1, 1), (16, 4, 2, 1), (32, 1, 1, 1), (32, 2, 1, 1)]
    return grid + [
        (bn, nb, warps, chunks)
        for bn, nb, warps, chunks in itertools.product((32, 64, 128), (2, 4), (2, 4, 8), (2, 3, 4))
        if bn * nb * 4 >= 32 * warps
    ]


def _random_weights(n: int, k: int, group: int, count: int, dev) -> tuple[list, list]:
    g = torch.Generator(device=dev).manual_seed(0)
    raw = [
        (
            torch.randint(0, 16, (k, n), device=dev, generator=g),
            torch.randint(0, 16, (k // group, n), device=dev, generator=g),
            (torch.rand(k // group, n, device=dev, generator=g) * 0.02).half(),
        )
        for _ in range(count)
    ]
    return [fmt.to_row_packed(q, z, s, group) for q, z, s in raw], raw


def _compile(job) -> int:
    configs, group = job
    dev = torch.device("cuda")
    for name, (n, k) in _SHAPES.items():
        plain = _random_weights(n, k, group, 1, dev)[0][0]
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        for config in configs:
            for w in (plain, fmt.pair_gate_up(plain)) if name == "gate_up" else (plain,):
                try:
                    int4_triton.int4_gemv(x, w, config, silu_output=w.gate_up_pairs)
                except Exception:  # left to the timing run, which skips configs that can't run
                    pass
    torch.cuda.synchronize()
    return len(configs)


def precompile(configs: list, group: int, processes: int) -> None:
    jobs = [(configs[i::processes], group) for i in range(processes)]
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        pool.map(_compile, jobs)


def main(group: int, configs: list) -> dict:
    dev = torch.device("cuda")
    report = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "group_size": group}
    for name, (n, k) in _SHAPES.items():
        rows, raw = _random_weights(n, k, group, LAYERS, dev)
        packs = [fmt.to_int4pack(q, z, s, group) for q, z, s in raw]
        dense = [fmt.dequantize_row_packed(w).to(torch.bfloat16) for w in rows[:4]] * (LAYERS // 4)
        del raw
        x1 = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        x512 = torch.randn(512, k, device=dev, dtype=torch.bfloat16)
        scratch = torch.empty(n * k, device=dev, dtype=torch.bfloat16)

        def t(fn, ws):
            return round(gemv._graph_time_us(lambda: [fn(w) for w in ws], len(ws)), 2)

        def timed(ws: list) -> dict:
            results = gemv.time_configs(ws, configs, lambda w, c: int4_triton.int4_gemv(x1, w, c, w.gate_up_pairs))
            return {str(c): round(us, 2) for c, us in sorted(results.items(), key=lambda item: item[1])}

        entry = {
            "decode_bf16_cublas_us": t(lambda w: F.linear(x1, w), dense),
            "decode_torch_int4_us": t(lambda w: fmt.int4_linear(x1, w), packs),
            "decode_triton_int4_us": timed(rows),
            "prefill512_bf16_cublas_us": t(lambda w: F.linear(x512, w), dense),
            "prefill512_torch_int4_us": t(lambda w: fmt.int4_linear(x512, w), packs),
            "prefill512_dequant_cublas_us": t(
                lambda w, s=scratch: F.linear(x512, int4_triton.int4_dequantize(w, s)), rows
            ),
            "prefill512_int4pack_dequant_cublas_us": t(
                lambda w, s=scratch: F.linear(x512, int4_triton.int4pack_dequantize(w, s)), packs
            ),
        }
        if name == "gate_up":
            gate_up = torch.randn(1, n, device=dev, dtype=torch.bfloat16)
            entry["decode_silu_mul_kernel_us"] = t(lambda w: small_ops.silu_mul(gate_up), rows)
            entry["decode_triton_int4_silu_output_us"] = timed([fmt.pair_gate_up(w) for w in rows])
        ref = x1.float() @ fmt.dequantize_row_packed(rows[0]).t()
        entry["gemv_max_abs_err"] = max(
            (int4_triton.int4_gemv(x1, rows[0], c).float() - ref).abs().max().item() for c in configs
        )
        entry["torch_int4_max_abs_err"] = (fmt.int4_linear(x1, packs[0]).float() - ref).abs().max().item()
        entry["ref_max_abs"] = ref.abs().max().item()
        d = int4_triton.int4_dequantize(rows[0], scratch)
        entry["dequant_exact"] = bool(torch.equal(d, fmt.dequantize_row_packed(rows[0]).to(torch.bfloat16)))
        entry["int4pack_dequant_matches"] = int4_triton.int4pack_dequantize_matches(packs[0], scratch, fmt.int4_linear)
        entry["bytes_int4_mb"] = rows[0].nbytes() / 1e6
        report[name] = entry
        del rows, packs, dense, scratch
        torch.cuda.empty_cache()
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--group", type=int, default=128)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--precompile", type=int, default=0)
    parser.add_argument("--shapes", default="1.5b")
    args = parser.parse_args()
    chosen = sweep_configs() if args.sweep else list(int4_triton.INT4_GEMV_CONFIGS)
    reports = {}
    for model in args.shapes.split(","):
        _SHAPES = MODEL_SHAPES[model]  # read by _compile (the precompile processes re-import: 1.5b there)
        if args.precompile and model == "1.5b":
            precompile(chosen, args.group, args.precompile)
        reports[model] = main(args.group, chosen)
    print(json.dumps(reports if len(reports) > 1 else reports.popitem()[1], indent=1))
