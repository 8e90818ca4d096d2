"""Every bad model folder gets a one-line message naming the file and the problem, before any tensor is read:
where the folder and its files are found (model_loader.locate: a path, a repo id in the local cache, shards, the
tokenizer) and what is listed as a local model. config.json's own checks: test_config.py; the safetensors
checks: test_weights.py."""

import json
import shutil

import pytest
import torch
from model_folders import edit_config, expect_error

from model_loader.errors import ModelError
from model_loader.locate import resolve_model


def test_a_good_folder_resolves(model_copy):
    assert resolve_model(model_copy).config.num_hidden_layers == 2


def test_missing_folder(tmp_path):
    expect_error(tmp_path / "nope", "nope", "no such folder")


def test_a_file_instead_of_a_folder(model_copy):
    expect_error(model_copy / "config.json", "config.json", "not a folder")


def test_pickle_only_checkpoint_is_refused(model_copy):
    (model_copy / "model.safetensors").unlink()
    (model_copy / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    expect_error(model_copy, "pytorch_model.bin", "never unpickles")


def test_no_weights(model_copy):
    (model_copy / "model.safetensors").unlink()
    expect_error(model_copy, "no *.safetensors weights")


def test_missing_shard_listed_in_the_index(model_copy):
    (model_copy / "model.safetensors").rename(model_copy / "model-00001-of-00002.safetensors")
    weight_map = {
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "lm_head.weight": "model-00002-of-00002.safetensors",
    }
    (model_copy / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    expect_error(model_copy, "model-00002-of-00002.safetensors", "missing safetensors shard")


def test_a_gguf_folder_is_told_gguf_is_not_read(model_copy):
    for f in model_copy.glob("*.safetensors"):
        f.unlink()
    (model_copy / "model-Q4_K_M.gguf").write_bytes(b"GGUF" + bytes(60))
    expect_error(model_copy, "model-Q4_K_M.gguf", "GGUF")


@pytest.mark.parametrize(
    "weight_map, fragment",
    [({}, "names no shard"), ({"a": 5}, "not a file name"), ({"a": "../elsewhere.safetensors"}, "not a file name")],
)
def test_an_index_that_names_no_shard_or_not_a_file_is_refused(model_copy, weight_map, fragment):
    (model_copy / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    expect_error(model_copy, "model.safetensors.index.json", fragment)


def test_a_tokenizer_with_more_tokens_than_the_model_has_rows_is_refused(model_copy):
    """Its ids past the embedding would index out of range on the first prompt: on a GPU a device-side assert
    that leaves CUDA unusable until the app restarts."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(model_copy / "model.safetensors")
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        tensors[name] = tensors[name][:1000].contiguous()
    save_file(tensors, model_copy / "model.safetensors")
    edit_config(model_copy, vocab_size=1000)
    expect_error(model_copy, "tokenizer", "vocab_size is 1000", "different models")


def test_no_tokenizer(model_copy):
    (model_copy / "tokenizer.json").unlink()
    expect_error(model_copy, "no tokenizer")


def test_broken_tokenizer(model_copy):
    (model_copy / "tokenizer.json").write_text("{}")
    expect_error(model_copy, "could not load the tokenizer")


def test_repo_id_not_in_the_local_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    expect_error("someone/NotAModel", "someone/NotAModel", "not found in the local Hugging Face cache")


def test_repo_id_found_in_the_local_cache(tiny_model, tmp_path, monkeypatch):
    """A repo id resolves through huggingface_hub's cache layout, offline."""
    cache = tmp_path / "hub"
    snap = cache / "models--deepseek-ai--Tiny-R1" / "snapshots" / ("a" * 40)
    shutil.copytree(tiny_model, snap)
    (cache / "models--deepseek-ai--Tiny-R1" / "refs").mkdir()
    (cache / "models--deepseek-ai--Tiny-R1" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    assert resolve_model("deepseek-ai/Tiny-R1").path == snap.resolve()
    # a download into r1desk's models folder that has not finished (config and tokenizer, no weights yet) took
    # precedence and failed: the complete cache copy serves; with no cache copy, its own problem is said
    half = tmp_path / "data" / "r1desk" / "models" / "Tiny-R1"
    half.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(snap / name, half / name)
    assert resolve_model("deepseek-ai/Tiny-R1").path == snap.resolve()
    shutil.rmtree(cache)
    with pytest.raises(ModelError, match="no \\*.safetensors weights"):
        resolve_model("deepseek-ai/Tiny-R1")


def test_cuda_requested_without_cuda(model_copy):

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")  # only meaningful where CUDA is absent (CI)
    # Why there is no CUDA depends on the torch build: CI's is CPU-only; a CUDA build on a machine without a
    # GPU (or driver) must say that instead.
    why = "CPU-only build" if torch.version.cuda is None else "no usable NVIDIA GPU/driver"
    expect_error(model_copy, "CUDA was requested", why, "--device cpu", device="cuda")


def test_find_local_models_lists_compatible_models_only(tiny_model, tmp_path, monkeypatch):
    """What doctor and the first-run screen list: r1desk's own models folder and the HF cache, compatible
    folders only, offline."""
    from model_loader.locate import find_local_models

    cache = tmp_path / "hub"
    for repo, good in (("deepseek-ai--Tiny-R1", True), ("someone--Llama", False)):
        snap = cache / f"models--{repo}" / "snapshots" / ("b" * 40)
        shutil.copytree(tiny_model, snap)
        (cache / f"models--{repo}" / "refs").mkdir()
        (cache / f"models--{repo}" / "refs" / "main").write_text("b" * 40)
        if not good:
            edit_config(snap, architectures=["LlamaForCausalLM"])
    broken = cache / "models--someone--Broken" / "snapshots" / ("c" * 40)
    shutil.copytree(tiny_model, broken)
    (cache / "models--someone--Broken" / "refs").mkdir()
    (cache / "models--someone--Broken" / "refs" / "main").write_text("c" * 40)
    import model_loader.locate as locate

    real = locate.validate_folder

    def trips_on_broken(path):  # a folder our reader fails on (a bug of ours) must not hide the others
        if "Broken" in str(path):
            raise TypeError("a bug of ours")
        return real(path)

    monkeypatch.setattr(locate, "validate_folder", trips_on_broken)
    own = tmp_path / "data" / "r1desk" / "models" / "my-awq"
    shutil.copytree(tiny_model, own)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    names = sorted(m.path.parts[-3] if "snapshots" in m.path.parts else m.name for m in find_local_models())
    assert names == ["models--deepseek-ai--Tiny-R1", "my-awq"]


def test_find_variants_pairs_a_model_with_its_4bit_copy(tiny_model, tmp_path, monkeypatch):
    from model_loader.locate import find_variants
    from model_loader.quantize import quantize

    models = tmp_path / "data" / "r1desk" / "models"
    dense = models / "Tiny-R1"
    shutil.copytree(tiny_model, dense)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-cache"))
    assert find_variants(dense) == {"dense": dense.resolve(), "awq": None}
    quantize(dense, models / "Tiny-R1-AWQ", group_size=32, samples=1, seq_len=32, device="cpu", clip=False)
    other = models / "Other-R1"
    shutil.copytree(tiny_model, other)  # same shape, different name: not a variant
    assert find_variants(dense) == {"dense": dense.resolve(), "awq": (models / "Tiny-R1-AWQ").resolve()}
    assert find_variants(models / "Tiny-R1-AWQ") == {
        "dense": dense.resolve(),
        "awq": (models / "Tiny-R1-AWQ").resolve(),
    }
    assert find_variants(other)["awq"] is None
