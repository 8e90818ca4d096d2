"""AWQ checkpoints (model_loader.awq): the GEMM packing against an independent implementation, the int4 kernel
layout, malformed AWQ folders, and where a 4-bit model's tables live. The quantizer that writes them:
test_quantize.py."""

import json
import shutil

import pytest
import torch

from model_loader import awq as fmt
from model_loader.engine import Engine
from model_loader.errors import ModelError


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
