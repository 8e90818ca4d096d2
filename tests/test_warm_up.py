"""The warm-up (model_loader.warm_up): a model whose numbers break (fp16 overflow on an older GPU, NaN in a damaged
weights file) is refused at load with what to do, instead of answering in random tokens, and the checked prompt
is a real chat's start. The precision picked by default: test_device.py; the warm-up on a GPU (kernels compiled,
graphs captured): test_decode_graphs.py, test_kernels.py."""

import shutil

import pytest
from safetensors.torch import load_file, save_file

from model_loader.engine import Engine
from model_loader.errors import ModelError
from model_loader.warm_up import warm_up_ids


def _edited_copy(tiny_model, tmp_path, edit):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture
def loud_model(tiny_model, tmp_path):
    """The first layer's MLP writes values of ~1e6 into the residual stream: past fp16's 65,504, well inside bf16's
    and fp32's range (what Qwen2 models do at their first token, more mildly)."""

    def scale(tensors):
        tensors["model.layers.0.mlp.down_proj.weight"] *= 1e5

    return _edited_copy(tiny_model, tmp_path, scale)


def _load_and_warm(folder, dtype):
    engine = Engine.load(folder, device="cpu", dtype=dtype, context_length=256)
    try:
        engine.warm_up()
    finally:
        engine.close()


def test_fp16_overflow_is_refused_at_load_with_what_to_choose(loud_model):
    with pytest.raises(ModelError) as info:
        _load_and_warm(loud_model, "fp16")
    msg = str(info.value)
    assert "\n" not in msg and "overflows in fp16" in msg and "bf16" in msg and "fp32" in msg


def test_the_same_model_in_a_wider_precision_loads(loud_model):
    _load_and_warm(loud_model, "fp32")  # no false alarm: large values are not an error


def test_nan_weights_are_refused_as_damaged(tiny_model, tmp_path):
    def poison(tensors):
        tensors["model.layers.1.self_attn.o_proj.weight"][3, 5] = float("nan")

    folder = _edited_copy(tiny_model, tmp_path, poison)
    with pytest.raises(ModelError, match="NaN or infinite values.*download the model again"):
        _load_and_warm(folder, "fp32")


def test_the_warm_up_checks_a_real_chat_start(tiny_model):
    """The checked prefill starts as every chat does (the template's first token is where Qwen2 models put their
    largest activations), at the length the compile-ahead walk compiled for."""
    from model_loader.compile_ahead import WARM_UP_TOKENS

    engine = Engine.load(tiny_model, device="cpu", context_length=256)
    try:
        ids = warm_up_ids(engine).tolist()
        chat_start = engine.chat.render([{"role": "user", "content": "Hello! How are you doing today?"}]).ids
        assert len(ids) == WARM_UP_TOKENS and ids == chat_start[:WARM_UP_TOKENS]
        assert ids[0] == engine.tokenizer.bos_token_id
    finally:
        engine.close()
