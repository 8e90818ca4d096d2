"""What does choosing the next token cost on the GPU, per variant of the sampler (a development tool)?

The decode step ends with the sampler; with the window's defaults (temperature 0.6, top-p 0.95, no top-k) the
engine decodes ~10% slower than greedy on the H200 (chat scenario 656 vs 724 tok/s). This times, each in a CUDA
graph (replays back to back), the sampler as it is and parts or alternatives of it, on one row of logits of
Qwen2's vocabulary: peaked (a real model's usual case) and flat (a random test model's).
usage: python -m benchmarks.sampler_cost [--vocab 151936] [--calls 200]
"""

import argparse

import torch

from model_loader.kernels.gemv import _graph_time_us
from model_loader.kernels.fused_sampler import fused_sample
from model_loader.sampling import SamplerParams, greedy, sort_sample


def graph_us(fn, calls: int) -> float:
    """GPU microseconds per call, from a CUDA graph of `calls` calls replayed back to back."""

    def many():
        for _ in range(calls):
            fn()

    for _ in range(2):  # outside the graph first: lazy initialisation (cuRAND state, sort workspaces)
        fn()
    return _graph_time_us(many, calls)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--calls", type=int, default=200, help="calls per captured graph (5 replays are timed)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    params = SamplerParams(dev)
    params.set(0.6, 0.95, 0, args.vocab)
    params_k = SamplerParams(dev)
    params_k.set(0.6, 0.95, 50, args.vocab)
    gen = torch.Generator(device=dev).manual_seed(0)
    for shape, scale in (("peaked", 4.0), ("flat", 0.05)):
        bf16 = (torch.randn(1, args.vocab, generator=gen, device=dev) * scale).to(torch.bfloat16)
        fp32 = bf16.float()
        variants = {
            "greedy (argmax)": lambda: greedy(fp32),
            "fused sampler, bf16 logits (the decode step's)": lambda: fused_sample(bf16, params),
            "fused sampler with top-k 50": lambda: fused_sample(bf16, params_k),
            **{
                f"  fused sampler, {b} logits a program": (lambda b=b: fused_sample(bf16, params, block=b))
                for b in (1024, 2048, 8192)
            },
            "sort_sample() on fp32 logits": lambda: sort_sample(fp32, params),
            "sort_sample() on the bf16 logits": lambda: sort_sample(bf16, params),
            "greedy on the bf16 logits": lambda: greedy(bf16),
            "  of which torch.sort fp32": lambda: torch.sort(fp32, dim=-1, descending=True),
            "  torch.sort on the bf16 logits": lambda: torch.sort(bf16, dim=-1, descending=True),
            "  torch.topk 1024 fp32": lambda: torch.topk(fp32, 1024, dim=-1),
            "  torch.topk 64 fp32": lambda: torch.topk(fp32, 64, dim=-1),
            "  softmax+cumsum+mask+noise+argmax (no sort)": lambda: _tail(fp32, params),
            "  .float() of the bf16 logits": lambda: bf16.float(),
        }
        for name, fn in variants.items():
            print(f"{shape:7s} {name:48s} {graph_us(fn, args.calls):8.1f} us", flush=True)


def _tail(sorted_logits, params):
    scaled = sorted_logits / params.temperature
    probs = torch.softmax(scaled, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs
    probs = probs.masked_fill(before >= params.top_p, 0.0)
    noise = torch.empty_like(probs).exponential_()
    return torch.argmax(probs / noise, dim=-1, keepdim=True)


if __name__ == "__main__":
    main()
