"""The decode step's attention (kernels.decode_attention): split-K flash decoding against the plain PyTorch
reference (kernels.reference) at every shape the warm-up may pick, its split counts, its candidates per GPU, and
its fallbacks where a GPU's shared memory is short. On a CPU-only machine the kernels run in Triton's
interpreter."""

import dataclasses
import math

import pytest
import torch
from kernel_checks import SHAPES, kernel_dtype, tolerance

from model_loader.kernels import decode_attention, features, reference


# 66 splits (132 SMs / 2 KV heads) of chunks aligned to 1 token: 2,500 tokens -> 38-token chunks, 3 loop steps of
# 16 with the last one partly masked, and the last split shorter than the rest. With the first tile read early,
# a split whose first tile holds the current token must read that tile again (the early read leaves its row
# out): at 1, 48, 128 and 200 tokens, where 48 and 128 put the current token in a tile's last row (for these
# 16-token tiles, for the candidates' 32- and 128-token ones too).
# whole_tiles: the early tile takes each split's part tile (38-token chunks of 16-token tiles: 6 tokens, then two
# whole tiles), and 16-bit models take exp2; without the early tile (GPUs without PDL), exp2 alone: the same
# kernel as the plain one for fp32 (IEEE), so only the 16-bit test below runs it.
ODD_SPLITS = (
    decode_attention.DecodeAttnConfig(66, 16, 16, 4, 2, chunk_align=1),
    decode_attention.DecodeAttnConfig(66, 16, 16, 4, 2, chunk_align=1, early_tile=True),
    decode_attention.DecodeAttnConfig(66, 16, 16, 4, 2, chunk_align=1, early_tile=True, whole_tiles=True),
)
EXP2_ONLY = (decode_attention.DecodeAttnConfig(66, 16, 16, 4, 2, chunk_align=1, whole_tiles=True),)


@pytest.mark.parametrize("hq,hkv,d,hidden", SHAPES)
@pytest.mark.parametrize("length", [1, 48, 128, 200, 2500])
@pytest.mark.parametrize("config", decode_attention.DECODE_ATTN_CONFIGS + ODD_SPLITS, ids=str)
def test_decode_attention_matches_reference(device, hq, hkv, d, hidden, length, config):
    """Every kernel shape the warm-up may pick, at depths that use one split, a few, and many (2,500 tokens:
    20-66 splits), with the depth read from pos_t as in a captured graph; and splits whose tokens are not a
    multiple of the loop step (their last step masked)."""
    dt = kernel_dtype(device)
    g = torch.Generator().manual_seed(2)
    max_ctx = 2560
    k = torch.randn(hkv, max_ctx, d, generator=g).to(device, dt)
    v = torch.randn(hkv, max_ctx, d, generator=g).to(device, dt)
    q = torch.randn(hq, d, generator=g).to(device, dt)
    pos_t = torch.tensor([length - 1], device=device, dtype=torch.int32)
    scale = 1 / math.sqrt(d)
    ref = reference.decode_attention(q, k, v, pos_t, length, scale)
    attn = decode_attention.DecodeAttention(
        hq, hkv, d, device, dt, configs=decode_attention.DECODE_ATTN_CONFIGS + ODD_SPLITS
    )
    attn.mid_lse.fill_(float("nan"))  # splits the reduce must not read hold garbage
    attn.mid_o.fill_(float("nan"))
    out = attn(q, k, v, pos_t, length, scale, config=config)
    torch.testing.assert_close(out, ref, **tolerance(device))
    # Garbage past the length must not leak in.
    k[:, length:] = 1e4
    v[:, length:] = 1e4
    torch.testing.assert_close(attn(q, k, v, pos_t, length, scale, config=config), ref, **tolerance(device))


@pytest.mark.parametrize("length", [1, 48, 128, 200, 2500])
@pytest.mark.parametrize("config", decode_attention.DECODE_ATTN_CONFIGS + ODD_SPLITS + EXP2_ONLY, ids=str)
def test_decode_attention_of_16_bit_inputs_matches_reference(device, length, config):
    """The model's own 16-bit K/V and query (fp16; bf16 on a GPU too), which Triton's interpreter also runs,
    against the reference in fp32, at the 1.5B's shape: the other decode tests run fp32 on the CPU. NaN past
    the depth (what an earlier reply that overflowed may leave) must not leak into any tile, masked or not: at
    2,500 tokens the 66 splits of 16-token tiles have 38-token chunks, whose last tile is partly past the
    split's end."""
    hq, hkv, d = 12, 2, 128  # the 1.5B's attention
    g = torch.Generator().manual_seed(7)
    max_ctx = 2560
    for dt in [torch.float16] + ([torch.bfloat16] if device == "cuda" else []):
        k = torch.randn(hkv, max_ctx, d, generator=g).to(device, dt)
        v = torch.randn(hkv, max_ctx, d, generator=g).to(device, dt)
        q = torch.randn(hq, d, generator=g).to(device, dt)
        pos_t = torch.tensor([length - 1], device=device, dtype=torch.int32)
        scale = 1 / math.sqrt(d)
        ref = reference.decode_attention(q.float(), k.float(), v.float(), pos_t, length, scale)
        k[:, length:] = float("nan")
        v[:, length:] = float("nan")
        attn = decode_attention.DecodeAttention(
            hq, hkv, d, device, dt, configs=decode_attention.DECODE_ATTN_CONFIGS + ODD_SPLITS + EXP2_ONLY
        )
        out = attn(q, k, v, pos_t, length, scale, config=config)
        assert out.dtype == dt
        torch.testing.assert_close(out.float(), ref, atol=2e-3 if dt == torch.float16 else 1.6e-2, rtol=1e-2)


def test_decode_attention_split_count_follows_the_depth():
    """Short contexts use few splits (no reduce over empty ones), long ones all of them."""
    c = decode_attention.DecodeAttnConfig(max_splits=64, min_chunk=64, block_n=32)
    assert decode_attention.decode_splits(c, 1) == 1
    assert decode_attention.decode_splits(c, 512) == 8
    assert decode_attention.decode_splits(c, 4096) == 64
    assert decode_attention.decode_splits(c, 32768) == 64
    # Chunks rounded to the 128-token loop step leave 2 of 66 splits idle at 32,768 tokens; 1-token alignment
    # uses all 66 (65 x 497 + 463).
    sm_fill = decode_attention.DecodeAttnConfig(max_splits=66, min_chunk=128, block_n=128)
    assert decode_attention.decode_splits(sm_fill, 32768) == 64
    assert decode_attention.decode_splits(dataclasses.replace(sm_fill, chunk_align=1), 32768) == 66
    assert decode_attention.decode_splits(dataclasses.replace(sm_fill, chunk_align=1), 4096) == 32  # min_chunk holds


def test_a_split_per_sm_resolves_to_the_gpus_sm_count(monkeypatch):
    """SM_SPLITS becomes SMs / KV heads on a GPU (rounded down: no second wave of a few programs), a fixed 32 in
    the interpreter, and the split scratch is sized for it."""
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: SimpleNamespace(multi_processor_count=132))
    assert decode_attention.sm_splits("cuda", 2) == 66
    assert decode_attention.sm_splits("cuda", 4) == 33
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: SimpleNamespace(multi_processor_count=114))
    assert decode_attention.sm_splits("cuda:0", 4) == 28
    assert decode_attention.sm_splits("cuda:0", 8) == 14
    assert decode_attention.sm_splits("cpu", 2) == 32
    attn = decode_attention.DecodeAttention(12, 2, 128, "cpu", torch.bfloat16)
    per_sm = [c for c in decode_attention.DECODE_ATTN_CONFIGS if c.max_splits == decode_attention.SM_SPLITS]
    assert per_sm and all(attn.resolve(c).max_splits == 32 for c in per_sm)
    assert attn.mid_o.shape[1] == max(32, *(c.max_splits for c in decode_attention.DECODE_ATTN_CONFIGS))


def test_without_programmatic_dependent_launch_the_candidates_are_the_plain_kernels():
    """late_launch and early_tile only matter with programmatic dependent launch (Hopper); elsewhere (the
    interpreter here, an RTX 30xx/40xx) the warm-up times and compiles the plain kernels, fewer and faster to
    compile."""
    assert not features.pdl_supported(torch.device("cpu"))
    plain = decode_attention.decode_attention_candidates(torch.device("cpu"))
    assert plain and not any(c.late_launch or c.early_tile for c in plain)
    # one plain kernel per shape: the split-per-SM candidate (late launch on Hopper) is not dropped
    shapes = {(c.max_splits, c.block_n, c.min_chunk, c.chunk_align) for c in decode_attention.DECODE_ATTN_CONFIGS}
    assert {(c.max_splits, c.block_n, c.min_chunk, c.chunk_align) for c in plain} == shapes
    assert len(plain) == len(shapes)


def test_a_4bit_model_is_not_tuned_on_the_shape_that_never_wins_for_it(monkeypatch):
    monkeypatch.setattr(decode_attention, "pdl_supported", lambda device: True)
    dense = decode_attention.decode_attention_candidates(torch.device("cpu"))
    int4 = decode_attention.decode_attention_candidates(torch.device("cpu"), int4=True)
    assert dense == decode_attention.DECODE_ATTN_CONFIGS
    assert int4 == tuple(c for c in dense if c not in decode_attention.NOT_FOR_INT4) and len(int4) == len(dense) - 1


@pytest.mark.parametrize("pdl", [False, True])
def test_an_8bit_cache_is_also_tuned_on_its_own_shapes(monkeypatch, tiny_model, device, pdl):
    """The 8-bit cache's extra candidates (more warps, or two programs an SM, for its conversion-heavy tile) are
    timed at its warm-up and compiled ahead with the others, 4-bit models too; a 16-bit cache never sees them. The
    last candidate, the split-per-SM shape that the prefill's last row runs, is the same either way. The model's
    split scratch holds the most splits any of them uses (two an SM: twice the SM splits)."""
    from model_loader.engine import Engine

    for module in (features, decode_attention):  # the candidates, and the launches of the engines below
        monkeypatch.setattr(module, "pdl_supported", lambda device: pdl)
    cpu = torch.device("cpu")
    for int4 in (False, True):
        plain = decode_attention.decode_attention_candidates(cpu, int4)
        kv8 = decode_attention.decode_attention_candidates(cpu, int4, kv8=True)
        extra = [c for c in kv8 if c not in plain]
        assert len(extra) == len(decode_attention.KV8_CONFIGS)
        assert all(c.num_warps == 8 or c.splits_per_sm == 2 for c in extra)
        # 4-bit models' GEMVs request their weights early: their split-per-SM shapes launch late (NOT_FOR_INT4)
        assert all(c.late_launch == (pdl and int4) for c in extra)
        assert [c for c in kv8 if c in plain] == list(plain) and kv8[-1] == plain[-1]
        assert len(set(kv8)) == len(kv8)
    # the engine on the GPU where there is one: on a CUDA machine a CPU engine runs the reference ops, not Triton's
    for kv_cache, wanted in (("16-bit", False), ("8-bit", True)):
        engine = Engine.load(tiny_model, device=device, use_triton=True, kv_cache=kv_cache)
        assert engine.model.decode_attention_candidates() == decode_attention.decode_attention_candidates(
            engine.model.device, kv8=wanted
        )
        attn = engine.model.decode_attention
        assert attn.max_splits == max(attn.resolve(c).max_splits for c in engine.model.decode_attention_candidates())
        assert attn.max_splits == attn.sm_splits * (2 if wanted else 1)
        engine.close()


def _small_gpu_decode_kernel(monkeypatch, refuse):
    """Simulates a GPU with less shared memory than the H200: launches of the decode split kernel whose
    keywords `refuse` says no to raise OutOfResources, as Triton's launcher does (before anything runs)."""
    from triton.runtime.errors import OutOfResources

    real = decode_attention._decode_attn_split_kernel
    refused = []

    class SmallGpu:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                if refuse(kw):
                    refused.append((kw["BLOCK_N"], kw["num_stages"]))
                    raise OutOfResources(139_520, 101_376, "shared memory")
                return real[grid](*args, **kw)

            return launch

    monkeypatch.setattr(decode_attention, "_decode_attn_split_kernel", SmallGpu())
    return refused


@pytest.mark.parametrize("fp32", [False, True])
def test_decode_attention_falls_back_where_shared_memory_is_short(device, monkeypatch, fp32):
    """The split-per-SM shape's 3 stages of 128-token tiles need 139,520 bytes of shared memory (Triton 3.6):
    more than an RTX 30/40-series card's 99 KB, so there Triton refuses the launch, and the decode step and the
    prefill's last-row attention (which always takes that shape) must run the next smaller shape instead, with
    the same result, remembered so the refused one is not tried again. 16-bit: 2 stages fit; fp32 models need
    64-token tiles (simulated: 2 stages of 128 refused too)."""
    if fp32:
        refused = _small_gpu_decode_kernel(monkeypatch, lambda kw: kw["num_stages"] > 2 or kw["BLOCK_N"] > 64)
    else:
        refused = _small_gpu_decode_kernel(monkeypatch, lambda kw: kw["num_stages"] > 2)
    hq, hkv, d, length = 12, 2, 128, 700
    dt = torch.float32 if fp32 else (torch.bfloat16 if device == "cuda" else torch.float16)
    g = torch.Generator().manual_seed(8)
    k = torch.randn(hkv, 768, d, generator=g).to(device, dt)
    v = torch.randn(hkv, 768, d, generator=g).to(device, dt)
    q = torch.randn(hq, d, generator=g).to(device, dt)
    pos_t = torch.tensor([length - 1], device=device, dtype=torch.int32)
    config = decode_attention.DECODE_ATTN_CONFIGS[1]  # a split per SM, 3 stages
    attn = decode_attention.DecodeAttention(hq, hkv, d, device, dt)
    ref = reference.decode_attention(q.float(), k.float(), v.float(), pos_t, length, 1 / math.sqrt(d))
    out = attn(q, k, v, pos_t, length, 1 / math.sqrt(d), config=config)
    torch.testing.assert_close(
        out.float(), ref, atol=2e-2 if dt != torch.float32 else 1e-5, rtol=2e-2 if dt != torch.float32 else 1e-5
    )
    ran = attn.working[attn.resolve(config)]
    assert (ran.block_n, ran.num_stages) == ((64, 2) if fp32 else (128, 2))
    before = len(refused)
    attn(q, k, v, pos_t, length, 1 / math.sqrt(d), config=config)
    assert len(refused) == before  # remembered


def test_a_prefill_on_a_gpu_short_of_shared_memory_runs_its_last_row_through_a_fallback(tiny_model, monkeypatch):
    """The prefill's last layer attends for its last row through the decode attention's split-per-SM shape
    (Qwen2Model._row_attention), whatever the GPU: where that shape does not fit, the prefill must still give
    the logits it gives where it does."""
    from model_loader.engine import Engine

    on_gpu = torch.cuda.is_available()
    engine = Engine.load(
        tiny_model, device="cuda" if on_gpu else "cpu", use_triton=True, dtype="fp32", context_length=256
    )
    try:
        ids = torch.tensor(
            engine.chat.render([{"role": "user", "content": "Hello there"}]).ids, device=engine.model.device
        )
        expected = engine.model.prefill(ids, 0)
        refused = _small_gpu_decode_kernel(monkeypatch, lambda kw: kw["num_stages"] > 2 or kw["BLOCK_N"] > 64)
        engine.model.decode_attention.working.clear()
        torch.testing.assert_close(engine.model.prefill(ids, 0), expected, atol=1e-4, rtol=1e-4)
        assert refused and all(stages > 2 or block > 64 for block, stages in refused)
    finally:
        engine.close()


def test_decode_attention_leaves_out_the_shapes_a_gpu_refuses_for_certain():
    """Where a shape's pipelined K/V tiles and its query tile alone exceed the GPU's shared memory
    (decode_pipeline_bytes), it is neither tried nor compiled ahead: on a 99 KB card the split-per-SM shape starts
    at its 2 stages (16-bit, and a row-major 8-bit cache, whose tiles are upcast through shared memory; not one
    with V transposed, whose tiles take a byte a value there); an fp32 model
    starts at 1 stage (and may still be refused there: Triton's own buffers come on top); a Turing card (64 KB,
    nothing pipelined) starts at the 64-token tiles; a GPU with room for it (the H200) or a device that doesn't
    say keeps the whole chain."""
    hq, hkv, d = 12, 2, 128
    attn = decode_attention.DecodeAttention(hq, hkv, d, "cpu", torch.bfloat16)
    config = attn.resolve(decode_attention.DECODE_ATTN_CONFIGS[1])  # a split per SM, 3 stages of 128-token tiles
    full = [config, *decode_attention.decode_attention_fallbacks(config)]
    assert attn.shared_limit is None and attn.candidates(config, 2) == full
    attn.shared_limit = 232_448  # the H200's
    assert attn.candidates(config, 2) == full
    attn.shared_limit = 101_376  # an RTX 30/40/50-series card's
    assert [(c.block_n, c.num_stages) for c in attn.candidates(config, 2)] == [(128, 2), (128, 1), (64, 2), (32, 2)]
    # an 8-bit cache with V transposed (the model's): its fp8 tiles reach the dots as they are, so its 3 stages
    # are tried (73,728 bytes at sm_90); a row-major 8-bit cache's pass through shared memory as fp16 (2 bytes)
    assert attn.candidates(config, 1) == full
    assert [(c.block_n, c.num_stages) for c in attn.candidates(config, 4)] == [(128, 1), (64, 2), (32, 2)]  # fp32
    attn.shared_limit = 5_000  # a single stage buffers no K/V tile: only the query tile (4,096 bytes) counts
    assert [(c.block_n, c.num_stages) for c in attn.candidates(config, 2)] == [(128, 1)]
    attn.shared_limit = 1_000  # nothing fits for certain: the last fallback is still tried
    assert [(c.block_n, c.num_stages) for c in attn.candidates(config, 2)] == [(32, 2)]
    attn.shared_limit, attn.pipelined = 65_536, False  # a Turing card: no asynchronous copies, stages hold nothing
    # one 128 x 128 K and V tile and the query tile: 69,632 bytes at the least, at any stage count: none is tried
    assert [(c.block_n, c.num_stages) for c in attn.candidates(config, 2)] == [(64, 2), (32, 2)]
    assert [(c.block_n, c.num_stages) for c in attn.candidates(config, 4)] == [(32, 2)]  # fp32


def test_decode_attention_on_a_99kb_gpu_runs_its_first_plausible_shape(device, monkeypatch):
    """The whole call on such a GPU (its limit as DecodeAttention reads it, Triton refusing what needs more than
    73,984 bytes as there): the result is the reference's, the shape that ran is the 2-stage one, and nothing was
    launched to be refused first."""
    refused = _small_gpu_decode_kernel(monkeypatch, lambda kw: kw["num_stages"] > 2)
    hq, hkv, d, length = 12, 2, 128, 300
    g = torch.Generator().manual_seed(11)
    k, v = (torch.randn(hkv, 320, d, generator=g).to(device, torch.float16) for _ in range(2))
    q = torch.randn(hq, d, generator=g).to(device, torch.float16)
    pos_t = torch.tensor([length - 1], device=device, dtype=torch.int32)
    attn = decode_attention.DecodeAttention(hq, hkv, d, device, torch.float16)
    attn.shared_limit = 101_376
    config = decode_attention.DECODE_ATTN_CONFIGS[1]
    out = attn(q, k, v, pos_t, length, 1 / math.sqrt(d), config=config)
    ref = reference.decode_attention(q.float(), k.float(), v.float(), pos_t, length, 1 / math.sqrt(d))
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    ran = attn.working[attn.resolve(config)]
    assert (ran.block_n, ran.num_stages) == (128, 2) and refused == []
