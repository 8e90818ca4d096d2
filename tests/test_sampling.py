"""The device sampler (model_loader.sampling.sample) draws from exactly the distribution its settings define:
temperature, then top-k, then the smallest top-p nucleus, renormalised. Checked by drawing many samples and
comparing the frequencies with that distribution computed directly, for logits in fp32 and in bf16 (the decode
step hands over the model's own dtype, which the sampler sorts as it is), on the CPU and, where there is one,
the GPU."""

import math

import pytest
import torch

from model_loader.sampling import SamplerParams, greedy, sample, sort_sample


def expected(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """The distribution by its definition, in float64, token by token."""
    values = logits.double().view(-1) / temperature
    order = sorted(range(values.numel()), key=lambda i: -values[i].item())
    kept = order[:top_k] if top_k else order
    weights = torch.softmax(values[kept], dim=0)
    nucleus, mass = [], 0.0
    for token, w in zip(kept, weights.tolist()):
        if mass >= top_p:
            break
        nucleus.append(token)
        mass += w
    dist = torch.zeros_like(values)
    dist[nucleus] = torch.softmax(values[nucleus], dim=0)
    return dist


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature,top_p,top_k", [(0.6, 0.9, 0), (1.0, 1.0, 5), (1.3, 0.5, 0), (0.8, 0.95, 12)])
def test_samples_follow_the_nucleus_distribution(device, dtype, temperature, top_p, top_k):
    vocab, draws = 40, 40000
    g = torch.Generator().manual_seed(7)
    # distinct values, exactly representable in bf16, so the sorted order is the same in both dtypes
    logits = (torch.randperm(vocab, generator=g).float() / 8).to(dtype)[None]
    params = SamplerParams(device)
    params.set(temperature, top_p, top_k, vocab)
    picks = sample(logits.to(device).expand(draws, vocab), params, torch.Generator(device).manual_seed(11))
    freq = torch.bincount(picks.cpu(), minlength=vocab).double() / draws
    want = expected(logits, temperature, top_p, top_k)
    assert freq[want == 0].sum() == 0  # nothing outside top-k and the nucleus, ever
    sigma = torch.sqrt(want * (1 - want) / draws)
    assert torch.all((freq - want).abs() <= 5 * sigma + 1e-12), (freq - want).abs().max()
    assert math.isclose(want.sum().item(), 1.0, rel_tol=1e-9)


def test_sampling_works_where_triton_is_missing():
    """A CPU-only install or bundle has no Triton: sampling must not import it (the frozen CPU app's replies
    failed with "No module named 'triton'" when it did)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['triton'] = None\n"  # any import of triton now raises ImportError
        "import torch\n"
        "from model_loader.sampling import SamplerParams, sample\n"
        "p = SamplerParams('cpu'); p.set(0.6, 0.95, 0, 50)\n"
        "for dtype in (torch.float32, torch.bfloat16):\n"
        "    t = sample(torch.randn(1, 50).to(dtype), p, torch.Generator().manual_seed(0))\n"
        "    assert 0 <= t.item() < 50\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_settings_are_clamped_to_what_the_sampler_can_use():
    params = SamplerParams("cpu")
    params.set(0.0, 0.0, 0, 100)  # temperature 0 (greedy), top_p 0, top_k 0 (none)
    assert params.temperature.item() == pytest.approx(1e-5)
    assert params.top_p.item() == pytest.approx(1e-6)
    assert params.top_k.item() == 100  # the whole vocabulary
    params.set(0.7, 1.5, 250, 100)  # top_p over 1, top_k past the vocabulary
    assert params.temperature.item() == pytest.approx(0.7)
    assert params.top_p.item() == 1.0
    assert params.top_k.item() == 100
    params.set(1.2, 0.9, 40, 100)
    assert (params.temperature.item(), params.top_p.item(), params.top_k.item()) == pytest.approx((1.2, 0.9, 40))
    params.set(1.0, 1.0, -3, 100)  # a negative top_k is none too
    assert params.top_k.item() == 100
    params.set(1.0, 1.0, 1, 100)  # top_k 1: the likeliest token only
    assert params.top_k.item() == 1


def test_fresh_settings_sample_the_whole_softmax():
    """Before set(): temperature 1, top-p 1 and no top-k, so every token can be drawn."""
    params = SamplerParams("cpu")
    assert (params.temperature.item(), params.top_p.item()) == (1.0, 1.0)
    vocab, draws = 8, 4000
    logits = torch.zeros(1, vocab)  # uniform
    picks = sample(logits.expand(draws, vocab), params, torch.Generator().manual_seed(3))
    assert set(picks.tolist()) == set(range(vocab))


def test_temperature_zero_samples_the_likeliest_token():
    params = SamplerParams("cpu")
    params.set(0.0, 0.95, 0, 50)
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(64, 50, generator=g)
    picks = sample(logits, params, torch.Generator().manual_seed(6))
    assert torch.equal(picks, greedy(logits))
    assert picks.shape == (64,)


def test_greedy_takes_each_rows_largest_logit():
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.9], [5.0, 0.0, 0.0, 4.0]])
    assert greedy(logits).tolist() == [1, 0]


def test_min_p_drops_tokens_below_that_share_of_the_likeliest():
    """A host-side min_p (logits_processing.HostSampler): a token whose probability is under min_p times the
    likeliest one's is never drawn; the rest keep their relative weights."""
    params = SamplerParams("cpu")
    params.set(1.0, 1.0, 0, 4)
    params.min_p = 0.2
    # probabilities relative to the likeliest: 1, 0.5, 0.25, 0.1 (shifted: only differences of logits count)
    logits = torch.log(torch.tensor([[1.0, 0.5, 0.25, 0.1]])) + 3.0
    draws = 20000
    picks = sort_sample(logits.expand(draws, 4), params, torch.Generator().manual_seed(9))
    freq = torch.bincount(picks, minlength=4).double() / draws
    assert freq[3] == 0
    want = torch.tensor([1.0, 0.5, 0.25, 0.0], dtype=torch.float64) / 1.75
    assert torch.all((freq - want).abs() < 0.02), freq
    params.min_p = 0.0  # off: the last token is drawn too
    picks = sort_sample(logits.expand(draws, 4), params, torch.Generator().manual_seed(9))
    assert (picks == 3).any()


def test_reseed_sets_the_fused_samplers_key_and_restarts_its_counters():
    from types import SimpleNamespace

    params = SamplerParams("cpu")
    scratch = SimpleNamespace(steps=torch.tensor([7, 3]))
    params._scratch[(2, 50, 1024)] = scratch  # a shape the fused sampler has already run
    params.reseed(1234)
    assert params.seed.item() == 1234
    assert scratch.steps.tolist() == [0, 0]


def test_the_same_generator_seed_replays_the_same_tokens():
    params = SamplerParams("cpu")
    params.set(1.0, 1.0, 0, 50)
    logits = torch.zeros(256, 50)  # uniform: any token can come
    first = sample(logits, params, torch.Generator().manual_seed(42))
    torch.manual_seed(0)  # the global generator is not the one drawn from
    again = sample(logits, params, torch.Generator().manual_seed(42))
    other = sample(logits, params, torch.Generator().manual_seed(43))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_top_k_one_always_takes_the_likeliest_token():
    params = SamplerParams("cpu")
    params.set(1.0, 1.0, 1, 8)
    logits = torch.tensor([[0.0, 0.1, 0.2, 0.3, 0.25, 0.15, 0.05, 0.0]])  # nearly uniform
    picks = sample(logits.expand(2000, 8), params, torch.Generator().manual_seed(1))
    assert set(picks.tolist()) == {3}


def test_a_nucleus_that_reaches_top_p_exactly_stops_there():
    """Two equally likely tokens and top_p 0.5: the first one sorted already holds half the mass, so the other
    is never drawn."""
    params = SamplerParams("cpu")
    params.set(1.0, 0.5, 0, 2)
    picks = sample(torch.zeros(2000, 2), params, torch.Generator().manual_seed(2))
    assert len(set(picks.tolist())) == 1


def test_the_fused_samplers_buffers_are_made_once_per_shape():
    params = SamplerParams("cpu")
    first = params.scratch(2, 50, 64)
    assert params.scratch(2, 50, 64) is first
    assert params.scratch(3, 50, 64) is not first and params.scratch(2, 60, 64) is not first
    assert first.steps.shape == (2,) and first.steps.device == params.device
    first.steps.fill_(5)
    params.reseed(7)
    assert first.steps.tolist() == [0, 0]
