"""`r1desk-cli quantize` (model_loader.quantize): the group round-to-nearest it starts from, its AWQ scales and
clipping against plain round-to-nearest on a model with outlier channels, and the quantize -> load -> chat round
trip."""

import json
import shutil

import pytest
import torch

from model_loader import awq as fmt
from model_loader.engine import Engine
from model_loader.errors import ModelError
from model_loader.events import Finished, SamplingSettings
from model_loader.quantize import pseudo_quantize, quantize


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
