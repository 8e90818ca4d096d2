"""The prefill's attention (kernels.prefill_attention) against the plain PyTorch reference: after a cached
prefix, in key splits, packed GQA, 16-bit inputs with stale rows past the new tokens, and smaller tiles where
shared memory is short. On a CPU-only machine it runs in Triton's interpreter."""

import math

import pytest
import torch
from kernel_checks import SHAPES, kernel_dtype, tolerance

from model_loader.kernels import prefill_attention, reference


@pytest.mark.parametrize("hq,hkv,d,hidden", SHAPES)
@pytest.mark.parametrize(
    "start,t,splits",
    [
        (0, 5, None),
        (0, 70, None),
        (0, 70, 16),
        (37, 1, None),
        (37, 1, 16),
        (37, 16, 3),
        (300, 130, None),
        (300, 130, 3),
        (200, 300, None),
        (200, 300, 3),
        (1000, 3, None),
        (1000, 3, 16),
    ],
)
@pytest.mark.parametrize("pack_gqa", [False, True])
def test_prefill_attention_after_a_cached_prefix_matches_reference(
    device, monkeypatch, hq, hkv, d, hidden, start, t, splits, pack_gqa
):
    """Bottom-right causal attention over the cache with the prefix length read from a device tensor: fresh
    prompts (start 0), follow-ups and short injections, whole or cut into key splits (what short prefills over
    long prefixes use), with garbage past the new tokens that must not leak in; a query head per row block, or
    all the query heads of a KV head in one (PACK_GQA: rows of token and head, idle rows at the end)."""
    monkeypatch.setattr(prefill_attention.PrefillAttention, "PACK_GQA", pack_gqa)
    dt = kernel_dtype(device)
    g = torch.Generator().manual_seed(5)
    max_ctx = 1152
    k = torch.randn(hkv, max_ctx, d, generator=g).to(device, dt)
    v = torch.randn(hkv, max_ctx, d, generator=g).to(device, dt)
    k[:, start + t :] = 1e4
    v[:, start + t :] = 1e4
    q = torch.randn(t, hq, d, generator=g).to(device, dt)
    scale = 1 / math.sqrt(d)
    ref = reference.prefill_attention(q, k, v, start, scale)
    attn = prefill_attention.PrefillAttention(hq, hkv, d, device, max_tokens=16 * t)  # room for 16 splits
    assert attn.pack_gqa == (pack_gqa and hq > hkv)
    attn.mid_o.fill_(float("nan"))
    start_t = torch.tensor([start], device=device, dtype=torch.int32)
    torch.testing.assert_close(attn(q, k, v, start_t, scale, splits=splits), ref, **tolerance(device))


@pytest.mark.parametrize(
    "start,t,splits",
    [(0, 70, None), (37, 16, 3), (300, 130, None), (1000, 3, 16), (0, 70, 1), (300, 130, 1), (37, 200, 1)],
)
@pytest.mark.parametrize("pack_gqa", [False, True])
def test_prefill_attention_of_16_bit_inputs_matches_reference(device, monkeypatch, start, t, splits, pack_gqa):
    """16-bit inputs take the exp2 softmax with its running max in log2 units, and split results go back to
    natural units for the reduce: fp16 here (bf16 on a GPU too), which Triton's interpreter also runs, against
    the reference in fp32. On Hopper or newer, unsplit (splits 1), they read K/V through tensor descriptors,
    whose tiles include the stale rows past the new tokens: NaN there (an earlier reply that overflowed) must
    not leak in. The cache as a prefill leaves it: K stale (NaN) after the new tokens, V zeroed for
    STALE_V_ROWS (by the RoPE kernel) and stale beyond."""
    from model_loader.kernels.jit_small_ops import STALE_V_ROWS

    monkeypatch.setattr(prefill_attention.PrefillAttention, "PACK_GQA", pack_gqa)
    hq, hkv, d = 6, 2, 64  # a group of 3: packed row blocks end in idle rows
    g = torch.Generator().manual_seed(6)
    max_ctx = 1152
    dts = [torch.float16] + ([torch.bfloat16] if device == "cuda" else [])
    for dt in dts:
        k = torch.randn(hkv, max_ctx, d, generator=g).to(device, dt)
        v = torch.randn(hkv, max_ctx, d, generator=g).to(device, dt)
        q = torch.randn(t, hq, d, generator=g).to(device, dt)
        scale = 1 / math.sqrt(d)
        ref = reference.prefill_attention(q.float(), k.float(), v.float(), start, scale)
        k[:, start + t :] = float("nan")
        v[:, start + t : start + t + STALE_V_ROWS.value] = 0.0
        v[:, start + t + STALE_V_ROWS.value :] = float("nan")
        attn = prefill_attention.PrefillAttention(hq, hkv, d, device, max_tokens=16 * t)
        assert attn.tma == (device == "cuda" and torch.cuda.get_device_capability() >= (9, 0))
        start_t = torch.tensor([start], device=device, dtype=torch.int32)
        out = attn(q, k, v, start_t, scale, splits=splits)
        assert out.dtype == dt
        torch.testing.assert_close(out.float(), ref, atol=2e-3 if dt == torch.float16 else 1.6e-2, rtol=1e-2)


@pytest.mark.parametrize("max_stages,expected", [(1, (64, 64, 4, 1)), (2, (64, 64, 4, 2))])
def test_prefill_attention_falls_back_to_smaller_tiles_where_shared_memory_is_short(
    device, monkeypatch, max_stages, expected
):
    """The tuned tiles (H200, bf16) need more shared memory than fp32 models or small GPUs have: Triton refuses
    them at launch (OutOfResources) and the next smaller tile shape must run instead, with the same result, and
    be remembered so that a refused shape is not compiled again. The GPU's limit is simulated here: shapes
    over 64 rows, or with more pipeline stages than it has room for (2: an RTX 30/40-series card's 99 KB, which
    keeps a pipelined shape), are refused."""
    from triton.runtime.errors import OutOfResources

    real = prefill_attention._prefill_attn_kernel
    refused = []

    class SmallGpu:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                if kw["BLOCK_M"] > 64 or kw["num_stages"] > max_stages:
                    refused.append((kw["BLOCK_M"], kw["num_stages"]))
                    raise OutOfResources(200_000, 101_376, "shared memory")
                return real[grid](*args, **kw)

            return launch

    monkeypatch.setattr(prefill_attention, "_prefill_attn_kernel", SmallGpu())
    hq, hkv, d = 12, 2, 128
    dt = kernel_dtype(device)
    g = torch.Generator().manual_seed(7)
    k = torch.randn(hkv, 640, d, generator=g).to(device, dt)
    v = torch.randn(hkv, 640, d, generator=g).to(device, dt)
    attn = prefill_attention.PrefillAttention(hq, hkv, d, device, max_tokens=512)
    start_t = torch.tensor([40], device=device, dtype=torch.int32)
    for t in (300, 20):  # a long prefill (one pass) and a short one (key splits)
        q = torch.randn(t, hq, d, generator=g).to(device, dt)
        ref = reference.prefill_attention(q, k, v, 40, 1 / math.sqrt(d))
        torch.testing.assert_close(attn(q, k, v, start_t, 1 / math.sqrt(d)), ref, **tolerance(device))
    assert attn.working == {attn._tuned(t): expected for t in (300, 20)}
    before = len(refused)
    attn(torch.randn(300, hq, d, generator=g).to(device, dt), k, v, start_t, 0.1)
    assert len(refused) == before  # remembered: the refused shape is not tried again
