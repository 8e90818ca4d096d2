"""Next-token choice on the device, with no host sync, so it can live inside the CUDA-graph decode step.

Settings are device tensors (not Python numbers) so one captured graph serves every temperature/top-p/top-k.
Sampling draws with the exponential-race trick (argmax of p / Exp(1) noise), which is exact multinomial
sampling without torch.multinomial's host sync. On a GPU, 16-bit logits (the decode step's) go to the fused
sampler (kernels/fused_sampler.py: the same distribution without sorting the vocabulary, 5 small kernels);
`sample` below is the definition, and the path for the CPU and fp32 logits.
"""

from __future__ import annotations

import os

import torch


class SamplerParams:
    """Device-resident sampling settings: written before a reply, read by the captured graph."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.temperature = torch.ones(1, device=device, dtype=torch.float32)
        self.top_p = torch.ones(1, device=device, dtype=torch.float32)
        self.top_k = torch.full((1,), 1 << 62, device=device, dtype=torch.int64)  # none until set()
        self.seed = torch.zeros(1, device=device, dtype=torch.int64)  # the fused sampler's Philox key
        self._scratch: dict = {}  # (rows, vocab, block) -> fused_sampler.SamplerScratch

    def scratch(self, rows: int, vocab: int, block: int):
        """The fused sampler's buffers for this shape, made on first use (a warm-up, before graph capture)."""
        key = (rows, vocab, block)
        if key not in self._scratch:
            from model_loader.kernels.fused_sampler import SamplerScratch

            self._scratch[key] = SamplerScratch(rows, vocab, self.device, block)
        return self._scratch[key]

    def reseed(self, seed: int) -> None:
        """Start the fused sampler's noise over from `seed` (each reply): the same seed replays the same reply."""
        with torch.inference_mode():  # the buffers were made inside it (a warm-up)
            self.seed.fill_(seed)
            for scratch in self._scratch.values():
                scratch.steps.zero_()

    def set(self, temperature: float, top_p: float, top_k: int, vocab_size: int) -> None:
        self.temperature.fill_(max(temperature, 1e-5))
        self.top_p.fill_(min(max(top_p, 1e-6), 1.0))
        self.top_k.fill_(top_k if 0 < top_k < vocab_size else vocab_size)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    # logits: [1, V] -> [1] int64
    return torch.argmax(logits, dim=-1)


def sample(
    logits: torch.Tensor, params: SamplerParams, generator: torch.Generator | None = None, fused: bool = True
) -> torch.Tensor:
    """The next token: the fused sampler for 16-bit logits on a GPU (where Triton is installed and `fused`: the
    model runs Triton's kernels, which a machine without a C compiler can't build), else sort_sample.
    R1DESK_TORCH_SAMPLER=1 keeps the sort-based sampler everywhere (to compare the two)."""
    fused = (
        _fused_sampler()
        if fused
        and logits.is_cuda
        and logits.dtype in (torch.bfloat16, torch.float16)
        and os.environ.get("R1DESK_TORCH_SAMPLER") != "1"
        else None
    )
    if fused is not None:
        return fused.fused_sample(logits, params)
    return sort_sample(logits, params, generator)


def _fused_sampler():
    """kernels.fused_sampler, or None where Triton is missing (a CPU-only install or bundle): importing it only
    on the GPU path keeps sampling working everywhere else."""
    try:
        from model_loader.kernels import fused_sampler
    except ImportError:
        return None
    return fused_sampler


def sort_sample(logits: torch.Tensor, params: SamplerParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """Temperature, then top-k (and min-p where params has it), then top-p (nucleus) over the sorted distribution;
    [1, V] -> [1] int64.
    The logits may be in the model's dtype: they are sorted as they are (a radix sort of 16-bit keys makes half
    the passes of one of 32-bit keys, and dividing by the temperature keeps the order), then scaled in fp32."""
    sorted_keys, order = torch.sort(logits, dim=-1, descending=True)
    # Weights relative to the largest logit, the first once sorted: no softmax pass (torch's runs one block for a
    # single row, a large share of the sampler's time over 152k logits). Tokens past top-k weigh nothing.
    weights = torch.exp((sorted_keys.float() - sorted_keys[..., :1].float()) / params.temperature)
    ranks = torch.arange(weights.shape[-1], device=logits.device)
    weights = weights.masked_fill(ranks >= params.top_k, 0.0)
    min_p = getattr(params, "min_p", 0.0)  # host-side settings only (logits_processing.HostSampler)
    if min_p > 0:  # a weight is the token's probability over the likeliest one's
        weights = weights.masked_fill(weights < min_p, 0.0)
    # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass before it already does
    # (the mass is relative to the total, the last running sum).
    running = torch.cumsum(weights, dim=-1)
    probs = weights.masked_fill(running - weights >= params.top_p * running[..., -1:], 0.0)
    noise = torch.empty_like(probs).exponential_(generator=generator)
    choice = torch.argmax(probs / noise, dim=-1, keepdim=True)
    return torch.gather(order, -1, choice).view(-1)
