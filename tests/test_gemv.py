"""The single-token dense GEMV (kernels.gemv) against F.linear: every configuration, split along K, and the
gate/up GEMV that outputs SiLU(gate) * up. On a CPU-only machine it runs in Triton's interpreter."""

import pytest
import torch
from kernel_checks import kernel_dtype

from model_loader.kernels import gemv, reference, small_ops


@pytest.mark.parametrize("early", [0, 3])
@pytest.mark.parametrize("n,k", [(24, 64), (64, 128), (40, 1536)])
@pytest.mark.parametrize("config", gemv.GEMV_CONFIGS)
def test_single_token_gemv_matches_linear(device, n, k, config, early, monkeypatch):
    """Each config, with its weights streamed in the loop or the first chunks requested before the input is
    (1,536 columns: all of them in chunks of 512, half in chunks of 256 with the loop doing the rest)."""
    monkeypatch.setattr(gemv, "GEMV_EARLY_CHUNKS", early)
    dt = kernel_dtype(device)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, k, generator=g).to(device, dt)
    w = torch.randn(n, k, generator=g).to(device, dt)
    ref = torch.nn.functional.linear(x.float(), w.float()).to(dt)
    torch.testing.assert_close(
        gemv.gemv(x, w, config),
        ref,
        atol=5e-2 if device == "cuda" else 1e-4,
        rtol=2e-2 if device == "cuda" else 1e-5,
    )


@pytest.mark.parametrize("config", [(4, 64, 4, 2), (8, 64, 4, 3), (16, 128, 8, 4), (4, 512, 4, 7)])
@pytest.mark.parametrize("n,k", [(24, 448), (40, 1536)])
def test_single_token_gemv_split_along_k_matches_linear(device, n, k, config):
    """Splits along K (fp32 partials summed by the last split to finish): the same as F.linear, whether the splits
    come out even, one short, or fewer than asked; called twice, so the arrival counts are back to zero between
    calls (a count left over would make the wrong split sum up, or none)."""
    dt = kernel_dtype(device)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, k, generator=g).to(device, dt)
    w = torch.randn(n, k, generator=g).to(device, dt)
    ref = torch.nn.functional.linear(x.float(), w.float()).to(dt)
    per_split, splits = gemv.gemv_split(k, config)
    assert per_split % config[1] == 0 and (splits - 1) * per_split < k <= splits * per_split
    assert splits > 1 or k <= config[1]  # one chunk of 512 covers 448 inputs: no split
    for _ in range(2):
        torch.testing.assert_close(
            gemv.gemv(x, w, config),
            ref,
            atol=5e-2 if device == "cuda" else 1e-4,
            rtol=2e-2 if device == "cuda" else 1e-5,
        )
    assert not gemv.split_counters(x.device).any()


@pytest.mark.parametrize("config", gemv.GEMV_CONFIGS + ((8, 128, 4, 3),))
def test_gate_up_gemv_on_paired_rows_outputs_silu_gate_times_up(device, config):
    """The dense gate/up weight with its rows in pairs: the GEMV outputs SiLU(gate) * up, the numbers of the
    plain GEMV on [gate; up] followed by the separate SiLU kernel (bit for bit: both round the GEMV's sums to
    the model's dtype first)."""
    from model_loader.linears import pair_gate_up_rows

    dt = kernel_dtype(device)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1, 384, generator=g).to(device, dt)
    w = torch.randn(2 * 40, 384, generator=g).to(device, dt)
    paired = w.clone()
    pair_gate_up_rows(paired)
    assert torch.equal(paired[0::2], w[:40]) and torch.equal(paired[1::2], w[40:])
    expected = small_ops.silu_mul(gemv.gemv(x, paired, config), paired=True)
    got = gemv.gemv(x, paired, config, silu_output=True)
    assert got.shape == (1, 40)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    torch.testing.assert_close(
        got,
        reference.silu_mul(torch.nn.functional.linear(x.float(), w.float()).to(dt)),
        atol=5e-2 if device == "cuda" else 1e-4,
        rtol=2e-2 if device == "cuda" else 1e-4,
    )
