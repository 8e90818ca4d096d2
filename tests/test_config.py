"""config.json (model_loader.config): what a minimal one defaults to and what is derived from it, the AWQ
quantization_config read into an AwqConfig, and every bad value refused with a one-line message naming the file
and the field (through the load, as a user meets it: model_copy, tests/model_folders.py)."""

import json

import pytest
from model_folders import edit_config, expect_error

from model_loader.config import AwqConfig, read_config
from model_loader.errors import ModelError
from model_loader.locate import resolve_model

MINIMAL = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 1000,
}


def _read(tmp_path, **changes):
    (tmp_path / "config.json").write_text(json.dumps({**MINIMAL, **changes}))
    return read_config(tmp_path)


def test_a_minimal_config_takes_the_defaults_and_derives_the_head_layout(tmp_path):
    cfg = _read(tmp_path)
    assert (cfg.max_position_embeddings, cfg.rope_theta, cfg.rms_norm_eps) == (32768, 10000.0, 1e-6)
    assert (cfg.tie_word_embeddings, cfg.torch_dtype, cfg.bos_token_id, cfg.eos_token_id) == (
        False,
        "bfloat16",
        None,
        [],
    )
    assert cfg.num_key_value_heads == 4 and cfg.head_dim == 16  # no GQA, hidden_size / heads
    assert _read(tmp_path, num_attention_heads=2).head_dim == 32
    assert (cfg.q_size, cfg.kv_size) == (64, 64)
    assert cfg.awq is None and cfg.quantization_config is None


def test_the_values_given_are_read_as_given(tmp_path):
    cfg = _read(
        tmp_path,
        num_key_value_heads=2,
        head_dim=32,  # given: need not be hidden_size / heads
        max_position_embeddings=4096,
        rope_theta=1e6,
        tie_word_embeddings=True,
        dtype="float16",  # transformers' newer name for torch_dtype
        bos_token_id=7,
        eos_token_id=9,  # one id is a list of one
        rope_scaling={"rope_type": "default"},
    )
    assert (cfg.num_key_value_heads, cfg.head_dim, cfg.q_size, cfg.kv_size) == (2, 32, 128, 64)
    assert (cfg.max_position_embeddings, cfg.rope_theta, cfg.tie_word_embeddings) == (4096, 1e6, True)
    assert (cfg.torch_dtype, cfg.bos_token_id, cfg.eos_token_id) == ("float16", 7, [9])
    assert _read(tmp_path, eos_token_id=[9, 11], torch_dtype="bfloat16", dtype="float16").eos_token_id == [9, 11]
    assert _read(tmp_path, torch_dtype="bfloat16", dtype="float16").torch_dtype == "bfloat16"


@pytest.mark.parametrize(
    "changes, fragment",
    [
        ({"num_attention_heads": 3}, "hidden_size not divisible by num_attention_heads"),
        ({"num_key_value_heads": 3}, "num_attention_heads not a multiple of num_key_value_heads"),
        ({"vocab_size": 0}, "missing or non-positive vocab_size"),
        ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "unsupported rope_scaling"),
    ],
)
def test_a_head_layout_or_size_that_does_not_add_up_is_refused(tmp_path, changes, fragment):
    with pytest.raises(ModelError, match=fragment) as info:
        _read(tmp_path, **changes)
    assert str(info.value).startswith(str(tmp_path / "config.json"))


def test_an_awq_quantization_config_is_read_with_its_older_key_names(tmp_path):
    quantization = {"quant_method": "AWQ", "w_bit": 4, "q_group_size": 32, "modules_to_not_convert": ["lm_head"]}
    cfg = _read(tmp_path, quantization_config=quantization)
    assert cfg.awq == AwqConfig(group_size=32, modules_to_not_convert=("lm_head",))
    assert cfg.quantization_config == quantization
    assert cfg.awq.quantizes("model.layers.3.mlp.up_proj") and not cfg.awq.quantizes("lm_head")
    assert AwqConfig(group_size=128).quantizes("lm_head")  # nothing left out unless named
    with pytest.raises(ModelError, match="group size 32 does not divide the layer width 48"):
        _read(tmp_path, hidden_size=48, num_attention_heads=3, quantization_config=quantization)


def test_missing_config(model_copy):
    (model_copy / "config.json").unlink()
    expect_error(model_copy, "config.json", "missing config.json")


def test_invalid_config_json(model_copy):
    (model_copy / "config.json").write_text("{ not json")
    expect_error(model_copy, "config.json", "invalid config.json")


def test_unsupported_architecture(model_copy):
    edit_config(model_copy, architectures=["LlamaForCausalLM"], model_type="llama")
    expect_error(model_copy, "config.json", "unsupported architecture LlamaForCausalLM")


def test_remote_code_is_refused(model_copy):
    edit_config(model_copy, auto_map={"AutoModelForCausalLM": "modeling_x.Model"})
    expect_error(model_copy, "config.json", "never runs remote code")


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_key_value_heads", "2"),
        ("num_key_value_heads", 2.0),
        ("num_hidden_layers", True),
        ("architectures", [None]),
        ("rope_scaling", "yarn"),
        ("rope_theta", None),
        ("rope_theta", "abc"),
        ("rms_norm_eps", "x"),
        ("max_position_embeddings", "4096"),
        ("max_position_embeddings", -5),
        ("max_position_embeddings", 0),
        ("head_dim", "16"),
        ("tie_word_embeddings", "false"),
        ("eos_token_id", "151643"),
        ("quantization_config", "awq"),
    ],
)
def test_a_config_value_of_the_wrong_type_is_named(model_copy, field, value):
    """json's types are not the ones config.json means (true is 1, 2.0 is 2, "false" is true): each such value
    is a ModelError naming config.json and, where it is wrong by itself, the field (they were TypeErrors from
    deep inside the load, or silently taken: "false" tied the embeddings, null took the default)."""
    edit_config(model_copy, **{field: value})
    if field == "rope_theta" and value is None:  # null: the default, as transformers reads it
        assert resolve_model(model_copy).config.rope_theta == 10000.0
        return
    msg = expect_error(model_copy, "config.json")
    assert field in msg or field == "architectures" and "unsupported architecture" in msg, msg


@pytest.mark.parametrize(
    "quantization, fragment",
    [
        ({"group_size": 32.0}, "group size 32.0"),
        ({"modules_to_not_convert": [None]}, "modules_to_not_convert"),
        ({"modules_to_not_convert": "lm_head"}, "modules_to_not_convert"),
        ({"bits": "4"}, "'4' bits"),
    ],
)
def test_an_awq_config_value_of_the_wrong_type_is_named(model_copy, quantization, fragment):
    edit_config(
        model_copy,
        quantization_config={
            "quant_method": "awq",
            "bits": 4,
            "group_size": 32,
            "version": "gemm",
            "zero_point": True,
            **quantization,
        },
    )
    expect_error(model_copy, "config.json", fragment)


@pytest.mark.parametrize(
    "changes, fragment",
    [({"hidden_act": "gelu"}, "hidden_act 'gelu'"), ({"use_sliding_window": True}, "sliding-window attention")],
)
def test_a_model_our_kernels_would_run_differently_is_refused(model_copy, changes, fragment):
    """Accepted silently before, and run as SiLU with full attention: different outputs, no word."""
    edit_config(model_copy, **changes)
    expect_error(model_copy, "config.json", fragment)
