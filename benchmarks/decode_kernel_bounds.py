"""How much could fusing away each kind of the decode step's small kernels save (CUDA GPU)?

Upper bounds: the step's GPU time with one kind of them left out.

The greedy decode graph is captured again with small_ops.add_rms_norm, rope_bias_cache or silu_mul replaced by
a function that launches nothing (the maths is then wrong; only the time means anything), and timed at depth 512
against the step as it is. What a kind of kernel costs the step (its work plus its kernel boundary) is the most
that fusing it away could save.

    python -m benchmarks.decode_kernel_bounds MODEL_DIR [--rounds 2]
"""

from __future__ import annotations

import argparse

from model_loader.engine import Engine
from model_loader.kernels import small_ops as T


def no_norm(x, residual, weight, eps, out=None, residual_out=None):
    return x, (residual if residual is not None else x)


def no_rope(qkv, bias, cos, sin, k_cache, v_cache, pos_t, start, num_heads, num_kv_heads, q_out=None, scales=None):
    d = k_cache.shape[-1]
    return qkv[:, : num_heads * d].view(qkv.shape[0], num_heads, d)


def no_silu(gate_up, out=None):
    return gate_up[:, : gate_up.shape[1] // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    engine = Engine.load(args.model, device="cuda", context_length=1024)
    engine.warm_up()
    step = engine.step

    def timed(label: str) -> None:
        step.graphs.clear()
        step.capture("greedy")
        graph = step.graphs[("greedy", step.config_for(513))]
        times = [step.time_replays(graph, 512, 200) for _ in range(3)]
        print(f"{label}: {min(times):.1f} us/step {[round(t, 1) for t in times]}", flush=True)

    for _ in range(args.rounds):
        timed("the step")
        for name, stand_in in (("add_rms_norm", no_norm), ("rope_bias_cache", no_rope), ("silu_mul", no_silu)):
            real = getattr(T, name)
            setattr(T, name, stand_in)
            try:
                timed(f"without {name}")
            finally:
                setattr(T, name, real)


if __name__ == "__main__":
    main()
