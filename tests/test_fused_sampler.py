"""The fused sampler (model_loader.kernels.fused_sampler): what the decode step uses on a GPU for 16-bit logits,
one kernel for temperature, top-k, top-p and the draw. It keeps exactly the set sampling's definition keeps (ties
lowest index first), draws from it in proportion, picks among kept ties uniformly and replays a seed. Here it runs
in Triton's interpreter on the CPU (slow: few draws, so the checks are the exact ones plus a coarse frequency
check) and for real on a GPU (many draws)."""

import math

import pytest
import torch

from model_loader.sampling import SamplerParams
from test_sampling import expected


def _keys(x: torch.Tensor) -> torch.Tensor:
    b = x.view(torch.int16).to(torch.int32) & 0xFFFF
    return torch.where(b >= 0x8000, 0xFFFF - b, b + 0x8000)


def kept_by_definition(logits: torch.Tensor, temperature: float, top_p: float, top_k: int):
    """The kept tokens in sorted order (ties lowest index first), as sort_sample defines the set, in float64."""
    x = logits.view(-1).double()
    order = sorted(range(x.numel()), key=lambda i: (-x[i].item(), i))
    order = order[:top_k] if top_k else order
    weights = torch.exp((x[order] - x.max()) / temperature).tolist()
    target, mass, kept = top_p * sum(weights), 0.0, []
    for token, w in zip(order, weights):
        if top_p < 1 and mass >= target:
            break
        kept.append(token)
        mass += w
    return kept


def _fused(logits, params, block):
    from model_loader.kernels.fused_sampler import fused_sample

    return fused_sample(logits, params, block=block)


@pytest.mark.parametrize("case", range(10))
def test_fused_sampler_keeps_exactly_the_defined_set(device, case):
    """The boundary the kernels find by radix select (key and number of kept ties) is the sorted definition's, over
    several programs per row, with and without top-k and top-p, with many ties (logits rounded coarsely; bf16 and
    fp16)."""
    from model_loader.kernels.jit_sampler import I_NB, I_TB

    g = torch.Generator().manual_seed(100 + case)
    vocab = [40, 300, 1000, 777, 300][case % 5]
    scale, decimals = [(0.5, 1), (2.0, 0), (8.0, 1), (2.0, 2), (1.0, 0)][case % 5]
    temperature, top_p, top_k = [
        (0.6, 0.95, 0),
        (1.0, 0.5, 0),
        (0.3, 1.0, 7),
        (1.5, 0.9, 50),
        (0.7, 0.1, 0),
        (1.0, 1.0, 0),
        (0.6, 0.95, 1),
        (1.2, 0.99, vocab - 1),
        (0.8, 0.7, 3),
        (0.6, 0.999, 0),
    ][case]
    dtype = torch.float16 if case % 3 == 2 else torch.bfloat16  # GPUs without bf16 decode in fp16
    logits = (torch.randn(1, vocab, generator=g) * scale).round(decimals=decimals).to(dtype)
    params = SamplerParams(device)
    params.set(temperature, top_p, top_k, vocab)
    params.reseed(case)
    token = _fused(logits.to(device), params, block=64).item()
    kept = kept_by_definition(logits, temperature, top_p, top_k)
    state = params.scratch(1, vocab, 64).istate[0].cpu()
    I_TB, I_NB = I_TB.value, I_NB.value
    keys = _keys(logits.view(-1))
    if len(kept) == vocab:
        assert state[I_TB] == -1  # no boundary: every token takes part
    else:
        boundary = keys[kept[-1]].item()
        assert state[I_TB] == boundary
        assert state[I_NB] == sum(1 for t in kept if keys[t] == boundary)
    assert token in kept


@pytest.mark.parametrize("temperature,top_p,top_k", [(0.6, 0.9, 0), (1.0, 1.0, 5), (1.3, 0.5, 0), (0.8, 0.95, 12)])
def test_fused_sampler_follows_the_nucleus_distribution(device, temperature, top_p, top_k):
    vocab = 40
    draws = 40000 if device == "cuda" else 120  # the interpreter takes ~80 ms a row: a coarse check there
    g = torch.Generator().manual_seed(7)
    logits = (torch.randperm(vocab, generator=g).float() / 8).to(torch.bfloat16)[None]
    params = SamplerParams(device)
    params.set(temperature, top_p, top_k, vocab)
    params.reseed(11)
    picks = _fused(logits.to(device).expand(draws, vocab), params, block=32)  # 2 programs a row
    freq = torch.bincount(picks.cpu(), minlength=vocab).double() / draws
    want = expected(logits, temperature, top_p, top_k)
    assert freq[want == 0].sum() == 0
    sigma = torch.sqrt(want * (1 - want) / draws)
    assert torch.all((freq - want).abs() <= 5 * sigma + 1e-12), (freq - want).abs().max()


def test_fused_sampler_picks_kept_ties_uniformly(device):
    """A nucleus that ends inside a run of equal logits keeps the first of them by index, each as likely as the
    others (the ties race as one entry, then one is picked: the per-token probability is unchanged)."""
    vocab = 200
    draws = 40000 if device == "cuda" else 120
    logits = torch.full((1, vocab), -8.0)
    logits[0, 5] = 2.0  # one clear favourite
    logits[0, 20:120] = 1.0  # a run of 100 equal logits, spread over the programs (block 64)
    logits = logits.to(torch.bfloat16)
    temperature, top_p = 1.0, 0.6
    kept = kept_by_definition(logits, temperature, top_p, 0)
    n_ties = len(kept) - 1
    assert 1 < n_ties < 100 and kept[1:] == list(range(20, 20 + n_ties))
    params = SamplerParams(device)
    params.set(temperature, top_p, 0, vocab)
    params.reseed(3)
    picks = _fused(logits.to(device).expand(draws, vocab), params, block=64).cpu()
    assert set(picks.tolist()) <= set(kept)
    w_fav, w_tie = math.exp(1.0), 1.0
    z = w_fav + n_ties * w_tie
    ties = (picks != 5).double().mean().item()
    assert abs(ties - n_ties * w_tie / z) <= 5 * math.sqrt(ties * (1 - ties) / draws) + 0.02
    if device == "cuda":  # enough draws to see each kept tie's share
        counts = torch.bincount(picks, minlength=vocab)[20 : 20 + n_ties].double() / draws
        share = w_tie / z
        assert torch.all((counts - share).abs() <= 5 * math.sqrt(share * (1 - share) / draws))


def test_fused_sampler_always_returns_a_token_id(device):
    """Logits with NaNs (a broken model) give some token id in range, never one past the vocabulary (which would
    make the next step's embedding read out of bounds and take the GPU context down)."""
    vocab = 100
    logits = torch.randn(1, vocab)
    logits[0, ::7] = float("nan")
    params = SamplerParams(device)
    params.set(0.6, 0.9, 0, vocab)
    params.reseed(0)
    for _ in range(3):
        token = _fused(logits.to(torch.bfloat16).to(device), params, block=32).item()
        assert 0 <= token < vocab


def test_fused_sampler_replays_a_seed_and_moves_on(device):
    vocab = 64
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(1, vocab, generator=g)).to(torch.bfloat16).to(device)
    params = SamplerParams(device)
    params.set(1.0, 1.0, 0, vocab)
    with torch.inference_mode():  # the buffers are made inside inference mode, as in the engine's warm-up
        _fused(logits, params, block=32)

    def reply(seed, n=12):
        params.reseed(seed)
        return [_fused(logits, params, block=32).item() for _ in range(n)]

    first = reply(42)
    assert reply(42) == first  # the same seed, the same tokens
    assert len(set(first)) > 1  # the noise moves on from token to token
    assert reply(43) != first


@pytest.mark.parametrize("top_p,top_k", [(0.95, 0), (0.5, 40)])
def test_fused_sampler_at_the_real_vocabulary_size(device, top_p, top_k):
    """Qwen2's 151,936 logits with the default launch shape (as the decode step runs it): the same boundary as
    the sorted definition, for a flat row (a nucleus of ~100k tokens) and a peaked one with top-k."""
    from model_loader.kernels.fused_sampler import fused_sample
    from model_loader.kernels.jit_sampler import I_NB, I_TB

    vocab, temperature = 151936, 0.6
    g = torch.Generator().manual_seed(9)
    scale = 0.3 if top_k == 0 else 3.0
    logits = (torch.randn(1, vocab, generator=g) * scale).to(torch.bfloat16)
    params = SamplerParams(device)
    params.set(temperature, top_p, top_k, vocab)
    params.reseed(1)
    token = fused_sample(logits.to(device), params).item()
    # the definition, vectorised: sorted descending, ties in index order
    x = logits.view(-1).double()
    order = torch.sort(x, descending=True, stable=True).indices
    order = order[:top_k] if top_k else order
    weights = torch.exp((x[order] - x.max()) / temperature)
    before = torch.cumsum(weights, 0) - weights
    kept = order[before < top_p * weights.sum()]
    keys = _keys(logits.view(-1))
    boundary = keys[kept[-1]].item()
    state = next(iter(params._scratch.values())).istate[0].cpu()
    assert state[I_TB.value] == boundary
    assert state[I_NB.value] == (keys[kept] == boundary).sum().item()
    assert token in set(kept.tolist())
