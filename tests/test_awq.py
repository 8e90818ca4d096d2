"""AWQ: the GEMM packing against an independent implementation, the int4 kernel layout, our quantizer against
plain round-to-nearest, the quantize -> load -> chat round trip, and malformed AWQ folders."""

import json
import shutil

import pytest
import torch

from model_loader import awq as fmt
from model_loader.engine import Engine
from model_loader.errors import ModelError
from model_loader.events import Finished, SamplingSettings
from model_loader.quantize import pseudo_quantize, quantize


def reference_pack(intweight: torch.Tensor) -> torch.Tensor:
    """AutoAWQ's WQLinear_GEMM packing loop, written out as in the original (intweight [in, out])."""
    order_map = [0, 2, 4, 6, 1, 3, 5, 7]
    packed = torch.zeros((intweight.shape[0], intweight.shape[1] // 8), dtype=torch.int32)
    for col in range(intweight.shape[1] // 8):
        for i in range(8):
            packed[:, col] |= intweight[:, col * 8 + order_map[i]].to(torch.int32) << (i * 4)
    return packed


def reference_dequant(qweight, qzeros, scales, group):
    """W[o, i] = (q - z) * s, unpacking nibble by nibble with Python ints."""
    inv = {0: 0, 2: 1, 4: 2, 6: 3, 1: 4, 3: 5, 5: 6, 7: 7}  # column-in-group -> nibble index

    def nib(packed, row, col):
        word = int(packed[row, col // 8]) & 0xFFFFFFFF
        return (word >> (4 * inv[col % 8])) & 0xF

    n_in, n_out = qweight.shape[0], qweight.shape[1] * 8
    w = torch.empty(n_out, n_in)
    for i in range(n_in):
        for o in range(n_out):
            w[o, i] = (nib(qweight, i, o) - nib(qzeros, i // group, o)) * float(scales[i // group, o])
    return w


def test_pack_unpack_round_trip_matches_autoawq_layout():
    g = torch.Generator().manual_seed(0)
    ints = torch.randint(0, 16, (64, 48), generator=g)
    packed = fmt.pack(ints)
    assert torch.equal(packed, reference_pack(ints))
    assert torch.equal(fmt.unpack(packed), ints.int())


def test_dequantize_matches_the_awq_formula():
    g = torch.Generator().manual_seed(1)
    n_in, n_out, group = 64, 16, 32
    qweight = fmt.pack(torch.randint(0, 16, (n_in, n_out), generator=g))
    qzeros = fmt.pack(torch.randint(0, 16, (n_in // group, n_out), generator=g))
    scales = (torch.rand(n_in // group, n_out, generator=g) + 0.1).half()
    torch.testing.assert_close(
        fmt.dequantize(qweight, qzeros, scales, group), reference_dequant(qweight, qzeros, scales, group)
    )


def test_int4pack_layout_matches_the_dequantized_reference():
    """(q - 8) * s + (8 - z) * s == (q - z) * s, in the byte layout torch's int4 kernel expects."""
    g = torch.Generator().manual_seed(2)
    n_in, n_out, group = 256, 64, 128
    q = torch.randint(0, 16, (n_in, n_out), generator=g, dtype=torch.int32)
    z = torch.randint(0, 16, (n_in // group, n_out), generator=g, dtype=torch.int32)
    s = (torch.rand(n_in // group, n_out, generator=g) * 0.02 + 0.005).half()
    dense = fmt.dequantize_ints(q, z, s, group)  # [out, in]
    w_uint8, sz = fmt.int4pack_inputs(q, z, s)
    assert w_uint8.shape == (n_out, n_in // 2) and sz.shape == (n_in // group, n_out, 2)
    # bytes hold two nibbles, high first: unpacking them gives back q transposed
    unpacked = torch.stack([w_uint8 >> 4, w_uint8 & 0xF], dim=-1).reshape(n_out, n_in)
    assert torch.equal(unpacked.int(), q.t())
    x = torch.randn(3, n_in, generator=g).to(torch.bfloat16)
    expected = x.float() @ dense.t()
    if torch.cuda.is_available():
        w = fmt.to_int4pack(q.cuda(), z.cuda(), s.cuda(), group)
        got = fmt.int4_linear(x.cuda(), w).float().cpu()
    else:  # torch's CPU build of the same kernel takes int32 [out, in] instead of the CUDA byte packing
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.t().contiguous(), 2)
        got = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, sz).float()
    torch.testing.assert_close(got, expected, atol=0.02 * expected.abs().max().item(), rtol=0.02)


def test_pseudo_quantize_is_asymmetric_group_rtn():
    w = torch.tensor([[0.0, 1.0, 2.0, 3.0, -1.0, 1.0, 0.5, 0.25]])
    deq, ints, (scales, zeros) = pseudo_quantize(w, 4)
    assert ints.min() >= 0 and ints.max() <= 15
    torch.testing.assert_close(deq, w, atol=0.11, rtol=0)
    torch.testing.assert_close(scales[0], torch.tensor([3 / 15, 2 / 15]))


@pytest.fixture(scope="module")
def outlier_model(tiny_model, tmp_path_factory):
    """The tiny model with planted outlier activation channels: a few input-norm weights 30x larger."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("outliers") / "model"
    shutil.copytree(tiny_model, folder)
    tensors = load_file(folder / "model.safetensors")
    for name in list(tensors):
        if name.endswith("layernorm.weight"):
            t = tensors[name].float()
            t[[3, 17, 40]] *= 30
            tensors[name] = t.to(torch.bfloat16)
    save_file(tensors, folder / "model.safetensors")
    return folder


def _logits(folder, ids):
    engine = Engine.load(folder, device="cpu", dtype="fp32", context_length=512)
    return engine.model.prefill(torch.tensor(ids), 0, all_logits=True)


def _rtn_folder(src, dst, group):
    """Plain round-to-nearest at the same bits and group size, written in the same format (no scales, no clip)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    out = {}
    for name, t in tensors.items():
        if name.endswith("proj.weight"):
            _, ints, (scales, zeros) = pseudo_quantize(t.float(), group)
            base = name[: -len(".weight")]
            out[base + ".qweight"] = fmt.pack(ints.t().contiguous().int())
            out[base + ".qzeros"] = fmt.pack(zeros.t().contiguous().int())
            out[base + ".scales"] = scales.t().contiguous().half()
        else:
            out[name] = t.half()
    save_file(out, dst / "model.safetensors")
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "awq",
        "version": "gemm",
        "bits": 4,
        "zero_point": True,
        "group_size": group,
    }
    (dst / "config.json").write_text(json.dumps(cfg))


def test_awq_error_is_clearly_below_round_to_nearest(outlier_model, tmp_path):
    group = 32
    awq_dir = tmp_path / "awq"
    quantize(outlier_model, awq_dir, group_size=group, samples=8, seq_len=128, device="cpu")
    _rtn_folder(outlier_model, tmp_path / "rtn", group)
    engine = Engine.load(outlier_model, device="cpu")
    ids = engine.chat.render(
        [
            {
                "role": "user",
                "content": "An evaluation text, different from calibration: "
                "the quick brown fox jumps over the lazy dog. 1+1=2.",
            }
        ]
    ).ids
    ref = _logits(outlier_model, ids)
    err_awq = (_logits(awq_dir, ids) - ref).pow(2).mean().item()
    err_rtn = (_logits(tmp_path / "rtn", ids) - ref).pow(2).mean().item()
    assert err_awq < 0.7 * err_rtn, (err_awq, err_rtn)


def test_quantize_load_chat_round_trip(tiny_model, tmp_path):
    out = tmp_path / "tiny-awq"
    report = quantize(tiny_model, out, group_size=32, samples=4, seq_len=64, device="cpu")
    assert report.layers == 2 and report.calibration_tokens == 256
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"] == {
        "quant_method": "awq",
        "version": "gemm",
        "bits": 4,
        "zero_point": True,
        "group_size": 32,
        "modules_to_not_convert": None,
    }
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    from transformers import AwqConfig  # transformers' own parser accepts the quantization_config we write

    assert AwqConfig.from_dict(cfg["quantization_config"]).group_size == 32
    engine = Engine.load(out, device="cpu")
    assert engine.info.quantization.startswith("awq")
    final = [
        e
        for e in engine.generate(
            [{"role": "user", "content": "Hello"}], SamplingSettings(temperature=0, max_new_tokens=8)
        )
        if isinstance(e, Finished)
    ]
    assert final[0].stats.completion_tokens == 8
    # 4-bit keeps the model's function: logits stay close to the unquantized model's at every position
    ids = engine.chat.render([{"role": "user", "content": "Hello"}]).ids
    quantized = engine.model.prefill(torch.tensor(ids), 0, all_logits=True)
    dense = Engine.load(tiny_model, device="cpu").model.prefill(torch.tensor(ids), 0, all_logits=True)
    assert torch.nn.functional.cosine_similarity(quantized, dense, dim=-1).min() > 0.98


def test_quantize_refuses_a_group_size_that_does_not_divide(tiny_model, tmp_path):
    with pytest.raises(ModelError, match="group size 128 does not divide the layer width 64"):
        quantize(tiny_model, tmp_path / "x", group_size=128, samples=1, seq_len=32, device="cpu")


def _broken(awq_model, tmp_path, **qcfg):
    folder = tmp_path / "broken"
    shutil.copytree(awq_model, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"].update(qcfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(bits=8), "AWQ with 8 bits is not supported"),
        (dict(version="gemv_fast"), "AWQ version 'gemv_fast' is not supported"),
        (dict(zero_point=False), "without zero points"),
        (dict(group_size=48), "group size 48 is not supported"),
        (dict(group_size=128), "group size 128 does not divide the layer width 64"),
        (dict(quant_method="gptq"), "unsupported quantization 'gptq'"),
    ],
)
def test_malformed_awq_config(awq_model, tmp_path, change, message):
    with pytest.raises(ModelError) as info:
        Engine.load(_broken(awq_model, tmp_path, **change), device="cpu")
    assert message in str(info.value) and "config.json" in str(info.value)


def test_awq_shapes_that_do_not_match_the_config(awq_model, tmp_path):
    folder = _broken(awq_model, tmp_path, group_size=64)  # scales were written for 32
    with pytest.raises(ModelError, match=r"self_attn.q_proj.qzeros has shape \[2, 8\], config.json implies \[1, 8\]"):
        Engine.load(folder, device="cpu")


def test_the_4bit_models_embedding_table_stays_in_host_memory_on_a_gpu(awq_model, device):
    """4-bit users are saving VRAM: on a GPU the embedding table is read in place from page-locked host memory
    (weights.host_mapped_alias), not copied into VRAM; on the CPU there is nothing to save."""
    engine = Engine.load(awq_model, device=device, context_length=256)
    if device == "cuda":
        assert engine.model.embed_on_host
        assert (
            engine.model.w["embed"].is_cuda
            and engine.model.w["embed"].data_ptr() == engine.model.w["embed_host"].data_ptr()
        )
    else:
        assert not engine.model.embed_on_host and engine.model.w["embed"].device.type == "cpu"
    engine.close()
