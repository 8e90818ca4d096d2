"""Every Triton kernel, as the engine actually launches it, compiles for a real NVIDIA GPU.

Triton's interpreter (how the CPU tests run our kernels) executes the Python source with numpy and accepts code
the GPU compiler rejects (a plain Python global read inside a kernel, say). So we record each launch made while
running the kernels in the interpreter and compile it, ahead of time and without a GPU, down to a cubin for an
RTX 30-series GPU (sm_86), the low end of what r1desk supports: the same front end and back end the app uses at
first start on the user's machine."""

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="records launches through Triton's interpreter (a GPU compiles for real)",
)

_POINTER_TYPES = {
    torch.float32: "*fp32",
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.int32: "*i32",
    torch.int64: "*i64",
    torch.uint8: "*u8",
    torch.float8_e4m3fn: "*fp8e4nv",
}
_LAUNCH_OPTIONS = ("num_warps", "num_stages")
# The most shared memory a program may have on an RTX 30- or 40-series card (sm_86 / sm_89: 99 KB; the H200 has
# 227 KB) and on a Turing card (sm_75: RTX 20-series, GTX 16-series, many 6 GB laptops: 64 KB), where r1desk runs
# fp16 (no bf16) on the same kernels.
SMALL_GPU_SHARED = 101_376
TURING_SHARED = 65_536


def _spec(fn, args, kwargs) -> dict:
    """A launch as JSON: where the kernel lives, its argument types and constexpr values, launch options."""
    params = inspect.signature(fn).parameters
    bound = dict(zip(params, args))
    bound.update({k: v for k, v in kwargs.items() if k not in _LAUNCH_OPTIONS})
    signature, constexprs, aligned = {}, {}, []
    for i, (name, p) in enumerate(params.items()):
        value = bound[name] if name in bound else p.default  # a constexpr left at its default
        if "constexpr" in str(p.annotation):
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = _POINTER_TYPES[value.dtype]
            if value.data_ptr() % 16 == 0:
                aligned.append(i)
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if value % 16 == 0:
                aligned.append(i)
        else:
            signature[name] = "fp32"
    # "aligned": the arguments a GPU launch specializes as divisible by 16 (pointers, and ints), as Triton does at
    # run time: it lets loads become 16-byte async copies, which changes the shared memory a kernel asks for.
    return {
        "module": fn.__module__,
        "file": inspect.getsourcefile(fn),
        "name": fn.__name__,
        "signature": signature,
        "constexprs": constexprs,
        "aligned": aligned,
        "options": {k: v for k, v in kwargs.items() if k in _LAUNCH_OPTIONS},
    }


# Runs in a fresh interpreter: once the interpreter has run kernels in a process, Triton's language module is
# patched for numpy and its compiler no longer works there.
_COMPILER = """
import importlib.util, json, re, sys
import triton
from triton import JITFunction
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

for spec in json.load(sys.stdin):
    try:
        module = importlib.import_module(spec["module"])
    except ImportError:
        loader = importlib.util.spec_from_file_location(spec["module"], spec["file"])
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
    kernel = getattr(module, spec["name"])
    kernel = kernel if isinstance(kernel, JITFunction) else JITFunction(getattr(kernel, "fn", kernel))
    try:
        attrs = {(i,): [["tt.divisibility", 16]] for i in spec.get("aligned", [])}
        compiled = triton.compile(ASTSource(kernel, spec["signature"], spec["constexprs"], attrs),
                                  target=GPUTarget("cuda", spec.get("arch", 86), 32), options=spec["options"])
        assert compiled.asm["cubin"]
    except Exception as err:
        sys.exit(spec["name"] + ": " + str(err))
    # the shared memory a program asks for, and its global loads: all, with an L2 cache hint, evict_first among
    # the hints
    loads = [line for line in compiled.asm["ptx"].splitlines() if re.search(r"\\bld\\.global", line)]
    print(spec["name"], compiled.metadata.shared, len(loads), sum("cache_hint" in line for line in loads),
          int("L2::evict_first" in compiled.asm["ptx"]))
"""


@pytest.fixture
def launches(monkeypatch):
    from triton.runtime.interpreter import InterpretedFunction

    recorded = {}
    original = InterpretedFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        spec = _spec(self.fn, args, kwargs)
        recorded.setdefault(json.dumps(spec, sort_keys=True), spec)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", record)
    return recorded


def _compile_all(launches) -> dict[str, int]:
    """Compile every recorded launch for sm_86, and the launches with programmatic dependent launch switched on
    (PDL / TRIGGER, what the app does on Hopper) and the fused sampler's GPU fence (FENCE) for sm_90; {kernel name:
    the most shared memory any of its launches asks for}, or AssertionError with the compiler's message."""
    launches = dict(launches)
    for spec in list(launches.values()):
        flags = {k: True for k in ("PDL", "TRIGGER", "FENCE") if k in spec["constexprs"]}
        if flags:
            hopper = dict(spec, constexprs={**spec["constexprs"], **flags}, arch=90)
            launches[json.dumps(hopper, sort_keys=True)] = hopper
    shared: dict[str, int] = {}
    for name, size, *_ in _compiled(list(launches.values())):
        shared[name] = max(shared.get(name, 0), int(size))
    return shared


def _assert_fit_everywhere(shared: dict[str, int]) -> None:
    """The kernels without shared-memory fallbacks (all but the two attentions, checked below) fit the smallest
    budget r1desk runs on: a Turing card's 64 KB (what they take there is no more than on sm_86: no pipelined
    copies before sm_80; at the 1.5B's shapes the largest is the sampler's histograms, at most 32 KB)."""
    too_big = {name: size for name, size in shared.items() if size > TURING_SHARED and "_attn_" not in name}
    assert not too_big, too_big


def test_the_engines_kernels_compile_for_a_gpu(tiny_model, launches):
    """bf16 prefill + decode on the fused kernels, plus our dense GEMV configs."""
    from model_loader.engine import Engine
    from model_loader.kernels import decode_attention, gemv

    engine = Engine.load(tiny_model, device="cpu", use_triton=True, dtype="bf16", context_length=512)
    model = engine.model
    ids = torch.tensor(engine.chat.encode_plain("Hello, compile."))
    model.prefill(ids, 0)
    model.prefill(torch.arange(100, 200), ids.numel())  # after a cached prefix
    attention = model.prefill_attention
    q = torch.randn(8, 4, 16, dtype=torch.bfloat16)
    for shape in {shape for _, shape in attention.SHAPES}:  # every block shape, in one pass and in key splits
        attention._tuned = lambda n, shape=shape: shape
        for splits in (1, 2):
            attention(q, model.k_cache[0], model.v_cache[0], torch.tensor([9], dtype=torch.int32), 0.25, splits=splits)
    del attention._tuned
    pos = torch.tensor([ids.numel()], dtype=torch.int32)
    for config in decode_attention.DECODE_ATTN_CONFIGS:  # every decode attention shape the warm-up may pick
        model.set_decode_attention_config(config)
        model.decode(ids[-1:], pos, ids.numel())
    w = torch.randn(40, 256, dtype=torch.bfloat16)
    for config in gemv.GEMV_CONFIGS:
        gemv.gemv(torch.randn(1, 256, dtype=torch.bfloat16), w, config)
    for config in gemv.GEMV_SILU_CONFIGS:  # the gate/up GEMV with its SiLU output
        gemv.gemv(torch.randn(1, 256, dtype=torch.bfloat16), w, config, silu_output=True)
    wide = torch.randn(40, gemv.GEMV_SPLIT_MIN_K, dtype=torch.bfloat16)  # the down projection's K splits
    for config in gemv.GEMV_SPLIT_CONFIGS:
        gemv.gemv(torch.randn(1, wide.shape[1], dtype=torch.bfloat16), wide, config)
    names = _compile_all(launches)
    assert {
        "_add_rms_norm_kernel",
        "_rope_bias_cache_kernel",
        "_silu_mul_kernel",
        "_decode_attn_split_kernel",
        "_decode_attn_reduce_kernel",
        "_prefill_attn_kernel",
        "_prefill_attn_reduce_kernel",
        "_gemv_kernel",
    } <= names.keys()
    _assert_fit_everywhere(names)


def test_the_int4_kernels_compile_for_a_gpu(launches):
    """Every int4 GEMV config the warm-up may pick (with and without K splits), the gate/up GEMV with its SiLU
    output, and the prefill dequantisers."""
    from model_loader import awq as fmt
    from model_loader.kernels import int4_triton

    q = torch.randint(0, 16, (1024, 48))  # wide enough for every K split to happen
    w = fmt.to_row_packed(q, torch.randint(0, 16, (8, 48)), torch.rand(8, 48).half(), 128)
    x = torch.randn(1, 1024, dtype=torch.bfloat16)
    for config in int4_triton.INT4_GEMV_CONFIGS:
        int4_triton.int4_gemv(x, w, config)
    int4_triton.int4_dequantize(w, torch.empty(48 * 1024, dtype=torch.bfloat16))
    gate_up = fmt.pair_gate_up(w)  # the MLP's gate/up GEMV, which outputs SiLU(gate) * up
    int4_triton.int4_gemv(x, gate_up, silu_output=True)
    int4_triton.int4_dequantize(gate_up, torch.empty(48 * 1024, dtype=torch.bfloat16))
    # the dequantiser of torch's CUDA int4 layout (prefill on the default 4-bit path)
    w_uint8, sz = fmt.int4pack_inputs(q, torch.randint(0, 16, (8, 48)), torch.rand(8, 48).half())
    packed = fmt.Int4Weight(fmt.cuda_int4pack_layout(w_uint8, 8), sz, 128, 48, 1024)
    int4_triton.int4pack_dequantize(packed, torch.empty(48 * 1024, dtype=torch.bfloat16))
    # a narrower interleave and a group per nibble (Qwen2-0.5B's width 896 takes interleave 16)
    narrow = fmt.to_row_packed(
        torch.randint(0, 16, (896, 32)), torch.randint(0, 16, (28, 32)), torch.rand(28, 32).half(), 32
    )
    int4_triton.int4_gemv(torch.randn(1, 896, dtype=torch.bfloat16), narrow)
    int4_triton.int4_dequantize(narrow, torch.empty(32 * 896, dtype=torch.bfloat16))
    names = _compile_all(launches)
    assert {"_int4_gemv_kernel", "_int4_dequantize_kernel", "_int4pack_dequantize_kernel"} <= names.keys()
    _assert_fit_everywhere(names)


def test_the_fused_sampler_compiles_for_a_gpu(launches):
    """The fused sampler's five kernels, with top-k off and on (bf16 and fp16 logits), and at Qwen2's vocabulary
    with the block the app uses (its shared memory grows with the block)."""
    from model_loader.kernels.fused_sampler import fused_sample
    from model_loader.sampling import SamplerParams

    params = SamplerParams("cpu")
    for dtype, top_k in ((torch.bfloat16, 0), (torch.float16, 5)):
        params.set(0.6, 0.9, top_k, 100)
        fused_sample(torch.randn(1, 100).to(dtype), params, block=32)
    params.set(0.6, 0.95, 0, 151_936)
    fused_sample(torch.randn(1, 151_936).to(torch.bfloat16), params)
    names = _compile_all(launches)
    assert {
        "_sampler_max_kernel",
        "_sampler_top_k_kernel",
        "_sampler_mass_high_kernel",
        "_sampler_mass_low_kernel",
        "_sampler_draw_kernel",
    } <= names.keys()
    _assert_fit_everywhere(names)


def test_a_kernel_the_gpu_compiler_rejects_is_caught(launches, tmp_path, monkeypatch):
    """The check itself: a kernel reading a plain Python global runs in the interpreter but must not compile."""
    (tmp_path / "r1desk_bad_kernel.py").write_text(
        inspect.cleandoc("""
        import triton
        import triton.language as tl
        SCALE = 2.0

        @triton.jit
        def scale_kernel(x_ptr, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            tl.store(x_ptr + offs, tl.load(x_ptr + offs) * SCALE)
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import r1desk_bad_kernel

    x = torch.ones(16)
    r1desk_bad_kernel.scale_kernel[(1,)](x, BLOCK=16)
    assert torch.equal(x, torch.full((16,), 2.0))  # the interpreter ran it
    with pytest.raises(AssertionError, match="global variable SCALE"):
        _compile_all(launches)


def _compiled(specs: list[dict]) -> list[list[str]]:
    """Each launch spec compiled for its "arch" (sm_86 unless given) in a fresh interpreter (_COMPILER): its
    line of output split (kernel name, shared memory, global loads, of them with an L2 hint, evict_first used),
    or AssertionError with the compiler's message."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", _COMPILER], input=json.dumps(specs), capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1]
    return [line.split() for line in done.stdout.splitlines()]


def _compiled_shared(specs: list[dict]) -> list[int]:
    """Bytes of shared memory each launch spec asks for, compiled for its "arch" (fresh interpreter, as above)."""
    return [int(fields[1]) for fields in _compiled(specs)]


@pytest.mark.parametrize(
    "kind, arch, limit",
    [
        ("bf16", 86, SMALL_GPU_SHARED),
        ("fp32", 86, SMALL_GPU_SHARED),
        ("8-bit", 89, SMALL_GPU_SHARED),
        ("fp16", 75, TURING_SHARED),
        ("bf16", 120, SMALL_GPU_SHARED),
        ("8-bit", 120, SMALL_GPU_SHARED),
    ],
)
def test_on_a_small_gpu_every_decode_attention_shape_falls_back_to_one_that_fits(launches, kind, arch, limit):
    """At the 1.5B's shapes (12 query heads, 2 KV heads, head dim 128), every decode attention shape the warm-up
    may pick on a GPU without programmatic dependent launch (an RTX 30/40-series card), followed by its
    fallbacks (decode_attention.decode_attention_fallbacks, what DecodeAttention runs when Triton refuses a launch for
    shared memory), compiled for that GPU: some shape of each chain fits its 99 KB. Without the fallbacks the
    split-per-SM shape (139,520 bytes with Triton 3.6) could not run there, and the prefill's last row always
    takes it. 8-bit: the cache's e4m3 needs sm_89 (RTX 40-series). fp16 on a Turing card (64 KB): there the
    128-token tiles take 73,728 bytes whatever the stages (Triton 3.6 and 3.9: no asynchronous copies before
    sm_80), so only the 64-token fallback runs. An RTX 50-series card (sm_120) has the same 99 KB and runs
    programmatic dependent launch (compute capability 9.0+): there the candidates are the Hopper ones, early
    first tile and late launch included, compiled with PDL on. On the 99 KB cards, 16-bit and 8-bit, and on Turing,
    the shape DecodeAttention tries first (DecodeAttention.candidates: those refused for certain left out) already
    fits: it is the one a first start compiles ahead, and no launch is refused. The bound candidates() rules shapes
    out by (decode_pipeline_bytes) is at most what Triton asks for each shape, 16-bit, 8-bit and fp32. 8-bit: its
    own candidates (decode_attention.KV8_CONFIGS: 8 warps, two programs an SM) too."""
    import dataclasses

    from model_loader.kernels import decode_attention, reference
    from model_loader.kv_cache import value_cache

    hq, hkv, d, length = 12, 2, 128, 40
    dt = {"fp32": torch.float32, "fp16": torch.float16}.get(kind, torch.bfloat16)
    g = torch.Generator().manual_seed(9)
    k = torch.randn(hkv, 64, d, generator=g)
    v = torch.randn(hkv, 64, d, generator=g)
    scales = None
    if kind == "8-bit":  # V transposed, as the model holds it (kv_cache.value_cache)
        (k, ks), (v, vs) = reference.quantize_fp8_rows(k), reference.quantize_fp8_rows(v)
        v = value_cache((1, *v.shape), "cpu", v.dtype, transposed=True)[0].copy_(v)
        scales = (ks, vs)
    else:
        k, v = k.to(dt), v.to(dt)
    q = torch.randn(hq, d, generator=g).to(dt)
    pos = torch.tensor([length - 1], dtype=torch.int32)
    pdl = arch >= 90  # features.pdl_supported
    ours = decode_attention.DECODE_ATTN_CONFIGS + (decode_attention.KV8_CONFIGS if kind == "8-bit" else ())
    configs = ours if pdl else dict.fromkeys(dataclasses.replace(c, early_tile=False, late_launch=False) for c in ours)
    chains, firsts = [], []
    key = lambda c: (c.block_n, c.max_splits, c.num_stages, c.early_tile, c.late_launch, c.num_warps)  # noqa: E731
    for config in configs:
        attn = decode_attention.DecodeAttention(hq, hkv, d, "cpu", dt, configs=(config,))
        chain = [attn.resolve(config), *decode_attention.decode_attention_fallbacks(attn.resolve(config))]
        for c in chain:  # records each shape's launch
            attn(q, k, v, pos, length, d**-0.5, config=c, scales=scales)
        chains.append([key(c) for c in chain])
        attn.shared_limit, attn.pipelined = limit, arch >= 80  # what DecodeAttention reads from such a GPU
        firsts.append(key(attn.candidates(attn.resolve(config), decode_attention.decode_tile_bytes(k, v))[0]))
    specs = [
        dict(spec, arch=arch, constexprs={**spec["constexprs"], "PDL": pdl})
        for spec in launches.values()
        if spec["name"] == "_decode_attn_split_kernel"
    ]
    shared = {
        (
            c["BLOCK_N"],
            c["MAX_SPLITS"],
            s["options"]["num_stages"],
            c["EARLY_TILE"],
            c["LATE_LAUNCH"],
            s["options"]["num_warps"],
        ): b
        for s, b in zip(specs, _compiled_shared(specs))
        for c in [s["constexprs"]]
    }
    for chain in chains:
        fits = [shape for shape in chain if shared[shape] <= limit]
        assert fits, f"no shape of {chain} fits {limit} bytes: {[shared[s] for s in chain]}"
    if kind in ("bf16", "8-bit", "fp16"):  # the shape tried first there (and compiled ahead on a first start) fits
        assert all(shared[first] <= limit for first in firsts), [(first, shared[first]) for first in firsts]
    # the bound that rules shapes out is at most what Triton asks for each (8-bit: V transposed, a byte a value)
    bound = {
        key(c): decode_attention.decode_pipeline_bytes(c, d, decode_attention.decode_tile_bytes(k, v), arch >= 80)
        for config in configs
        for c in [attn.resolve(config), *decode_attention.decode_attention_fallbacks(attn.resolve(config))]
    }
    assert all(bound[shape] <= shared[shape] for shape in bound), {s: (bound[s], shared[s]) for s in bound}


def _as_hopper_launch(spec: dict) -> dict:
    """A prefill attention launch as a GPU of compute capability 9.0+ makes it (features.prefill_tma_supported,
    pdl_supported): programmatic dependent launch on and, in one pass, K/V read through tensor descriptors (TMA)
    of [BLOCK_N, D] tiles (PrefillAttention._kv_args) in place of pointers."""
    c = spec["constexprs"]
    if c["SPLIT"]:
        return dict(spec, constexprs={**c, "PDL": True})
    names = list(spec["signature"])
    desc = f"tensordesc<{spec['signature']['k_ptr'][1:]}[{c['BLOCK_N']}, {c['D']}]>"
    return dict(
        spec,
        signature={**spec["signature"], "k_ptr": desc, "v_ptr": desc},
        constexprs={**c, "PDL": True, "TMA": True},
        aligned=[i for i in spec["aligned"] if names[i] not in ("k_ptr", "v_ptr")],
    )


@pytest.mark.parametrize(
    "dtype, arch, limit",
    [
        (torch.bfloat16, 86, SMALL_GPU_SHARED),
        (torch.float16, 75, TURING_SHARED),
        (torch.bfloat16, 120, SMALL_GPU_SHARED),
    ],
)
def test_on_a_small_gpu_the_prefill_attention_falls_back_to_a_shape_that_fits(launches, dtype, arch, limit):
    """The same for the prefill attention at the 1.5B's shapes: its tuned tile shape and then its FALLBACKS
    (what PrefillAttention runs when Triton refuses a launch for shared memory), compiled for an RTX 30-series
    card (bf16), a Turing card (fp16) and an RTX 50-series card (sm_120: 99 KB, with TMA loads and programmatic
    dependent launch as on Hopper): some shape fits, in one pass and in key splits."""
    from model_loader.kernels import prefill_attention

    hq, hkv, d, t, start = 12, 2, 128, 16, 8
    g = torch.Generator().manual_seed(10)
    k, v = (torch.randn(hkv, 64, d, generator=g).to(dtype) for _ in range(2))
    q = torch.randn(t, hq, d, generator=g).to(dtype)
    attn = prefill_attention.PrefillAttention(hq, hkv, d, "cpu", max_tokens=64)
    chain = [attn._tuned(t), *prefill_attention.PrefillAttention.FALLBACKS]
    for shape in chain:
        attn._tuned = lambda n, shape=shape: shape
        for splits in (1, 2):
            attn(q, k, v, torch.tensor([start], dtype=torch.int32), d**-0.5, splits=splits)
    specs = [dict(spec, arch=arch) for spec in launches.values() if spec["name"] == "_prefill_attn_kernel"]
    if arch >= 90:
        specs = [_as_hopper_launch(spec) for spec in specs]
    shared = {}
    for spec, b in zip(specs, _compiled_shared(specs)):
        c = spec["constexprs"]
        shape = (c["BLOCK_M"], c["BLOCK_N"], spec["options"]["num_warps"], spec["options"]["num_stages"])
        shared[shape, c["SPLIT"]] = b
    for split in (False, True):
        assert any(shared[shape, split] <= limit for shape in chain), (split, shared)


def test_the_gemvs_read_their_weights_with_l2s_evict_first_policy(launches):
    """The dense and 4-bit GEMVs, as the engine launches them, compiled for sm_90: their weight loads carry an L2
    cache hint with the evict_first policy (gemv.GEMV_WEIGHT_EVICTION; the weights stream through L2 once a
    step and must not push out what is read again: 1-3% of a decode step on an H100), and the activations' loads
    don't."""
    from model_loader import awq as fmt
    from model_loader.kernels import gemv, int4_triton

    x = torch.randn(1, 256, dtype=torch.bfloat16)
    gemv.gemv(x, torch.randn(40, 256, dtype=torch.bfloat16), gemv.GEMV_CONFIGS[0])
    w = fmt.to_row_packed(torch.randint(0, 16, (256, 48)), torch.randint(0, 16, (2, 48)), torch.rand(2, 48).half(), 128)
    int4_triton.int4_gemv(x, w)
    found = {}
    for name, _, loads, hinted, evict_first in _compiled([dict(spec, arch=90) for spec in launches.values()]):
        found[name] = (int(loads), int(hinted), int(evict_first))
    assert found.keys() == {"_gemv_kernel", "_int4_gemv_kernel"}
    # the dense GEMV's weight: 3 chunks requested early and the loop's; the int4 one's: packed ints, scales, zeros
    least = {"_gemv_kernel": 4, "_int4_gemv_kernel": 3}
    for name, (loads, hinted, evict_first) in found.items():
        assert evict_first and least[name] <= hinted < loads, (name, found[name])  # x's loads: no hint
