"""The 8-bit KV cache (model_loader.kv_cache): fp8 e4m3 rows with a per-row fp32 scale, written by the RoPE/cache
kernel and read by the decode and prefill attention kernels, against the PyTorch reference; the engine on it; what
it costs in memory. On a CPU-only machine the kernels run in Triton's interpreter (16-bit inputs there are fp16
or fp32; bf16 on a GPU)."""

import math

import pytest
import torch

from model_loader.kernels import decode_attention, prefill_attention, reference, small_ops
from model_loader.kv_cache import KV_8BIT, KV_16BIT, check_kv_cache, value_cache

SHAPES = [(4, 2, 16), (12, 2, 128)]  # (Hq, Hkv, D): the tiny test model's, the 1.5B's


def _dtype(device):
    return torch.bfloat16 if device == "cuda" else torch.float32


def _quantized_cache(hkv, max_ctx, d, seed, device, length=None):
    """Random K/V rows quantized by the reference; rows from `length` on hold NaN codes and NaN scales (what a
    reply that overflowed might leave) unless length is None."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(hkv, max_ctx, d, generator=g) * 4 + 2  # an offset and a spread like K's biased channels
    k[..., 3] *= 20  # an outlier channel
    v = torch.randn(hkv, max_ctx, d, generator=g) * 0.3
    (k8, ks), (v8, vs) = reference.quantize_fp8_rows(k), reference.quantize_fp8_rows(v)
    if length is not None:
        for codes, scale in ((k8, ks), (v8, vs)):
            codes.view(torch.uint8)[:, length:] = 0x7F  # e4m3fn's NaN
            scale[:, length:] = float("nan")
    return [t.to(device) for t in (k8, v8, ks, vs)]


def _in_layout(v8, transposed: bool, junk_from=None):
    """The value cache v8 [Hkv, max_ctx, D] as the model holds it: row-major, or (transposed) a view of
    [Hkv, D, rows] storage with padding rows past max_ctx (kv_cache.value_cache). junk_from: its rows from
    there on, and the padding, hold large finite codes instead (stale rows: what a transposed cache's readers
    take in whole, at zero weight; the writer never stores a NaN)."""
    hkv, max_ctx, d = v8.shape
    out = value_cache((1, hkv, max_ctx, d), v8.device, v8.dtype, transposed)[0]
    if junk_from is None:
        return out.copy_(v8)
    torch.empty(0, dtype=torch.uint8, device=v8.device).set_(out.untyped_storage()).fill_(0x7E)  # e4m3fn's 448
    out[:, :junk_from] = v8[:, :junk_from]
    return out


def test_quantized_rows_are_within_e4m3s_precision_of_the_originals():
    """Each value comes back within half a step of e4m3 at its size (3 mantissa bits: 1/16 of it), or of the
    subnormal step at the bottom of its row's range; the largest magnitude of each row is kept exactly."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 50, 128, generator=g) * torch.logspace(-3, 3, 50)[None, :, None]
    x[0, 0] = 0.0  # an all-zero row
    codes, scale = reference.quantize_fp8_rows(x)
    assert codes.dtype == torch.float8_e4m3fn and scale.shape == x.shape[:-1]
    back = codes.float() * scale[..., None]
    subnormal_step = 2.0**-9 * scale[..., None]
    assert ((back - x).abs() <= torch.maximum(x.abs() / 16, subnormal_step / 2) * 1.0001).all()
    assert not back[0, 0].any()
    peak = x.abs().argmax(-1, keepdim=True)
    torch.testing.assert_close(back.gather(-1, peak), x.gather(-1, peak), rtol=1e-6, atol=0)


@pytest.mark.parametrize("hq,hkv,d", SHAPES)
@pytest.mark.parametrize("start,t", [(0, 5), (7, 1), (3, 21)])
@pytest.mark.parametrize("transposed", [False, True], ids=["v-rows", "v-transposed"])
def test_the_cache_kernel_writes_8bit_rows_as_the_reference_does(device, hq, hkv, d, start, t, transposed):
    """The same scales, and the same fp8 codes but for ties (Triton's interpreter rounds a tie away from zero,
    torch and the GPU to even: one code apart); nothing written outside the new tokens' rows; q unchanged. The
    value cache row-major or transposed (the model's: kv_cache.value_cache)."""
    g = torch.Generator().manual_seed(1)
    max_ctx = 64
    qkv = (torch.randn(t, (hq + 2 * hkv) * d, generator=g) * 3).to(device, _dtype(device))
    bias = torch.randn((hq + 2 * hkv) * d, generator=g).to(device, _dtype(device))
    cos, sin = (torch.randn(max_ctx, d // 2, generator=g).to(device) for _ in range(2))
    out = []
    for ops in (small_ops, reference):
        k8 = torch.zeros(hkv, max_ctx, d, device=device, dtype=torch.float8_e4m3fn)
        v8 = _in_layout(torch.zeros_like(k8), transposed)
        ks, vs = (torch.zeros(hkv, max_ctx, device=device) for _ in range(2))
        pos_t = torch.tensor([start], device=device, dtype=torch.int32)
        q = ops.rope_bias_cache(qkv, bias, cos, sin, k8, v8, pos_t, start, hq, hkv, scales=(ks, vs))
        out.append((q, k8, v8, ks, vs))
    (q1, *ours), (q2, *ref) = out
    torch.testing.assert_close(q1, q2, **(dict(atol=2e-2, rtol=2e-2) if device == "cuda" else {}))
    for mine, theirs in zip(ours, ref):
        if mine.dtype == torch.float8_e4m3fn:
            steps = (mine.view(torch.uint8).int() - theirs.view(torch.uint8).int()).abs()
            assert steps.max() <= 1 and (steps > 0).float().mean() < 0.05
            assert not mine.view(torch.uint8)[:, :start].any() and not mine.view(torch.uint8)[:, start + t :].any()
        else:
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=0)
            assert (mine[:, start : start + t] > 0).all()


@pytest.mark.parametrize("transposed", [False, True], ids=["v-rows", "v-transposed"])
def test_the_cache_writer_stores_no_nan_codes_for_a_row_that_overflowed(device, transposed):
    """Values of a K or V row that are inf or NaN (a reply that overflowed) are stored as code 0; a row with an
    inf has an inf scale, so all its codes are 0 (a NaN is left out of the row's maximum on the GPU and in
    Triton's interpreter, where torch's reference spreads it over the row). The other rows as ever. No e4m3 NaN
    code reaches the cache, where a transposed value cache's readers take stale rows in whole (kv_cache.py)."""
    hq, hkv, d, max_ctx, start, t = 4, 2, 16, 64, 5, 3
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=torch.Generator().manual_seed(8)).to(device, _dtype(device))
    qkv[0, (hq + hkv) * d + 2] = float("inf")  # token 0: V head 0 overflowed
    qkv[1, hq * d + 5] = float("nan")  # token 1: K head 0
    qkv[2, (hq + hkv + 1) * d :] = float("nan")  # token 2: V head 1, whole
    bias = torch.zeros((hq + 2 * hkv) * d, device=device, dtype=qkv.dtype)
    cos, sin = torch.ones(max_ctx, d // 2, device=device), torch.zeros(max_ctx, d // 2, device=device)
    written = []
    for ops in (small_ops, reference):
        k8 = torch.zeros(hkv, max_ctx, d, device=device, dtype=torch.float8_e4m3fn)
        v8 = _in_layout(torch.zeros_like(k8), transposed)
        ks, vs = (torch.zeros(hkv, max_ctx, device=device) for _ in range(2))
        ops.rope_bias_cache(
            qkv,
            bias,
            cos,
            sin,
            k8,
            v8,
            torch.tensor([start], device=device, dtype=torch.int32),
            start,
            hq,
            hkv,
            scales=(ks, vs),
        )
        assert not (k8.float().isnan().any() or v8.float().isnan().any())
        assert not v8.float()[0, start].any() and vs[0, start] == float("inf")
        assert k8.float()[0, start + 1, 5] == 0 and not v8.float()[1, start + 2].any()
        for c, row in ((k8, (0, start + 1)), (v8, (0, start)), (v8, (1, start + 2))):  # the overflowed rows aside
            c.view(torch.uint8)[row] = 0
        written.append((k8.float(), v8.float()))
    (k_ours, v_ours), (k_ref, v_ref) = written
    assert k_ours[:, start : start + t].abs().sum() > 0 and v_ours[:, start : start + t].abs().sum() > 0
    assert ((k_ours - k_ref).abs() <= k_ref.abs() / 8).all() and ((v_ours - v_ref).abs() <= v_ref.abs() / 8).all()


WHOLE_TILES_8BIT = decode_attention.DecodeAttnConfig(66, 16, 16, 4, 2, chunk_align=1, early_tile=True, whole_tiles=True)
DECODE_8BIT_CONFIGS = (
    decode_attention.DECODE_ATTN_CONFIGS[:2]
    + decode_attention.KV8_CONFIGS
    + (decode_attention.DecodeAttnConfig(66, 16, 16, 4, 2, chunk_align=1, early_tile=True), WHOLE_TILES_8BIT)
)
# V transposed (the model's layout) in every case; row-major V (the kernels read it too) at the 1.5B's shape
DECODE_8BIT_CASES = [
    (*shape, length, config, True)
    for shape in SHAPES
    for length in (1, 48, 200, 2500)
    for config in DECODE_8BIT_CONFIGS
] + [(*SHAPES[1], length, config, False) for length in (48, 2500) for config in DECODE_8BIT_CONFIGS]


@pytest.mark.parametrize(
    "hq,hkv,d,length,config,transposed",
    DECODE_8BIT_CASES,
    ids=lambda v: str(v) if isinstance(v, decode_attention.DecodeAttnConfig) else None,
)
def test_decode_attention_over_an_8bit_cache_matches_reference(device, hq, hkv, d, length, config, transposed):
    """Every split shape, whole and in many splits, with the depth read on the device; NaN codes and scales
    past the depth must not leak in. A transposed value cache's tiles are read whole (into its padding rows: a
    depth of 2,500 in 2,560 rows): there its rows past the depth hold large finite values instead (its writer
    stores no NaN), which must get no weight."""
    k8, v8, ks, vs = _quantized_cache(hkv, 2560, d, seed=2, device=device, length=length)
    if transposed:
        v8 = _in_layout(v8, True, junk_from=length)
    q = torch.randn(hq, d, generator=torch.Generator().manual_seed(3)).to(device, _dtype(device))
    pos_t = torch.tensor([length - 1], device=device, dtype=torch.int32)
    scale = 1 / math.sqrt(d)
    ref = reference.decode_attention(q.float(), k8, v8, pos_t, length, scale, scales=(ks, vs))
    attn = decode_attention.DecodeAttention(
        hq, hkv, d, device, q.dtype, configs=decode_attention.DECODE_ATTN_CONFIGS + (config,)
    )
    out = attn(q, k8, v8, pos_t, length, scale, config=config, scales=(ks, vs))
    tol = dict(atol=2e-2, rtol=2e-2) if device == "cuda" else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.float(), ref, **tol)


@pytest.mark.parametrize("length", [48, 2500])
@pytest.mark.parametrize("transposed", [True, False])
def test_decode_attention_of_a_16_bit_model_over_an_8bit_cache_matches_reference(device, length, transposed):
    """A 16-bit model's query (fp16 here; bf16 on a GPU too), which takes the exp2 softmax over a transposed V
    with whole_tiles (the row-major V's zeroed rows keep the natural-units softmax), at the 1.5B's shape: the
    test above runs fp32 on the CPU, which never takes it."""
    hq, hkv, d = 12, 2, 128
    k8, v8, ks, vs = _quantized_cache(hkv, 2560, d, seed=5, device=device, length=length)
    v8 = _in_layout(v8, transposed, junk_from=length)
    pos_t = torch.tensor([length - 1], device=device, dtype=torch.int32)
    scale = 1 / math.sqrt(d)
    for dt in [torch.float16] + ([torch.bfloat16] if device == "cuda" else []):
        q = torch.randn(hq, d, generator=torch.Generator().manual_seed(6)).to(device, dt)
        ref = reference.decode_attention(q.float(), k8, v8, pos_t, length, scale, scales=(ks, vs))
        attn = decode_attention.DecodeAttention(hq, hkv, d, device, dt, configs=(WHOLE_TILES_8BIT,))
        out = attn(q, k8, v8, pos_t, length, scale, scales=(ks, vs))
        torch.testing.assert_close(out.float(), ref, atol=4e-3 if dt == torch.float16 else 2e-2, rtol=1e-2)


PREFILL_8BIT_SPANS = [(0, 70, None), (37, 16, 3), (300, 130, None), (1000, 3, 16), (300, 130, 1)]


# V transposed (the model's layout) in every case; row-major V in two (a long one in one pass, a short in splits)
@pytest.mark.parametrize(
    "start,t,splits,pack_gqa,transposed",
    [(*span, pack, True) for span in PREFILL_8BIT_SPANS for pack in (False, True)]
    + [(*PREFILL_8BIT_SPANS[2], True, False), (*PREFILL_8BIT_SPANS[3], True, False)],
)
def test_prefill_attention_over_an_8bit_cache_matches_reference(
    device, monkeypatch, start, t, splits, pack_gqa, transposed
):
    """Fresh prompts, follow-ups and short injections over an 8-bit cache, whole or in key splits, packed or not
    (a group of 3: idle rows at the end of a packed block); NaN codes and scales past the new tokens must not
    leak in (the 16-bit cache's TMA path is never taken: 8-bit tiles are loaded and dequantized). A transposed
    value cache's tiles are read whole: there the rows after the new tokens hold large finite values (its writer
    stores no NaN), which must get no weight."""
    monkeypatch.setattr(prefill_attention.PrefillAttention, "PACK_GQA", pack_gqa)
    hq, hkv, d = 6, 2, 64
    k8, v8, ks, vs = _quantized_cache(hkv, 1152, d, seed=4, device=device, length=start + t)
    if transposed:
        v8 = _in_layout(v8, True, junk_from=start + t)
    dt = torch.float16 if device == "cpu" else torch.bfloat16
    q = torch.randn(t, hq, d, generator=torch.Generator().manual_seed(5)).to(device, dt)
    scale = 1 / math.sqrt(d)
    ref = reference.prefill_attention(q.float(), k8, v8, start, scale, scales=(ks, vs))  # dequantized in fp32
    attn = prefill_attention.PrefillAttention(hq, hkv, d, device, max_tokens=16 * t)
    out = attn(
        q, k8, v8, torch.tensor([start], device=device, dtype=torch.int32), scale, splits=splits, scales=(ks, vs)
    )
    assert out.dtype == dt
    torch.testing.assert_close(out.float(), ref, atol=2e-3 if dt == torch.float16 else 1.6e-2, rtol=1e-2)


@pytest.mark.parametrize("transposed", [False, True], ids=["v-rows", "v-transposed"])
def test_a_prefill_zeroes_the_stale_value_rows_and_their_scales_in_an_8bit_cache(device, transposed):
    """As in the 16-bit cache (test_small_ops), and their scales too: a NaN scale would make a zeroed row
    NaN again."""
    from model_loader.kernels.jit_small_ops import STALE_V_ROWS

    hq, hkv, d, max_ctx, start, t = 4, 2, 16, 512, 37, 16
    g = torch.Generator().manual_seed(7)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=g).to(device, _dtype(device))
    bias = torch.zeros((hq + 2 * hkv) * d, device=device, dtype=qkv.dtype)
    cos, sin = torch.ones(max_ctx, d // 2, device=device), torch.zeros(max_ctx, d // 2, device=device)
    k8 = torch.zeros(hkv, max_ctx, d, device=device, dtype=torch.float8_e4m3fn)
    k8.view(torch.uint8).fill_(0x7F)
    v8 = _in_layout(k8, transposed)
    ks, vs = (torch.full((hkv, max_ctx), float("nan"), device=device) for _ in range(2))
    small_ops.rope_bias_cache(
        qkv,
        bias,
        cos,
        sin,
        k8,
        v8,
        torch.tensor([start], device=device, dtype=torch.int32),
        start,
        hq,
        hkv,
        scales=(ks, vs),
    )
    end = start + t
    rows = STALE_V_ROWS.value
    assert not v8.view(torch.uint8)[:, end : end + rows].any() and not vs[:, end : end + rows].any()
    assert v8.float()[:, end + rows :].isnan().all() and vs[:, end + rows :].isnan().all()
    assert not (v8.float()[:, start:end].isnan().any() or vs[:, start:end].isnan().any())


def test_a_fresh_prefill_hands_sdpa_row_major_values_from_the_transposed_cache():
    """A fresh prompt's attention is SDPA over the dequantized cache (Qwen2Model._prefill_attention), and SDPA
    given a V whose last dimension is not contiguous leaves its flash kernel for the math one: the 8-bit cache's
    V is stored transposed, so its dequantized K and V must come back row-major (and the same values)."""
    v8 = value_cache((1, 2, 64, 16), "cpu", torch.float8_e4m3fn, transposed=True)[0]
    v8.view(torch.uint8).copy_(torch.randint(0, 0x7E, v8.shape, generator=torch.Generator().manual_seed(9)))
    k8 = v8.contiguous()
    scales = torch.rand(2, 64) + 0.5
    k, v = reference.cached_kv(k8, v8, 40, torch.float32, (scales, scales))
    assert k.is_contiguous() and v.is_contiguous() and v.shape == (2, 40, 16)
    torch.testing.assert_close(v, v8[:, :40].float() * scales[:, :40, None], rtol=0, atol=0)
    torch.testing.assert_close(k, v, rtol=0, atol=0)


def test_an_8bit_cache_costs_half_the_bytes_and_the_auto_context_doubles():
    from model_loader.context import choose_context, per_token_bytes

    class Cfg:  # the 1.5B
        num_hidden_layers, num_key_value_heads, head_dim = 28, 2, 128

    assert per_token_bytes(Cfg(), 2) == 28 * 1024 + 512
    assert per_token_bytes(Cfg(), 2, KV_8BIT) == 28 * 2 * 2 * (128 + 4) + 512  # a byte a value, a scale a row
    gib = 1 << 30
    sixteen = choose_context(2 * gib, 6 * gib, per_token_bytes(Cfg(), 2), 131072, target=1 << 20)
    eight = choose_context(2 * gib, 6 * gib, per_token_bytes(Cfg(), 2, KV_8BIT), 131072, target=1 << 20)
    assert 1.85 < eight / sixteen < 1.95
    assert check_kv_cache(KV_16BIT) == KV_16BIT
    with pytest.raises(ValueError, match="16-bit or 8-bit"):
        check_kv_cache("4-bit")


def test_the_engine_on_an_8bit_cache(tiny_model):
    """Load with kv_cache="8-bit": the cache is fp8 with scales (about half the bytes), the info says so, the
    kernels are prepared under their own name, and a follow-up over the cached prefix gives the same tokens as
    the same conversation prefilled afresh."""
    from model_loader.engine import Engine
    from model_loader.variants import kernel_variant
    from model_loader.events import SamplingSettings

    engine = Engine.load(tiny_model, device="cpu", context_length=512, kv_cache=KV_8BIT)
    dense = Engine.load(tiny_model, device="cpu", context_length=512)
    try:
        engine.warm_up()
        m = engine.model
        assert m.k_cache.dtype == torch.float8_e4m3fn and m.k_scale.dtype == torch.float32
        assert engine.info.kv_cache == KV_8BIT and dense.info.kv_cache == KV_16BIT
        cfg = m.cfg
        # V is stored transposed, each of its rows 128 tokens longer (kv_cache.value_cache): 512 + 128 = 640
        assert small_ops.value_layout(m.v_cache[0]) == (True, 640)
        assert engine.info.kv_cache_bytes == cfg.num_hidden_layers * cfg.num_key_value_heads * (
            512 * cfg.head_dim + 640 * cfg.head_dim + 2 * 512 * 4
        )
        # the CPU's "16-bit" cache is the model's fp32 there: 4 bytes a value against 1 + 4 / head_dim
        assert dense.info.kv_cache_bytes == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * 512 * (
            cfg.head_dim * 4
        )
        assert kernel_variant(cfg, m.dtype, None, KV_8BIT) != kernel_variant(cfg, m.dtype, None)

        def reply(messages):
            events = list(
                engine.generate(messages, SamplingSettings(temperature=0, max_new_tokens=12, ignore_eos=True))
            )
            return events[-1]

        first = reply([{"role": "user", "content": "Tell me a story about a robot."}])
        follow = [
            {"role": "user", "content": "Tell me a story about a robot."},
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": "Shorter."},
        ]
        reused = reply(follow)
        assert reused.stats.prefix_reused_tokens > 0
        engine.reset_cache()
        fresh = reply(follow)
        assert fresh.stats.prefix_reused_tokens == 0 and fresh.token_ids == reused.token_ids
    finally:
        engine.close()
        dense.close()


def test_an_unknown_kv_cache_format_is_refused_before_anything_loads(tiny_model):
    from model_loader.engine import Engine

    with pytest.raises(ValueError, match="unknown KV cache format"):
        Engine.load(tiny_model, device="cpu", context_length=512, kv_cache="fp4")


def test_the_triton_path_on_an_8bit_cache_gives_the_reference_paths_logits(tiny_model):
    """The fused kernels (Triton's interpreter on a CPU machine; fp32 so the comparison can be tight) write and read
    the 8-bit cache as the PyTorch path does: the same logits for a prompt, for the decode steps after it, and for
    a follow-up prefilled the way the CUDA prefill graphs do it (padded to a bucket, the cached prefix's length
    read from a device tensor) as for the whole conversation prefilled afresh."""
    from model_loader.engine import Engine

    on_gpu = torch.cuda.is_available()
    fused = Engine.load(
        tiny_model,
        device="cuda" if on_gpu else "cpu",
        use_triton=True,
        dtype="fp32",
        context_length=256,
        kv_cache=KV_8BIT,
    )
    plain = Engine.load(
        tiny_model,
        device="cuda" if on_gpu else "cpu",
        use_triton=False,
        dtype="fp32",
        context_length=256,
        kv_cache=KV_8BIT,
    )
    try:
        assert fused.info.kernels == "triton" and plain.info.kernels == "pytorch"
        messages = [{"role": "user", "content": "Why is the sky blue?"}]
        ids = fused.chat.render(messages).ids
        dev = fused.model.device
        logits = []
        for engine in (fused, plain):
            model = engine.model
            steps = [model.prefill(torch.tensor(ids, device=dev), 0)]
            for i in range(4):
                token = steps[-1].argmax(-1).reshape(1)
                pos = len(ids) + i
                steps.append(model.decode(token, torch.tensor([pos], dtype=torch.int32, device=dev), pos))
            logits.append(torch.cat(steps))
        torch.testing.assert_close(logits[0], logits[1], atol=1e-4, rtol=1e-4)

        model = fused.model
        follow = messages + [{"role": "assistant", "content": "Light scatters."}, {"role": "user", "content": "Why?"}]
        whole = fused.chat.render(follow).ids
        start = next(i for i, (a, b) in enumerate(zip(ids, whole)) if a != b)
        new = whole[start:]
        fresh = model.prefill(torch.tensor(whole, device=dev), 0)
        model.prefill(torch.tensor(ids, device=dev), 0)
        padded = torch.tensor(new + [0] * (64 - len(new)), device=dev)
        with torch.inference_mode():
            again = model.prefill_static(
                padded,
                torch.tensor([len(new) - 1], device=dev),
                torch.tensor([start], dtype=torch.int32, device=dev),
                fresh=False,
            )
        torch.testing.assert_close(again, fresh, atol=1e-4, rtol=1e-4)
    finally:
        fused.close()
        plain.close()


def test_gpus_without_an_e4m3_type_in_triton_are_told_to_use_the_16bit_cache():
    """Triton loads e4m3 only on compute capability 8.9+ (Ada, Hopper and newer): an RTX 30-series card is
    refused at load with what to choose instead, rather than failing in a kernel compile at warm-up."""
    from model_loader.kv_cache import unsupported_reason

    reason = unsupported_reason(KV_8BIT, "cuda", (8, 6), "NVIDIA GeForce RTX 3060 Laptop GPU")
    assert reason and "8.9 or newer" in reason and "RTX 3060 Laptop GPU is 8.6" in reason and "16-bit" in reason
    assert unsupported_reason(KV_8BIT, "cuda", (8, 9), "RTX 4060") is None
    assert unsupported_reason(KV_8BIT, "cuda", (9, 0), "H200") is None
    assert unsupported_reason(KV_16BIT, "cuda", (7, 5), "T4") is None
    assert unsupported_reason(KV_8BIT, "cpu") is None
