"""Our Triton int4 kernels (row-packed AWQ weights) against the dequantised reference, and the engine's 4-bit
Triton path end to end. Without a GPU the kernels run in Triton's interpreter (see conftest.py)."""

import pytest
import torch

from model_loader import awq as fmt
from model_loader.engine import Engine
from model_loader.kernels import int4_triton
from model_loader.quantize import quantize


def _random_awq(n_out: int, k_in: int, group: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (k_in, n_out), generator=g)
    z = torch.randint(0, 16, (k_in // group, n_out), generator=g)
    s = (torch.rand(k_in // group, n_out, generator=g) * 0.05 + 0.001).half()
    return q, z, s


def _dtype(device):
    return torch.bfloat16 if device == "cuda" else torch.float32


# each group size (interleave 4, 8, 16, and 16 with two blocks per group) with widths that are and aren't
# a multiple of the configs' blocks per program
SHAPES = [(48, 256, 64), (40, 384, 128), (64, 1024, 32), (24, 768, 256), (16, 192, 64), (32, 896, 128), (24, 384, 32)]


@pytest.mark.parametrize("n_out,k_in,group", SHAPES)
def test_row_packed_layout_holds_awqs_numbers(n_out, k_in, group):
    q, z, s = _random_awq(n_out, k_in, group)
    w = fmt.to_row_packed(q, z, s, group)
    assert w.qweight.dtype == torch.int32 and w.qweight.shape == (n_out, k_in // 8)
    assert w.shape == (n_out, k_in) and w.interleave == fmt.row_pack_interleave(group)
    # the same numbers as AWQ's own packing, unpacked by the AWQ formula
    expected = fmt.dequantize(fmt.pack(q), fmt.pack(z), s, group)
    assert torch.equal(fmt.dequantize_row_packed(w), expected)
    assert w.nbytes() == n_out * k_in // 2 + 4 * n_out * (k_in // group)


@pytest.mark.parametrize("n_out,k_in,group", SHAPES)
@pytest.mark.parametrize("config", int4_triton.INT4_GEMV_CONFIGS)
def test_int4_gemv_matches_the_dequantized_weight(device, n_out, k_in, group, config):
    """Every config the autotuner may pick, including K splits and widths that aren't a multiple of the tile."""
    q, z, s = _random_awq(n_out, k_in, group)
    w = fmt.to_row_packed(q.to(device), z.to(device), s.to(device), group)
    x = torch.randn(1, k_in, generator=torch.Generator().manual_seed(1)).to(device, _dtype(device))
    dense = fmt.dequantize_row_packed(w)
    expected = x.float() @ dense.t()
    got = int4_triton.int4_gemv(x, w, config)
    assert got.shape == (1, n_out) and got.dtype == x.dtype
    tol = dict(atol=2e-2, rtol=2e-2) if device == "cuda" else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.float(), expected, **tol)


@pytest.mark.parametrize("n_out,k_in,group", SHAPES + [(2048 + 8, 1536, 128)])
def test_int4_dequantize_writes_the_dense_weight(device, n_out, k_in, group):
    q, z, s = _random_awq(n_out, k_in, group)
    w = fmt.to_row_packed(q.to(device), z.to(device), s.to(device), group)
    scratch = torch.full((n_out * k_in + 100,), float("nan"), device=device, dtype=_dtype(device))
    dense = int4_triton.int4_dequantize(w, scratch)
    assert dense.shape == (n_out, k_in)
    torch.testing.assert_close(dense, fmt.dequantize_row_packed(w).to(dense.dtype), atol=0, rtol=0)
    assert torch.isnan(scratch[n_out * k_in :]).all()  # nothing written past the weight


@pytest.fixture(scope="module")
def tiny_awq(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("int4") / "tiny-awq"
    quantize(tiny_model, out, group_size=32, samples=2, seq_len=64, device="cpu", clip=False)
    return out


def test_engine_runs_awq_on_the_triton_int4_kernels(tiny_awq, device):
    """Prefill (dequantise + matmul) and single-token decode (int4 GEMV) on the Triton path give the logits of
    the same checkpoint dequantised to dense at load."""
    triton_engine = Engine.load(tiny_awq, device=device, use_triton=True, dtype="fp32", context_length=256)
    assert triton_engine.info.quantization == "awq-int4 (Triton int4 kernels)"
    layer = triton_engine.model.w["layers"][0]
    assert all(isinstance(layer[k], fmt.RowPackedInt4) for k in ("qkv_w", "o_w", "gate_up_w", "down_w"))
    dense_engine = Engine.load(
        tiny_awq, device=device, use_triton=True, dtype="fp32", context_length=256, int4_kernel="dequantize"
    )
    assert dense_engine.info.quantization == "awq (dequantized to float32)"
    assert isinstance(dense_engine.model.w["layers"][0]["qkv_w"], torch.Tensor)
    # 4-bit weights + their scales and zeros: well under half of the dense fp32 linears
    assert triton_engine.model.weights_bytes < dense_engine.model.weights_bytes
    ids = torch.tensor(triton_engine.chat.render([{"role": "user", "content": "Hello there"}]).ids, device=device)
    n = ids.numel()
    for engine in (triton_engine, dense_engine):
        engine.prefill_logits = engine.model.prefill(ids, 0, all_logits=True)
        pos_t = torch.tensor([n], device=device, dtype=torch.int32)
        engine.decode_logits = engine.model.decode(ids[-1:], pos_t, n)
    torch.testing.assert_close(triton_engine.prefill_logits, dense_engine.prefill_logits, atol=1e-4, rtol=1e-4)
    # the GEMV's float-exponent trick keeps about 15 bits of each product sum (int4_triton._int4_dot_blocks):
    # on a GPU (fp32 FMAs, not the interpreter's numpy) that shows at 1e-4; a misplaced nibble is 100x more
    torch.testing.assert_close(triton_engine.decode_logits, dense_engine.decode_logits, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("config", [int4_triton.DEFAULT_INT4_GEMV, (16, 2, 1, 1), (32, 8, 8, 1), (16, 1, 2, 4)])
def test_gate_up_gemv_outputs_silu_gate_times_up(device, config):
    """The MLP's gate/up weight is stored with its rows in (gate, up) pairs, so its GEMV outputs SiLU(gate) * up:
    the numbers of the plain GEMV followed by the separate SiLU kernel; its dense copy keeps [gate; up]."""
    from model_loader.kernels import reference

    q, z, s = _random_awq(2 * 40, 768, 128)
    plain = fmt.to_row_packed(q.to(device), z.to(device), s.to(device), 128)
    paired = fmt.pair_gate_up(plain)
    assert paired.gate_up_pairs and torch.equal(fmt.dequantize_row_packed(paired), fmt.dequantize_row_packed(plain))
    x = torch.randn(1, 768, generator=torch.Generator().manual_seed(2)).to(device, _dtype(device))
    expected = reference.silu_mul(int4_triton.int4_gemv(x, plain, config))
    got = int4_triton.int4_gemv(x, paired, config, silu_output=True)
    assert got.shape == (1, 40)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    scratch = torch.empty(80 * 768, device=device, dtype=_dtype(device))
    torch.testing.assert_close(
        int4_triton.int4_dequantize(paired, scratch), fmt.dequantize_row_packed(plain).to(scratch.dtype), atol=0, rtol=0
    )
    with pytest.raises(ValueError, match="rows in pairs"):
        int4_triton.int4_gemv(x, plain, config, silu_output=True)


@pytest.mark.parametrize(
    "n_out,k_in,group,inner_k_tiles", [(16, 256, 64, 8), (24, 128, 32, 2), (40, 512, 128, 4), (8, 768, 256, 8)]
)
def test_dequantizer_of_torchs_cuda_int4_layout(device, n_out, k_in, group, inner_k_tiles):
    """Prefill on torch's int4 path dequantises its tile layout into the scratch buffer for cuBLAS. The layout
    comes from torch's CUDA source (awq.cuda_int4pack_layout); on a GPU the engine checks it against torch's
    own kernel at load (test below), here against the AWQ formula with the scales rounded as torch stores them."""
    q, z, s = _random_awq(n_out, k_in, group)
    w_uint8, sz = fmt.int4pack_inputs(q, z, s)
    packed = fmt.cuda_int4pack_layout(w_uint8, inner_k_tiles)
    assert packed.shape == (n_out // 8, k_in // (16 * inner_k_tiles), 32, inner_k_tiles // 2)
    weight = fmt.Int4Weight(packed.to(device), sz.to(device), group, n_out, k_in)
    dense = int4_triton.int4pack_dequantize(weight, torch.empty(n_out * k_in, dtype=torch.float32, device=device)).cpu()
    scale = sz[..., 0].float().repeat_interleave(group, dim=0).t()
    zero = sz[..., 1].float().repeat_interleave(group, dim=0).t()
    torch.testing.assert_close(dense, (q.t().float() - 8) * scale + zero, atol=0, rtol=0)
    # and that is AWQ's weight, up to storing scale and zero in bf16
    reference = fmt.dequantize_ints(q, z, s, group)
    assert (dense - reference).abs().max() <= 0.02 * reference.abs().max()


def test_the_load_time_check_of_that_dequantizer_catches_a_wrong_layout(device):
    """On a GPU the engine runs torch's int4 kernel on identity rows and only prefills through our dequantiser
    when it reproduces them. Here torch's kernel is stood in for by the AWQ formula; a layout with two lanes
    swapped must be refused, the right one accepted."""
    from model_loader.linears import Linears

    q, z, s = _random_awq(16, 512, 128)
    w_uint8, sz = fmt.int4pack_inputs(q, z, s)
    good = fmt.Int4Weight(fmt.cuda_int4pack_layout(w_uint8, 8).to(device), sz.to(device), 128, 16, 512)
    swapped = good.packed.clone()
    swapped[:, :, [0, 1]] = swapped[:, :, [1, 0]]
    bad = fmt.Int4Weight(swapped, good.scales_and_zeros, 128, 16, 512)
    dense = (
        (q.t().float() - 8) * sz[..., 0].float().repeat_interleave(128, 0).t()
        + sz[..., 1].float().repeat_interleave(128, 0).t()
    ).to(device)

    def torch_kernel(x, w):  # what aten._weight_int4pack_mm computes, from the unpermuted numbers
        return x @ dense.t()

    def engine_with(weight):
        linears = Linears({"layers": [{"qkv_w": weight}]}, device, torch.float32)
        return linears, linears.enable_int4pack_prefill(
            {"layers": [{"qkv_w": weight}]}, device, torch.float32, reference_linear=torch_kernel
        )

    linears, ok = engine_with(good)
    assert ok and linears.int4pack_prefill
    x = torch.randn(5, 512, device=device)
    torch.testing.assert_close(linears(x, good), x @ dense.t(), atol=1e-4, rtol=1e-4)  # prefill through cuBLAS
    linears, ok = engine_with(bad)
    assert not ok and not linears.int4pack_prefill and linears.scratch is None  # its memory given back


def test_close_frees_every_tensor_of_a_4bit_model_the_dequantise_scratch_included(tiny_awq, device):
    """Engine.close() must give back all the device memory: weights, KV cache, graphs and the 4-bit prefill's
    dequantise scratch buffer. Checked on the memory itself: every tensor the engine held is gone afterwards
    (weak references die), and on a GPU a second load, reply and close leave the allocator exactly where the
    first close left it (what a user switching models sees). The first cycle is the baseline because torch keeps
    a cuBLAS workspace per stream that has run cuBLAS for the life of the process; the engine runs everything
    on the default stream, one side stream (kernels.side_stream) and torch.cuda.graph's own capture stream (one
    per process), so none is added after that."""
    import gc
    import weakref

    from model_loader.events import SamplingSettings

    def load_reply_close() -> None:
        engine = Engine.load(tiny_awq, device=device, use_triton=True, dtype="fp32", context_length=256)
        engine.warm_up()
        list(engine.generate([{"role": "user", "content": "Hi"}], SamplingSettings(temperature=0, max_new_tokens=3)))
        assert engine.model.linear.scratch is not None and engine.model.linear.scratch_bytes > 0
        held = [weakref.ref(t) for t in _tensors_of(engine)]
        assert len(held) > 10 and any(r() is engine.model.linear.scratch for r in held)
        engine.close()
        gc.collect()
        alive = [r() for r in held if r() is not None]
        assert not alive, [tuple(t.shape) for t in alive]

    load_reply_close()
    if device == "cuda":
        torch.cuda.synchronize()
        after_first = torch.cuda.memory_allocated()
        load_reply_close()
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() <= after_first + 2**20  # within a MiB


def _tensors_of(root) -> list:
    """Every tensor reachable from `root` through attributes, dicts, lists and tuples."""
    found, seen, stack = [], set(), [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.append(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type) and type(obj).__module__.startswith("model_loader"):
            stack.extend(vars(obj).values())
    return found


def test_warm_up_compiles_and_times_only_the_int4_configs_that_can_win(monkeypatch, device):
    """A weight use measured on the H200 gets only its listed GEMV configurations, both in the pass that
    compiles them ahead (Linears.call_every_candidate) and in the tuning that times them, and the first of them
    before tuning; any other shape tries every configuration. (Each configuration is a compile of 1-2 s on a
    first start.) The lists apply only where they were measured: Hopper GPUs, group size 128."""
    from model_loader.linears import Linears

    every = tuple(int4_triton.INT4_GEMV_CONFIGS)
    # the real table, on this device: the R1-1.5B's qkv weight (group 128)
    qkv = _on(fmt.to_row_packed(*_random_awq(2048, 1536, 128), 128), device)
    hopper = device == "cuda" and torch.cuda.get_device_capability()[0] == 9
    assert int4_triton.int4_gemv_candidates(qkv, False) == (
        int4_triton.INT4_GEMV_MEASURED[(2048, 1536, False)] if hopper else every
    )
    for configs in int4_triton.INT4_GEMV_MEASURED.values():
        assert configs and set(configs) <= set(every)

    # compile pass, tuning and the untuned choice agree, for a measured use and for others
    measured = ((64, 2, 4, 1), (32, 4, 4, 3))
    monkeypatch.setitem(int4_triton.INT4_GEMV_MEASURED, (48, 256, False), measured)
    monkeypatch.setattr(int4_triton, "_measured_here", lambda w: True)

    def packed(n_out, k_in, pairs=False):
        w = fmt.to_row_packed(*_random_awq(n_out, k_in, 64), 64)
        return fmt.pair_gate_up(w) if pairs else w

    weights = {
        "layers": [
            {
                "qkv_w": packed(48, 256),
                "o_w": packed(40, 384),
                "gate_up_w": packed(64, 256, True),
                "down_w": packed(48, 256),
            }
        ]
    }
    compiled, timed = [], []
    real_gemv = int4_triton.int4_gemv
    monkeypatch.setattr(
        int4_triton,
        "int4_gemv",
        lambda x, w, config, silu_output=False: compiled.append((w.shape, silu_output, config)),
    )
    linears = Linears(weights, "cpu", torch.float32)
    linears.call_every_candidate(weights, torch.float32)
    expected = {((48, 256), False): measured, ((40, 384), False): every, ((64, 256), True): every}
    assert {
        (shape, silu): tuple(c for s, si, c in compiled if (s, si) == (shape, silu)) for shape, silu in expected
    } == expected
    # untuned, a single token runs the first candidate
    monkeypatch.setattr(int4_triton, "int4_gemv", real_gemv)
    used = []
    monkeypatch.setattr(int4_triton, "_int4_gemv_kernel", _RecordingKernel(int4_triton._int4_gemv_kernel, used))
    x = torch.randn(1, 256, device=device)
    w = _on(weights["layers"][0]["qkv_w"], device)  # the same shape: the same untuned choice
    torch.testing.assert_close(linears(x, w), x @ fmt.dequantize_row_packed(w).t(), rtol=1e-3, atol=1e-3)
    assert used[-1]["BLOCK_N"] == measured[0][0] and used[-1]["NB"] == measured[0][1]
    monkeypatch.setattr(
        int4_triton,
        "time_configs",
        lambda ws, configs, call: timed.append((ws[0].shape, ws[0].gate_up_pairs, tuple(configs))) or {},
    )
    result = linears.tune(weights, torch.float32)
    assert {(shape, silu): configs for shape, silu, configs in timed} == expected
    # nothing could be timed: the first candidate of each use
    assert linears.int4_choice[((48, 256), False)] == measured[0]
    assert result["choice"]["48x256"] == f"triton int4 {measured[0]}"


def _on(w, device):
    """A RowPackedInt4 with its tensors on `device`."""
    return fmt.RowPackedInt4(
        w.qweight.to(device), w.scales.to(device), w.zeros.to(device), w.group_size, w.interleave, w.gate_up_pairs
    )


class _RecordingKernel:
    """Wraps a Triton kernel so each launch's constexprs are recorded (kernel[grid](...) passes through)."""

    def __init__(self, kernel, calls: list):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        launcher = self.kernel[grid]

        def run(*args, **kwargs):
            self.calls.append(kwargs)
            return launcher(*args, **kwargs)

        return run

    def __getattr__(self, name):
        return getattr(self.kernel, name)


def test_decode_rows_go_to_torchs_int4_kernel_where_it_was_timed_faster(device, monkeypatch):
    """A scheduler's decode steps (a few rows) of a torch-layout 4-bit weight run torch's int4 kernel where
    choose_int4pack_rows timed it faster than dequantise + cuBLAS, and only those row counts; a prompt's rows stay
    on cuBLAS. Torch's kernel is stood in for by the AWQ formula (it runs on CUDA only), marked by its caller; on a
    GPU the real choice is timed and checked too."""
    from model_loader import linears as linears_module
    from model_loader.linears import Linears

    q, z, s = _random_awq(16, 512, 128)
    w_uint8, sz = fmt.int4pack_inputs(q, z, s)
    weight = fmt.Int4Weight(fmt.cuda_int4pack_layout(w_uint8, 8).to(device), sz.to(device), 128, 16, 512)
    dense = (
        (q.t().float() - 8) * sz[..., 0].float().repeat_interleave(128, 0).t()
        + sz[..., 1].float().repeat_interleave(128, 0).t()
    ).to(device)
    calls = []

    def torch_kernel(x, w):
        calls.append(x.shape[0])
        return x @ dense.t()

    weights = {"layers": [{"qkv_w": weight}]}
    linears = Linears(weights, device, torch.float32)
    assert linears.enable_int4pack_prefill(weights, device, torch.float32, reference_linear=torch_kernel)
    monkeypatch.setattr(linears_module, "int4_linear", torch_kernel)
    linears.int4pack_rows = {((16, 512), 8): True, ((16, 512), 4): False}
    calls.clear()
    for rows in (8, 4, 5, 64, 1):
        x = torch.randn(rows, 512, device=device)
        torch.testing.assert_close(linears(x, weight), x @ dense.t(), atol=1e-4, rtol=1e-4)
    assert calls == [8, 1]  # 4 (timed slower), 5 and 64 (not timed) through the dequantiser and cuBLAS
    if device == "cuda":
        monkeypatch.undo()
        _check_the_timed_choice_on_the_gpu()


def _check_the_timed_choice_on_the_gpu():
    """choose_int4pack_rows times both paths for every row count asked (torch's kernel and CUDA graphs: a GPU's),
    and the linears then give the same numbers (to bf16 rounding) whichever path each row count took."""
    from model_loader.linears import Linears

    q, z, s = _random_awq(1536, 1536, 128)
    weight = fmt.to_int4pack(q.cuda(), z.cuda(), s.cuda(), 128)
    weights = {"layers": [{"o_w": weight}, {"o_w": fmt.to_int4pack(q.cuda(), z.cuda(), s.cuda(), 128)}]}
    linears = Linears(weights, "cuda", torch.bfloat16)
    assert linears.enable_int4pack_prefill(weights, "cuda", torch.bfloat16)
    report = linears.choose_int4pack_rows(weights, [1, 2, 8, 32])
    assert set(report["1536x1536"]) == {2, 8, 32}
    assert all(len(timings) == 2 for timings in report["1536x1536"].values())
    assert {rows for (_, rows) in linears.int4pack_rows} == {2, 8, 32}
    reference = fmt.dequantize_ints(q, z, s, 128).t().cuda().float()
    for rows in (2, 8, 32):
        x = torch.randn(rows, 1536, device="cuda", dtype=torch.bfloat16)
        got, want = linears(x, weight).float(), x.float() @ reference.t()
        assert (got - want).abs().max() <= 0.02 * want.abs().max()
