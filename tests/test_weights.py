"""The safetensors checks (model_loader.weights): a truncated or corrupt shard, tensors missing, misshaped,
overlapping or in two shards, weights that don't match config.json, each refused with a one-line message naming
the file and the problem, before any tensor is read."""

import json

import pytest
import torch
from model_folders import edit_config, expect_error


def test_truncated_shard(model_copy):
    path = model_copy / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    expect_error(model_copy, "model.safetensors", "truncated safetensors file")


def test_corrupt_header(model_copy):
    path = model_copy / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:20] = b"\x00garbage!!!!"
    path.write_bytes(bytes(data))
    expect_error(model_copy, "model.safetensors", "corrupt safetensors header")


def test_empty_shard(model_copy):
    (model_copy / "model.safetensors").write_bytes(b"")
    expect_error(model_copy, "model.safetensors", "truncated")


def _rewrite_without(model_copy, drop=None, reshape=None):
    from safetensors.torch import load_file, save_file

    tensors = load_file(model_copy / "model.safetensors")
    if drop:
        del tensors[drop]
    if reshape:
        tensors[reshape] = tensors[reshape][:-1].contiguous()
    save_file(tensors, model_copy / "model.safetensors")


def test_missing_tensor(model_copy):
    _rewrite_without(model_copy, drop="model.layers.1.mlp.down_proj.weight")
    expect_error(model_copy, "model.safetensors", "missing tensor model.layers.1.mlp.down_proj.weight")


def test_misshaped_tensor(model_copy):
    _rewrite_without(model_copy, reshape="model.layers.0.self_attn.k_proj.weight")
    expect_error(model_copy, "model.layers.0.self_attn.k_proj.weight", "has shape [31, 64]", "[32, 64]")


def test_config_that_does_not_match_the_weights(model_copy):
    edit_config(model_copy, hidden_size=128)
    expect_error(model_copy, "model.safetensors", "config.json implies")


def test_quantized_weights_without_a_quantization_config_say_so(model_copy):
    """An AWQ checkpoint whose config.json lost its quantization_config (its linears are qweight/qzeros/scales):
    "missing tensor ...q_proj.weight" did not say why."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(model_copy / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj."
    tensors[name + "qweight"] = tensors.pop(name + "weight").view(torch.int32)
    save_file(tensors, model_copy / "model.safetensors")
    expect_error(model_copy, name + "qweight", "no quantization_config")


def test_more_layers_in_config_than_in_the_weights_is_said_at_once(model_copy):
    """A typo of 10**9 layers used to list every tensor of every layer first (2.7 GB and 14 s at 10**6)."""
    edit_config(model_copy, num_hidden_layers=10**9)
    expect_error(model_copy, "config.json says 1000000000 layers, the weights hold 2")


def _rewrite_header(model_copy, change):
    """model.safetensors with change(header dict) applied and the data kept as it is."""
    import struct

    path = model_copy / "model.safetensors"
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    change(header)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])


def _first_two(header):
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    return names[0], names[1]


def test_a_header_whose_tensors_share_bytes_is_refused(model_copy):
    """Two names on one byte range load one tensor's bytes as another's: garbage weights, no error."""

    def alias(header):
        a, b = _first_two(header)
        header[b]["data_offsets"] = header[a]["data_offsets"]
        header[b]["shape"], header[b]["dtype"] = header[a]["shape"], header[a]["dtype"]

    _rewrite_header(model_copy, alias)
    expect_error(model_copy, "model.safetensors", "overlapping or misplaced tensors")


@pytest.mark.parametrize("bad", ["float offsets", "string offsets", "float shape"])
def test_a_header_with_numbers_that_are_not_integers_is_refused(model_copy, bad):
    def change(header):
        a, _ = _first_two(header)
        begin, end = header[a]["data_offsets"]
        if bad == "float offsets":
            header[a]["data_offsets"] = [float(begin), float(end)]
        elif bad == "string offsets":
            header[a]["data_offsets"] = [str(begin), str(end)]
        else:
            header[a]["shape"] = [d + 0.7 for d in header[a]["shape"]]

    _rewrite_header(model_copy, change)
    expect_error(model_copy, "model.safetensors", "corrupt safetensors header entry")


def test_a_tensor_in_two_shards_is_refused(model_copy):
    """The index said one shard and the other held a zeroed copy: the last shard read won, silently."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(model_copy / "model.safetensors")
    save_file(tensors, model_copy / "model-00001-of-00002.safetensors")
    save_file({"lm_head.weight": tensors["lm_head.weight"] * 0}, model_copy / "model-00002-of-00002.safetensors")
    (model_copy / "model.safetensors").unlink()
    weight_map = {name: "model-00001-of-00002.safetensors" for name in tensors}
    weight_map["model.norm.weight"] = "model-00002-of-00002.safetensors"  # the index lists both shards
    (model_copy / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    expect_error(model_copy, "lm_head.weight", "holds it twice")
