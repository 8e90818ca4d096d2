"""make-test-model (model_loader.testmodel), the random models every other test runs on: the folder r1desk reads
has the preset's shapes, DeepSeek-R1's added tokens at R1's ids (or Qwen2.5's, with its template), and the same
seed gives the same weights."""

import json

import pytest
import torch

from model_loader.chat_template import QWEN25_CHAT_TEMPLATE, R1_ADDED_TOKENS, R1_FIRST_ADDED_ID
from model_loader.locate import resolve_model
from model_loader.testmodel import PRESETS, make_test_model, model_config, random_weights
from model_loader.tokenizer import load_tokenizer


def test_the_tiny_model_has_the_presets_shapes_and_r1s_tokens(tiny_model):
    cfg = resolve_model(tiny_model).config
    shape = PRESETS["tiny"]
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        shape["hidden_size"],
        shape["num_hidden_layers"],
        shape["num_attention_heads"],
        shape["num_key_value_heads"],
    )
    added = load_tokenizer(tiny_model)._tok.get_added_tokens_decoder()
    assert [
        (added[R1_FIRST_ADDED_ID + i].content, added[R1_FIRST_ADDED_ID + i].special)
        for i in range(len(R1_ADDED_TOKENS))
    ] == list(R1_ADDED_TOKENS)
    assert cfg.eos_token_id == [R1_FIRST_ADDED_ID]  # <｜end▁of▁sentence｜>, the first of them


def test_the_qwen25_model_has_its_template_and_chatml_end(qwen_model):
    cfg = resolve_model(qwen_model).config
    assert cfg.eos_token_id == [151645] and cfg.bos_token_id == 151643  # <|im_end|>, <|endoftext|>
    config = json.loads((qwen_model / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["chat_template"] == QWEN25_CHAT_TEMPLATE and config["eos_token"] == "<|im_end|>"
    added = load_tokenizer(qwen_model)._tok.get_added_tokens_decoder()
    assert max(added) == 151664 and added[151657].content == "<tool_call>"  # Qwen2.5's, none of Qwen3's


def test_the_same_seed_gives_the_same_weights():
    cfg = model_config("tiny")
    a, b, other = random_weights(cfg, 0), random_weights(cfg, 0), random_weights(cfg, 1)
    assert a.keys() == b.keys() == other.keys()
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert not torch.equal(a["model.layers.0.mlp.up_proj.weight"], other["model.layers.0.mlp.up_proj.weight"])
    assert a["model.layers.1.self_attn.k_proj.weight"].shape == (2 * 16, 64)  # kv heads x head_dim, hidden


@pytest.mark.parametrize(
    "args, fragment", [({"preset": "huge"}, "unknown preset"), ({"chat": "llama"}, "unknown chat")]
)
def test_an_unknown_preset_or_chat_is_refused(tmp_path, args, fragment):
    with pytest.raises(ValueError, match=fragment):
        make_test_model(tmp_path / "m", **args)
    assert not (tmp_path / "m").exists()
