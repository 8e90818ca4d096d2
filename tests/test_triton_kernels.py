"""The fused Triton kernels against the plain PyTorch reference (kernels.reference), at the shapes that matter:
the tiny test model's and the real 1.5B's. On a CPU-only machine they run in Triton's interpreter."""

import dataclasses
import math

import pytest
import torch

from model_loader.kernels import reference

from model_loader.kernels import (  # noqa: E402  (triton is a test dependency)
    decode_attention,
    features,
    gemv,
    prefill_attention,
    small_ops,
)

SHAPES = [  # (Hq, Hkv, D, hidden)
    (4, 2, 16, 64),  # tiny test model
    (12, 2, 128, 1536),  # DeepSeek-R1-Distill-Qwen-1.5B
]


def _dtype(device):
    return torch.bfloat16 if device == "cuda" else torch.float32


def _tol(device):
    return dict(atol=2e-2, rtol=2e-2) if device == "cuda" else dict(atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("has_res", [False, True])
@pytest.mark.parametrize("hidden", [64, 1536])
def test_add_rms_norm_matches_reference(device, has_res, hidden):
    g = torch.Generator().manual_seed(0)
    dt = _dtype(device)
    x = torch.randn(3, hidden, generator=g).to(device, dt)
    res = torch.randn(3, hidden, generator=g).to(device, dt) if has_res else None
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(device, dt)
    ref_out, ref_res = reference.add_rms_norm(x, None if res is None else res.clone(), w, 1e-6)
    out, new_res = small_ops.add_rms_norm(x, None if res is None else res.clone(), w, 1e-6)
    torch.testing.assert_close(new_res, ref_res, **_tol(device))
    torch.testing.assert_close(out, ref_out, **_tol(device))


def test_rms_norm_matches_reference(device):
    x = torch.randn(5, 64).to(device, _dtype(device))
    w = torch.rand(64).to(device, _dtype(device))
    torch.testing.assert_close(small_ops.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6), **_tol(device))


def test_silu_mul_matches_reference(device):
    x = torch.randn(3, 2 * 1500).to(device, _dtype(device))  # not a multiple of the block: masked tail
    torch.testing.assert_close(small_ops.silu_mul(x), reference.silu_mul(x), **_tol(device))


def test_silu_mul_reads_rows_stored_in_gate_up_pairs(device):
    """A paired gate/up weight (linears.pair_gate_up_rows) makes a prefill's GEMM output (gate 0, up 0, gate 1,
    ...): silu_mul(paired=True) gives what the reference makes of [gate | up]."""
    from model_loader.linears import pair_gate_up_rows

    x = torch.randn(3, 2 * 1500, generator=torch.Generator().manual_seed(4)).to(device, _dtype(device))
    paired = x.t().contiguous()  # pair the columns the way pair_gate_up_rows pairs a weight's rows
    pair_gate_up_rows(paired)
    paired = paired.t().contiguous()
    assert torch.equal(paired[:, 0::2], x[:, :1500]) and torch.equal(paired[:, 1::2], x[:, 1500:])
    torch.testing.assert_close(small_ops.silu_mul(paired, paired=True), small_ops.silu_mul(x), atol=0, rtol=0)
    torch.testing.assert_close(small_ops.silu_mul(paired, paired=True), reference.silu_mul(x), **_tol(device))


def _rope_inputs(device, hq, hkv, d, t, seed, max_ctx=32):
    """qkv, bias, cos, sin and four empty caches (two for the reference, two for the kernel)."""
    dt = _dtype(device)
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
    torch.testing.assert_close(q, q_ref, **_tol(device))
    torch.testing.assert_close(caches[2], caches[0], **_tol(device))
    torch.testing.assert_close(caches[3], caches[1], **_tol(device))


@pytest.mark.parametrize("hq,hkv,d,hidden", SHAPES)
@pytest.mark.parametrize("start,t", [(0, 5), (7, 1), (3, 21)])
def test_rope_bias_cache_matches_reference(device, hq, hkv, d, hidden, start, t):
    qkv, bias, cos, sin, caches = _rope_inputs(device, hq, hkv, d, t, seed=1)
    pos_t = torch.tensor([start], device=device, dtype=torch.int32)
    _rope_kernel_matches_reference(qkv, bias, cos, sin, caches, pos_t, start, start, hq, hkv, device)
    assert caches[2][:, start + t :].abs().sum() == 0  # nothing written past the new tokens


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
    dt = _dtype(device)
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
    torch.testing.assert_close(out, ref, **_tol(device))
    # Garbage past the length must not leak in.
    k[:, length:] = 1e4
    v[:, length:] = 1e4
    torch.testing.assert_close(attn(q, k, v, pos_t, length, scale, config=config), ref, **_tol(device))


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


@pytest.mark.parametrize("early", [0, 3])
@pytest.mark.parametrize("n,k", [(24, 64), (64, 128), (40, 1536)])
@pytest.mark.parametrize("config", gemv.GEMV_CONFIGS)
def test_single_token_gemv_matches_linear(device, n, k, config, early, monkeypatch):
    """Each config, with its weights streamed in the loop or the first chunks requested before the input is
    (1,536 columns: all of them in chunks of 512, half in chunks of 256 with the loop doing the rest)."""
    monkeypatch.setattr(gemv, "GEMV_EARLY_CHUNKS", early)
    dt = _dtype(device)
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
    dt = _dtype(device)
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

    dt = _dtype(device)
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


def test_triton_self_check_passes_where_triton_runs_and_fails_cleanly_where_it_cannot(device, monkeypatch):
    from model_loader.kernels import triton_problem, triton_works

    assert triton_works(device)  # GPU, or the interpreter on a CPU machine
    # a Triton that cannot build its launcher (no C compiler, no Python headers) raises at first launch
    no_compiler = RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")
    monkeypatch.setattr(small_ops, "rms_norm", lambda *a: (_ for _ in ()).throw(no_compiler))
    assert not triton_works(device)
    problem = triton_problem(device)  # what the live panel tells the user: why, and what to do
    assert "Failed to find C compiler" in problem and "Install a C compiler" in problem


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
    dt = _dtype(device)
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
    torch.testing.assert_close(attn(q, k, v, start_t, scale, splits=splits), ref, **_tol(device))


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


def test_tensor_descriptors_only_where_tma_runs(monkeypatch):
    """The prefill attention's TMA path needs a GPU of compute capability 9 or newer and a compiled kernel (not
    the interpreter); R1DESK_NO_TMA=1 turns it off."""
    monkeypatch.setattr(features, "_TMA_OK", {})
    assert not features.prefill_tma_supported("cpu")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert features.prefill_tma_supported("cuda:0")
    monkeypatch.setattr(features, "_TMA_OK", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    assert not features.prefill_tma_supported("cuda:0")  # RTX 40: no TMA
    monkeypatch.setattr(features, "_TMA_OK", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setenv("R1DESK_NO_TMA", "1")
    assert not features.prefill_tma_supported("cuda:0")


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
    dt = _dtype(device)
    g = torch.Generator().manual_seed(7)
    k = torch.randn(hkv, 640, d, generator=g).to(device, dt)
    v = torch.randn(hkv, 640, d, generator=g).to(device, dt)
    attn = prefill_attention.PrefillAttention(hq, hkv, d, device, max_tokens=512)
    start_t = torch.tensor([40], device=device, dtype=torch.int32)
    for t in (300, 20):  # a long prefill (one pass) and a short one (key splits)
        q = torch.randn(t, hq, d, generator=g).to(device, dt)
        ref = reference.prefill_attention(q, k, v, 40, 1 / math.sqrt(d))
        torch.testing.assert_close(attn(q, k, v, start_t, 1 / math.sqrt(d)), ref, **_tol(device))
    assert attn.working == {attn._tuned(t): expected for t in (300, 20)}
    before = len(refused)
    attn(torch.randn(300, hq, d, generator=g).to(device, dt), k, v, start_t, 0.1)
    assert len(refused) == before  # remembered: the refused shape is not tried again


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


def test_warm_up_picks_each_depth_buckets_attention_by_timing_the_whole_step(tiny_model, device):
    """On a GPU the warm-up times one captured decode step per attention configuration at the top of each depth
    bucket and keeps the fastest per bucket (DecodeStep.tune): every bucket gets the configuration with the least
    time it measured, and only the chosen configurations keep graphs, for both sampling modes. The replies
    across a bucket boundary are the same as without graphs. Without graphs (the CPU) nothing is tuned."""
    from model_loader.engine import Engine
    from model_loader.events import SamplingSettings

    engine = Engine.load(tiny_model, device=device, use_triton=True, context_length=1100)
    engine.warm_up()
    if device != "cuda":
        assert engine.info.decode_attention == {} and not engine.step.graphs
        return
    buckets = decode_attention.depth_buckets(engine.model.max_ctx)
    assert buckets == [1024, 1100]
    assert list(engine.info.decode_attention) == [f"<={b}" for b in buckets]
    timings = engine.step.tuned_us
    for upper, config in engine.step.plan:
        assert timings[upper][str(config)] == min(timings[upper].values())
        assert set(timings[upper]) == {str(c) for c in decode_attention.decode_attention_candidates(device)}
    chosen = {config for _, config in engine.step.plan}
    assert set(engine.step.graphs) == {(mode, c) for mode in ("greedy", "sample") for c in chosen}
    # a reply that crosses from one bucket's graph into the other's (forced to differ) gives the same text as
    # the same steps without graphs
    step = engine.step
    step.plan = [(1024, decode_attention.DECODE_ATTN_CONFIGS[0]), (1100, decode_attention.DECODE_ATTN_CONFIGS[1])]
    step.graphs.clear()
    step.capture("greedy")  # its steps write into the cache: nothing cached counts
    engine.reset_cache()
    reps = 300
    while len(engine.chat.render([{"role": "user", "content": "Count slowly " * reps}]).ids) < 990:
        reps += 10
    prompt = [{"role": "user", "content": "Count slowly " * reps}]
    n_prompt = len(engine.chat.render(prompt).ids)
    settings = SamplingSettings(temperature=0, max_new_tokens=60, ignore_eos=True)
    assert n_prompt < 1024 < n_prompt + settings.max_new_tokens <= engine.model.max_ctx
    graphed = list(engine.generate(prompt, settings))
    step.graphs.clear()
    step.use_graphs = False
    engine.reset_cache()
    eager = list(engine.generate(prompt, settings))
    text = lambda events: "".join(getattr(e, "text", "") for e in events)  # noqa: E731
    assert text(graphed) == text(eager) and text(graphed)


def test_dense_warm_up_compiles_and_times_the_same_gemv_candidates_per_use(monkeypatch):
    """The dense single-token uses as the decode step makes them: on the Triton path the gate/up weight's rows are
    stored in pairs and its GEMV outputs SiLU(gate) * up, so its candidates are GEMV_SILU_CONFIGS with that
    output; a weight of >= GEMV_SPLIT_MIN_K inputs (the down projection) also tries the K splits. The pass that
    compiles ahead (Linears.call_every_candidate) and the tuning that times them must agree use by use (a config
    the tuning times but nobody compiled ahead compiles on the warm-up's own thread on a first start)."""
    from model_loader.linears import Linears

    big_k = gemv.GEMV_SPLIT_MIN_K
    gate_up = torch.randn(2 * 24, 64)
    weights = {
        "layers": [
            {
                "qkv_w": torch.randn(48, 64),
                "o_w": torch.randn(64, 32),
                "gate_up_w": gate_up.clone(),
                "down_w": torch.randn(64, big_k),
            }
        ]
    }
    linears = Linears(weights, "cpu", torch.float32)
    linears.pair_dense_gate_up(weights)
    assert linears.dense_gate_up_pairs
    assert torch.equal(weights["layers"][0]["gate_up_w"][0::2], gate_up[:24])
    compiled, timed = [], []
    monkeypatch.setattr(
        gemv,
        "gemv",
        lambda x, w, config, silu_output=False: compiled.append((tuple(w.shape), silu_output, config)),
    )
    linears.call_every_candidate(weights, torch.float32)
    expected = {
        ((48, 64), False): gemv.GEMV_CONFIGS,
        ((64, 32), False): gemv.GEMV_CONFIGS,
        ((48, 64), True): gemv.GEMV_SILU_CONFIGS,
        ((64, big_k), False): gemv.GEMV_CONFIGS + gemv.GEMV_SPLIT_CONFIGS,
    }
    assert {use: tuple(c for s, si, c in compiled if (s, si) == use) for use in expected} == expected
    monkeypatch.setattr(
        gemv,
        "time_configs",
        lambda ws, configs, call: timed.append((tuple(ws[0].shape), tuple(configs))) or {None: 1.0},
    )
    linears.tune(weights, torch.float32)
    assert sorted(timed) == sorted((shape, (None,) + configs) for (shape, _), configs in expected.items())


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
