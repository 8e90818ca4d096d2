"""The paged Triton kernels (model_loader.kernels.paged_ops) against the PyTorch path of paged_model, in
Triton's interpreter on the CPU (conftest) or on a GPU."""

import pytest
import torch

from model_loader.kernels import reference
from model_loader.kernels.paged_ops import PagedDecodeAttention, paged_rope_write

HQ, HKV, D = 4, 2, 16


def random_cache(slots: int, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(HKV, slots, D, generator=g).to(dtype), torch.randn(HKV, slots, D, generator=g).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size", [16, 64, 128])
def test_decode_attention_over_block_tables_matches_the_reference(device, dtype, block_size):
    """Sequences of different lengths (one shorter than a tile, some ending inside a block) whose blocks are
    scattered through the cache, attended at once: each equals plain attention over its own tokens."""
    blocks = 24
    k, v = (t.to(device) for t in random_cache(blocks * block_size, dtype))
    lengths = [1, 37, block_size * 3, block_size * 5 + 3]
    perm = torch.randperm(blocks, generator=torch.Generator().manual_seed(1)).tolist()
    tables, used = [], 0
    for n in lengths:
        need = -(-n // block_size)
        tables.append(perm[used : used + need])
        used += need
    width = max(len(t) for t in tables)
    table_t = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device)
    q = torch.randn(len(lengths), HQ, D, generator=torch.Generator().manual_seed(2)).to(dtype).to(device)
    attention = PagedDecodeAttention(HQ, HKV, D, block_size, max_batch=8, device=device, dtype=dtype)
    out = attention(q, k, v, table_t, torch.tensor(lengths, dtype=torch.int32, device=device), D**-0.5)
    for i, n in enumerate(lengths):
        slots = torch.tensor([b * block_size + o for b in tables[i] for o in range(block_size)][:n], device=device)
        want = reference.decode_attention(q[i], k[:, slots], v[:, slots], None, n, D**-0.5)
        tol = 1e-5 if dtype == torch.float32 else 2e-3
        torch.testing.assert_close(out[i].float(), want.float(), atol=tol, rtol=tol)


def test_rope_write_puts_each_row_at_its_own_position_and_slot(device):
    """Rows at scattered positions written to scattered slots equal the reference cache writer's rows written
    one at a time; a row with slot -1 (a padded row) writes nothing."""
    g = torch.Generator().manual_seed(3)
    positions = [5, 0, 17, 9]
    slots = [40, 3, -1, 22]
    qkv = torch.randn(4, (HQ + 2 * HKV) * D, generator=g).to(device)
    bias = torch.randn((HQ + 2 * HKV) * D, generator=g).to(device)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    freqs = torch.outer(torch.arange(32).float(), inv)
    cos, sin = freqs.cos().to(device), freqs.sin().to(device)
    k = torch.zeros(HKV, 64, D, device=device)
    v = torch.zeros(HKV, 64, D, device=device)
    q = paged_rope_write(
        qkv, bias, cos, sin, k, v, torch.tensor(positions, device=device), torch.tensor(slots, device=device), HQ, HKV
    )
    written = torch.zeros(HKV, 64, D, dtype=torch.bool)
    for row, (pos, slot) in enumerate(zip(positions, slots)):
        kr, vr = torch.zeros(HKV, 32, D, device=device), torch.zeros(HKV, 32, D, device=device)
        want_q = reference.rope_bias_cache(qkv[row : row + 1], bias, cos, sin, kr, vr, None, pos, HQ, HKV)
        torch.testing.assert_close(q[row], want_q[0], atol=1e-5, rtol=1e-5)
        if slot >= 0:
            torch.testing.assert_close(k[:, slot], kr[:, pos], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(v[:, slot], vr[:, pos], atol=1e-5, rtol=1e-5)
            written[:, slot] = True
    assert not k.cpu()[~written].any() and not v.cpu()[~written].any()


def test_decode_attention_over_an_8bit_cache_matches_the_reference(device):
    """fp8 rows with a scale each (kv_cache.py): the kernel applies each row's K scale to its score and V scale to
    its weight, which equals plain attention over the dequantized rows."""
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("Triton has e4m3 on compute capability 8.9 and newer only")
    block_size, blocks = 16, 12
    k16, v16 = random_cache(blocks * block_size, torch.float32, seed=4)
    (k, ks), (v, vs) = (reference.quantize_fp8_rows(t) for t in (k16, v16))
    k, ks, v, vs = (t.to(device) for t in (k, ks, v, vs))
    lengths, tables = [5, 40], [[7, 2, 9], [0, 11, 3]]
    table_t = torch.tensor(tables, dtype=torch.int32, device=device)
    q = torch.randn(2, HQ, D, generator=torch.Generator().manual_seed(5)).to(device)
    attention = PagedDecodeAttention(HQ, HKV, D, block_size, max_batch=4, device=device, dtype=torch.float32)
    lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    out = attention(q, k, v, table_t, lens, D**-0.5, scales=(ks, vs))
    for i, n in enumerate(lengths):
        slots = torch.tensor([b * block_size + o for b in tables[i] for o in range(block_size)][:n], device=device)
        want = reference.decode_attention(
            q[i], k[:, slots], v[:, slots], None, n, D**-0.5, (ks[:, slots], vs[:, slots])
        )
        torch.testing.assert_close(out[i], want, atol=1e-5, rtol=1e-5)


def test_rope_write_into_an_8bit_cache_quantizes_each_row_as_the_reference(device):
    """The paged writer's fp8 rows and scales equal reference.quantize_fp8_rows of the rows the 16-bit writer
    stores, at each row's own slot."""
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("Triton has e4m3 on compute capability 8.9 and newer only")
    g = torch.Generator().manual_seed(6)
    positions, slots = [3, 11], [9, 30]
    qkv = torch.randn(2, (HQ + 2 * HKV) * D, generator=g).to(device)
    bias = torch.randn((HQ + 2 * HKV) * D, generator=g).to(device)
    freqs = torch.outer(torch.arange(32).float(), 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D)))
    cos, sin = freqs.cos().to(device), freqs.sin().to(device)
    pos_t, slot_t = torch.tensor(positions, device=device), torch.tensor(slots, device=device)
    k16, v16 = torch.zeros(HKV, 32, D, device=device), torch.zeros(HKV, 32, D, device=device)
    paged_rope_write(qkv, bias, cos, sin, k16, v16, pos_t, slot_t, HQ, HKV)
    k8 = torch.zeros(HKV, 32, D, device=device, dtype=torch.float8_e4m3fn)
    v8 = torch.zeros_like(k8)
    ks, vs = torch.zeros(HKV, 32, device=device), torch.zeros(HKV, 32, device=device)
    paged_rope_write(qkv, bias, cos, sin, k8, v8, pos_t, slot_t, HQ, HKV, scales=(ks, vs))
    for rows16, rows8, scale in ((k16, k8, ks), (v16, v8, vs)):
        data, row_scale = reference.quantize_fp8_rows(rows16[:, slots].cpu())
        assert torch.equal(rows8[:, slots].cpu().view(torch.uint8), data.view(torch.uint8))
        torch.testing.assert_close(scale[:, slots].cpu(), row_scale, atol=0, rtol=1e-6)
