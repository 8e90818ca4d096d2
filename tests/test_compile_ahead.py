"""A first start compiles its kernels on a shape twin of the model while the weights load
(model_loader.compile_ahead). The twin must present every kernel with what the loaded model will: the same
weight layouts, dtypes, shapes and strides per layer, the same cache strides; only the layer count, the token
table and the values differ. (On a GPU, tests/test_precompile.py checks the consequence: the warm-up compiles
nothing itself.)"""

import pytest
import torch

from model_loader.awq import Int4Weight, RowPackedInt4
from model_loader.compile_ahead import TWIN_VOCAB, twin_bytes, twin_config
from model_loader.locate import resolve_model
from model_loader.qwen2 import Qwen2Model
from model_loader.weights import load_weights, twin_entries


def _layout(t):
    """What a kernel specialises on: the type, and each tensor's dtype, shape, strides and 16-byte alignment."""
    if isinstance(t, (RowPackedInt4, Int4Weight)):
        return type(t).__name__, {k: _layout(v) for k, v in vars(t).items()}
    if isinstance(t, torch.Tensor):
        return str(t.dtype), tuple(t.shape), t.stride(), t.data_ptr() % 16 == 0
    return t


def _loaded_and_twin(folder, int4_layout):
    spec = resolve_model(folder)
    cfg = spec.config
    real = load_weights(cfg, spec.shards, "cpu", torch.float32, awq=cfg.awq, int4_layout=int4_layout)
    small = twin_config(cfg)
    twin = load_weights(
        small,
        spec.shards,
        "cpu",
        torch.float32,
        awq=cfg.awq,
        int4_layout=int4_layout,
        entries=twin_entries(cfg, spec.shards, cfg.awq, small),
        read_values=False,
    )
    return cfg, real, small, twin


@pytest.mark.parametrize("kind", ["dense", "awq-triton", "awq-dequantized"])
def test_the_twin_has_one_layer_laid_out_as_every_layer_of_the_model(kind, tiny_model, request):
    folder = tiny_model if kind == "dense" else request.getfixturevalue("awq_model")
    cfg, real, small, twin = _loaded_and_twin(folder, "triton" if kind == "awq-triton" else None)
    assert small.num_hidden_layers == 1 and len(twin["layers"]) == 1 < cfg.num_hidden_layers
    expected = {k: _layout(v) for k, v in real["layers"][0].items()}
    assert {k: _layout(v) for k, v in twin["layers"][0].items()} == expected
    assert all({k: _layout(v) for k, v in layer.items()} == expected for layer in real["layers"])
    if kind == "awq-triton":
        gate_up = twin["layers"][0]["gate_up_w"]
        assert isinstance(gate_up, RowPackedInt4) and gate_up.gate_up_pairs
    assert twin["embed"].shape == (TWIN_VOCAB, cfg.hidden_size) and twin["embed"].dtype == real["embed"].dtype
    assert _layout(twin["norm"]) == _layout(real["norm"])


def test_the_twins_cache_has_the_models_strides(tiny_model):
    cfg, real, small, twin = _loaded_and_twin(tiny_model, None)
    model = Qwen2Model(cfg, real, "cpu", torch.float32, 256, use_triton=False)
    shadow = Qwen2Model(small, twin, "cpu", torch.float32, 256, use_triton=False)
    assert _layout(shadow.k_cache[0]) == _layout(model.k_cache[-1]) and _layout(shadow.cos) == _layout(model.cos)


def test_the_twin_is_read_from_headers_only(tiny_model, tmp_path):
    """No tensor data is read: a checkpoint whose data is zeroed out (headers intact) gives the same twin."""
    import shutil

    copy = tmp_path / "m"
    shutil.copytree(tiny_model, copy)
    shard = next(copy.glob("*.safetensors"))
    raw = bytearray(shard.read_bytes())
    header = 8 + int.from_bytes(raw[:8], "little")
    raw[header:] = bytes(len(raw) - header)
    shard.write_bytes(raw)
    cfg, real, small, twin = _loaded_and_twin(copy, None)
    assert not real["layers"][0]["qkv_w"].any()  # the real load did read the zeroed data
    assert twin["layers"][0]["qkv_w"].shape == real["layers"][0]["qkv_w"].shape


def test_the_twins_memory_bound_covers_a_layer_and_a_long_prefill(tiny_model):
    cfg = resolve_model(tiny_model).config
    layer = sum(t.numel() * t.element_size() for t in _loaded_and_twin(tiny_model, None)[1]["layers"][0].values())
    kv = 2 * cfg.num_key_value_heads * 4096 * cfg.head_dim * 2
    assert twin_bytes(cfg, torch.bfloat16, 4096) > layer + kv + 2048 * 2 * cfg.intermediate_size * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_loads_memory_bound_is_what_the_weights_take(tiny_model, dtype):
    """The room a twin must leave (CompileBesideLoad.start_if_room) counts the weights as loaded, in the model's
    dtype whatever the checkpoint's, and leaves out an embedding table kept in host memory."""
    from model_loader.weights import load_peak_bytes

    spec = resolve_model(tiny_model)
    cfg = spec.config
    real = load_weights(cfg, spec.shards, "cpu", dtype)
    tensors = {
        t.data_ptr(): t
        for t in [real["embed"], real["lm_head"], real["norm"]]
        + [t for layer in real["layers"] for t in layer.values()]
    }
    loaded = sum(t.numel() * t.element_size() for t in tensors.values())
    assert load_peak_bytes(cfg, spec.shards, dtype, embed_on_host=False) == loaded
    embed = real["embed"].numel() * real["embed"].element_size()
    expected_on_host = loaded if cfg.tie_word_embeddings else loaded - embed
    assert load_peak_bytes(cfg, spec.shards, dtype, embed_on_host=True) == expected_on_host


def test_the_walk_over_the_twin_goes_through_the_prefill_attention_and_the_one_row_path(tiny_model, attention_calls):
    """The twin's one layer is also its last, whose prefill skips the full attention (Qwen2Model.
    last_layer_rows_only): the walk must still go through the attention every other layer runs (its kernels
    compile on the twin or nowhere ahead), and through the one-row path, and leave the twin as it found it."""
    from model_loader.compile_ahead import walk_warm_up_paths

    cfg, real, small, twin = _loaded_and_twin(tiny_model, None)
    shadow = Qwen2Model(small, twin, "cpu", torch.float32, 256, use_triton=False)
    calls = attention_calls(shadow)
    walk_warm_up_paths(shadow, [], graphs=False)
    assert calls["rows"] >= 2 and calls["one row"] >= 1, calls  # fresh and after a prefix; the row path
    assert shadow.last_layer_rows_only
