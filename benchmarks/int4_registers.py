"""Does capping registers (more resident warps per SM) speed up the int4 GEMV? A development tool, CUDA only.

For the gate/up (with its SiLU(gate) * up output), down and QKV shapes of the 1.5B, over 28 random weights in a
CUDA graph: µs per call of every autotuner config with no cap and with maxnreg 96 / 80 / 64, after checking the
capped kernel gives the same bits. Prints one JSON object, fastest first per shape.
usage: python benchmarks/int4_registers.py
"""

import json

import torch

from model_loader import awq as fmt
from model_loader.kernels import int4_triton, triton_ops

SHAPES = {"gate_up": ((17920, 1536), True), "down": ((1536, 8960), False), "qkv": ((2048, 1536), False)}


def main() -> None:
    dev = torch.device("cuda")
    report = {}
    for name, ((n, k), silu) in SHAPES.items():
        g = torch.Generator(device=dev).manual_seed(0)
        ws = []
        for _ in range(28):
            w = fmt.to_row_packed(torch.randint(0, 16, (k, n), device=dev, generator=g),
                                  torch.randint(0, 16, (k // 128, n), device=dev, generator=g),
                                  (torch.rand(k // 128, n, device=dev, generator=g) * 0.02).half(), 128)
            ws.append(fmt.pair_gate_up(w) if silu else w)
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        results = {}
        for config in int4_triton.INT4_GEMV_CONFIGS:
            plain = int4_triton.int4_gemv(x, ws[0], config, silu)
            for cap in (None, 96, 80, 64):
                assert torch.equal(int4_triton.int4_gemv(x, ws[0], config, silu, maxnreg=cap), plain)
                us = triton_ops._graph_time_us(
                    lambda: [int4_triton.int4_gemv(x, w, config, silu, maxnreg=cap) for w in ws], len(ws))
                results[f"{config} maxnreg={cap}"] = round(us, 2)
        report[name] = dict(sorted(results.items(), key=lambda item: item[1]))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
