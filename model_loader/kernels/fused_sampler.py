"""The fused sampler's host side (kernels in jit_sampler): its buffers and launch shapes (sampling.sample decides
when it applies).

It replaces sampling.sample's sort-based pipeline on the GPU for 16-bit logits (the decode step's): five small
kernels, no sort of the 152k-token vocabulary, no host sync, so it lives inside the decode step's CUDA graph.
"""

from __future__ import annotations

import os

import torch
import triton

from model_loader.kernels import jit_sampler
from model_loader.kernels.jit_sampler import (
    _sampler_draw_kernel,
    _sampler_mass_high_kernel,
    _sampler_mass_low_kernel,
    _sampler_max_kernel,
    _sampler_top_k_kernel,
)
from model_loader.kernels.precompile import launch

# Logits per program: 38 programs for Qwen2's 151,936. The fastest whole sampler of the block sizes timed
# (benchmarks/sampler_cost.py), the balance between fewer partial histograms for the last program to add up and
# fewer programs sharing the atomics.
BLOCK = 4096
NUM_WARPS = 8


class SamplerScratch:
    """Per (rows, vocabulary) buffers: the kernels' partial histograms and state, the rows' step counters (the
    noise's Philox counter) and the chosen tokens. Allocated once, before any graph capture uses them."""

    def __init__(self, rows: int, vocab: int, device, block: int = BLOCK):
        self.block = min(block, max(32, triton.next_power_of_2(vocab)))  # a small vocabulary: one small program
        self.n_programs = triton.cdiv(vocab, self.block)
        n = self.n_programs
        # tickets must start at 0
        self.istate = torch.zeros(rows, jit_sampler.I_SLOTS.value, dtype=torch.int32, device=device)
        self.fstate = torch.zeros(rows, jit_sampler.F_SLOTS.value, dtype=torch.float32, device=device)
        self.lstate = torch.zeros(rows, jit_sampler.L_SLOTS.value, dtype=torch.int64, device=device)
        self.part_f = torch.zeros(rows, n, dtype=torch.float32, device=device)
        self.part_i = torch.zeros(rows, n, dtype=torch.int32, device=device)
        self.part_t = torch.zeros(rows, n, dtype=torch.int32, device=device)
        self.hist_c = torch.zeros(rows, n, jit_sampler.BINS.value, dtype=torch.int32, device=device)
        self.hist_w = torch.zeros(rows, n, jit_sampler.BINS.value, dtype=torch.int64, device=device)  # fixed point
        self.steps = torch.zeros(rows, dtype=torch.int64, device=device)
        self.out = torch.zeros(rows, dtype=torch.int64, device=device)


def fused_sample(logits: torch.Tensor, params, block: int = BLOCK) -> torch.Tensor:
    """Temperature, top-k, top-p and a draw, as sampling.sample defines them; [R, V] 16-bit -> [R] int64 (a view of
    a buffer that the next call overwrites). Noise: params.seed and the per-row step counters (params.reseed).
    `block` (logits per program) is for the tests: small ones make several programs out of a small vocabulary."""
    logits = logits.contiguous()
    rows, vocab = logits.shape
    s = params.scratch(rows, vocab, block)
    n = s.n_programs
    grid = (n, rows)
    fence = logits.is_cuda and os.environ.get("TRITON_INTERPRET") != "1"
    shape = dict(BLOCK=s.block, FENCE=fence, num_warps=NUM_WARPS)
    npow = triton.next_power_of_2(n)
    launch(_sampler_max_kernel, grid)(
        logits, params.top_k, s.istate, s.fstate, s.part_f, s.hist_c, vocab, n, NPOW=npow, **shape
    )
    launch(_sampler_top_k_kernel, grid)(logits, params.top_k, s.istate, s.hist_c, vocab, n, **shape)
    launch(_sampler_mass_high_kernel, grid)(
        logits, params.temperature, params.top_p, s.istate, s.fstate, s.lstate, s.hist_w, vocab, n, **shape
    )
    launch(_sampler_mass_low_kernel, grid)(
        logits, params.temperature, s.istate, s.fstate, s.lstate, s.hist_w, s.hist_c, vocab, n, **shape
    )
    launch(_sampler_draw_kernel, grid)(
        logits,
        params.temperature,
        params.seed,
        s.steps,
        s.istate,
        s.fstate,
        s.part_f,
        s.part_i,
        s.part_t,
        s.out,
        vocab,
        n,
        NPOW=npow,
        **shape,
    )
    return s.out
