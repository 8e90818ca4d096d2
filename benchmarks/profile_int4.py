"""Per-shape timing of the 4-bit kernels on a CUDA GPU (a development tool, not part of the app).

For each linear shape of DeepSeek-R1-Distill-Qwen-1.5B, over 28 random weights (one per layer, so reads come
from HBM as when decoding): single-token time of bf16 cuBLAS, our dense GEMV, torch's int4 kernel and each of
our int4 GEMV configs; 512-row (prefill) time of bf16 cuBLAS, torch's int4 kernel and our dequantise + cuBLAS.
Also checks our kernels against the dequantised weight in bf16. Prints one JSON object.
usage: python benchmarks/profile_int4.py [GROUP_SIZE]
"""

import json
import sys

import torch
import torch.nn.functional as F

from model_loader import awq as fmt
from model_loader.kernels import int4_triton, triton_ops

SHAPES = {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960)}
LAYERS = 28


def main(group: int) -> None:
    dev = torch.device("cuda")
    report = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "group_size": group}
    for name, (n, k) in SHAPES.items():
        g = torch.Generator(device=dev).manual_seed(0)
        raw = [(torch.randint(0, 16, (k, n), device=dev, generator=g),
                torch.randint(0, 16, (k // group, n), device=dev, generator=g),
                (torch.rand(k // group, n, device=dev, generator=g) * 0.02).half()) for _ in range(LAYERS)]
        rows = [fmt.to_row_packed(q, z, s, group) for q, z, s in raw]
        packs = [fmt.to_int4pack(q, z, s, group) for q, z, s in raw]
        dense = [fmt.dequantize_row_packed(w).to(torch.bfloat16) for w in rows[:4]] * (LAYERS // 4)
        del raw
        x1 = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        x512 = torch.randn(512, k, device=dev, dtype=torch.bfloat16)
        scratch = torch.empty(n * k, device=dev, dtype=torch.bfloat16)

        def t(fn, ws):
            return round(triton_ops._graph_time_us(lambda: [fn(w) for w in ws], len(ws)), 2)

        entry = {
            "decode_bf16_cublas_us": t(lambda w: F.linear(x1, w), dense),
            "decode_torch_int4_us": t(lambda w: fmt.int4_linear(x1, w), packs),
            "decode_triton_int4_us": {str(c): t(lambda w, c=c: int4_triton.int4_gemv(x1, w, c), rows)
                                      for c in int4_triton.INT4_GEMV_CONFIGS},
            "prefill512_bf16_cublas_us": t(lambda w: F.linear(x512, w), dense),
            "prefill512_torch_int4_us": t(lambda w: fmt.int4_linear(x512, w), packs),
            "prefill512_dequant_cublas_us": t(lambda w: F.linear(x512, int4_triton.int4_dequantize(w, scratch)),
                                              rows),
            "dequantize_only_us": t(lambda w: int4_triton.int4_dequantize(w, scratch), rows),
        }
        for c in triton_ops.GEMV_CONFIGS:
            entry[f"decode_bf16_triton_gemv_{c}_us"] = t(lambda w, c=c: triton_ops.gemv(x1, w, c), dense)
        best = min(entry["decode_triton_int4_us"], key=entry["decode_triton_int4_us"].get)
        entry["decode_triton_int4_best"] = [best, entry["decode_triton_int4_us"][best]]
        ref = x1.float() @ fmt.dequantize_row_packed(rows[0]).t()
        entry["gemv_max_abs_err"] = max((int4_triton.int4_gemv(x1, rows[0], c).float() - ref).abs().max().item()
                                        for c in int4_triton.INT4_GEMV_CONFIGS)
        entry["torch_int4_max_abs_err"] = (fmt.int4_linear(x1, packs[0]).float() - ref).abs().max().item()
        entry["ref_max_abs"] = ref.abs().max().item()
        d = int4_triton.int4_dequantize(rows[0], scratch)
        entry["dequant_exact"] = bool(torch.equal(d, fmt.dequantize_row_packed(rows[0]).to(torch.bfloat16)))
        entry["bytes_int4_mb"] = rows[0].nbytes() / 1e6
        report[name] = entry
        del rows, packs, dense, scratch
        torch.cuda.empty_cache()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 128)
