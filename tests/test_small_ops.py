"""The fused small per-layer kernels (kernels.small_ops: add+RMSNorm, SiLU·mul, bias+RoPE+cache write) against
the plain PyTorch reference (kernels.reference), at the tiny test model's shapes and the real 1.5B's. On a
CPU-only machine they run in Triton's interpreter."""

import pytest
import torch
from kernel_checks import SHAPES, kernel_dtype, tolerance

from model_loader.kernels import prefill_attention, reference, small_ops


@pytest.mark.parametrize("has_res", [False, True])
@pytest.mark.parametrize("hidden", [64, 1536])
def test_add_rms_norm_matches_reference(device, has_res, hidden):
    g = torch.Generator().manual_seed(0)
    dt = kernel_dtype(device)
    x = torch.randn(3, hidden, generator=g).to(device, dt)
    res = torch.randn(3, hidden, generator=g).to(device, dt) if has_res else None
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(device, dt)
    ref_out, ref_res = reference.add_rms_norm(x, None if res is None else res.clone(), w, 1e-6)
    out, new_res = small_ops.add_rms_norm(x, None if res is None else res.clone(), w, 1e-6)
    torch.testing.assert_close(new_res, ref_res, **tolerance(device))
    torch.testing.assert_close(out, ref_out, **tolerance(device))


def test_rms_norm_matches_reference(device):
    x = torch.randn(5, 64).to(device, kernel_dtype(device))
    w = torch.rand(64).to(device, kernel_dtype(device))
    torch.testing.assert_close(small_ops.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6), **tolerance(device))


def test_silu_mul_matches_reference(device):
    x = torch.randn(3, 2 * 1500).to(device, kernel_dtype(device))  # not a multiple of the block: masked tail
    torch.testing.assert_close(small_ops.silu_mul(x), reference.silu_mul(x), **tolerance(device))


def test_silu_mul_reads_rows_stored_in_gate_up_pairs(device):
    """A paired gate/up weight (linears.pair_gate_up_rows) makes a prefill's GEMM output (gate 0, up 0, gate 1,
    ...): silu_mul(paired=True) gives what the reference makes of [gate | up]."""
    from model_loader.linears import pair_gate_up_rows

    x = torch.randn(3, 2 * 1500, generator=torch.Generator().manual_seed(4)).to(device, kernel_dtype(device))
    paired = x.t().contiguous()  # pair the columns the way pair_gate_up_rows pairs a weight's rows
    pair_gate_up_rows(paired)
    paired = paired.t().contiguous()
    assert torch.equal(paired[:, 0::2], x[:, :1500]) and torch.equal(paired[:, 1::2], x[:, 1500:])
    torch.testing.assert_close(small_ops.silu_mul(paired, paired=True), small_ops.silu_mul(x), atol=0, rtol=0)
    torch.testing.assert_close(small_ops.silu_mul(paired, paired=True), reference.silu_mul(x), **tolerance(device))


def _rope_inputs(device, hq, hkv, d, t, seed, max_ctx=32):
    """qkv, bias, cos, sin and four empty caches (two for the reference, two for the kernel)."""
    dt = kernel_dtype(device)
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=g).to(device, dt)
    bias = torch.randn((hq + 2 * hkv) * d, generator=g).to(device, dt)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(max_ctx).float(), inv)
    cos, sin = freqs.cos().to(device), freqs.sin().to(device)
    caches = [torch.zeros(hkv, max_ctx, d, device=device, dtype=dt) for _ in range(4)]
    return qkv, bias, cos, sin, caches


def _rope_kernel_matches_reference(qkv, bias, cos, sin, caches, pos_t, ref_start, kernel_start, hq, hkv, device):
    """The reference at ref_start vs the Triton kernel given kernel_start (it must use pos_t): q and caches."""
    q_ref = reference.rope_bias_cache(qkv, bias, cos, sin, caches[0], caches[1], pos_t, ref_start, hq, hkv)
    q = small_ops.rope_bias_cache(qkv, bias, cos, sin, caches[2], caches[3], pos_t, kernel_start, hq, hkv)
    torch.testing.assert_close(q, q_ref, **tolerance(device))
    torch.testing.assert_close(caches[2], caches[0], **tolerance(device))
    torch.testing.assert_close(caches[3], caches[1], **tolerance(device))


@pytest.mark.parametrize("hq,hkv,d,hidden", SHAPES)
@pytest.mark.parametrize("start,t", [(0, 5), (7, 1), (3, 21)])
def test_rope_bias_cache_matches_reference(device, hq, hkv, d, hidden, start, t):
    qkv, bias, cos, sin, caches = _rope_inputs(device, hq, hkv, d, t, seed=1)
    pos_t = torch.tensor([start], device=device, dtype=torch.int32)
    _rope_kernel_matches_reference(qkv, bias, cos, sin, caches, pos_t, start, start, hq, hkv, device)
    assert caches[2][:, start + t :].abs().sum() == 0  # nothing written past the new tokens


@pytest.mark.parametrize("hq,hkv,d,hidden", SHAPES)
def test_rope_bias_cache_takes_the_position_from_the_device_tensor(device, hq, hkv, d, hidden):
    """One CUDA graph serves every decode step, so the kernel must read the position from pos_t (updated on
    the device each step), never from the host `start` that was current when the graph was captured. Here
    the host value is stale and only pos_t is right: rotation and cache slot must follow pos_t."""
    live, stale = 9, 2
    qkv, bias, cos, sin, caches = _rope_inputs(device, hq, hkv, d, 1, seed=3)
    pos_t = torch.tensor([live], device=device, dtype=torch.int32)
    _rope_kernel_matches_reference(qkv, bias, cos, sin, caches, pos_t, live, stale, hq, hkv, device)
    assert caches[2][:, stale].abs().sum() == 0 and caches[3][:, stale].abs().sum() == 0


@pytest.mark.parametrize("start,t", [(37, 16), (100, 70), (1020, 3)])
def test_a_prefills_rope_kernel_zeroes_the_stale_value_rows_a_whole_key_tile_reads(device, start, t):
    """The prefill attention reads its last key tile whole through TMA on Hopper (no per-row mask), so this
    prefill's RoPE/cache kernel zeroes the STALE_V_ROWS value rows after its tokens: a NaN an earlier reply left
    there would survive a zero weight. Only those rows, only V, never past the head's max_ctx rows (the next
    head's first rows follow them in memory); a decode step (one token) writes just its row."""
    from model_loader.kernels.jit_small_ops import STALE_V_ROWS

    hq, hkv, d, max_ctx = 4, 2, 16, 1024
    stale_rows = STALE_V_ROWS.value
    assert all(shape[1] <= stale_rows for _, shape in prefill_attention.PrefillAttention.SHAPES)
    qkv, bias, cos, sin, _ = _rope_inputs(device, hq, hkv, d, t, seed=7, max_ctx=max_ctx)
    k = torch.full((hkv, max_ctx, d), float("nan"), device=device, dtype=qkv.dtype)
    v = torch.full((hkv, max_ctx, d), float("nan"), device=device, dtype=qkv.dtype)
    start_t = torch.tensor([start], device=device, dtype=torch.int32)
    small_ops.rope_bias_cache(qkv, bias, cos, sin, k, v, start_t, start, hq, hkv)
    end = start + t
    assert not k[:, start:end].isnan().any() and not v[:, start:end].isnan().any()
    zeroed = v[:, end : end + stale_rows]
    assert zeroed.shape[1] == min(stale_rows, max_ctx - end) and not zeroed.any()
    assert v[:, end + stale_rows :].isnan().all() and v[:, :start].isnan().all()
    assert k[:, end:].isnan().all() and k[:, :start].isnan().all()
    one = small_ops.rope_bias_cache(qkv[:1], bias, cos, sin, k, v, start_t, start, hq, hkv)
    assert one.shape[0] == 1 and v[:, end + stale_rows :].isnan().all()
