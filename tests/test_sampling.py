"""The device sampler (model_loader.sampling.sample) draws from exactly the distribution its settings define:
temperature, then top-k, then the smallest top-p nucleus, renormalised. Checked by drawing many samples and
comparing the frequencies with that distribution computed directly, for logits in fp32 and in bf16 (the decode
step hands over the model's own dtype, which the sampler sorts as it is), on the CPU and, where there is one,
the GPU."""

import math

import pytest
import torch

from model_loader.sampling import SamplerParams, sample


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
