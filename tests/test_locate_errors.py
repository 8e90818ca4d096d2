"""Every bad model folder gets a one-line message naming the file and the problem, before any tensor is read."""

import json
import shutil

import pytest
import torch

from model_loader.engine import Engine
from model_loader.errors import ModelError
from model_loader.locate import resolve_model


@pytest.fixture
def folder(tiny_model, tmp_path):
    """A fresh copy of the tiny model that a test may break."""
    dst = tmp_path / "model"
    shutil.copytree(tiny_model, dst)
    return dst


def edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def expect_error(folder, *fragments, device="cpu"):
    with pytest.raises(ModelError) as info:
        Engine.load(folder, device=device)
    msg = str(info.value)
    assert "\n" not in msg
    for fragment in fragments:
        assert fragment in msg, msg
    return msg


def test_a_good_folder_resolves(folder):
    assert resolve_model(folder).config.num_hidden_layers == 2


def test_missing_folder(tmp_path):
    expect_error(tmp_path / "nope", "nope", "no such folder")


def test_a_file_instead_of_a_folder(folder):
    expect_error(folder / "config.json", "config.json", "not a folder")


def test_missing_config(folder):
    (folder / "config.json").unlink()
    expect_error(folder, "config.json", "missing config.json")


def test_invalid_config_json(folder):
    (folder / "config.json").write_text("{ not json")
    expect_error(folder, "config.json", "invalid config.json")


def test_unsupported_architecture(folder):
    edit_config(folder, architectures=["LlamaForCausalLM"], model_type="llama")
    expect_error(folder, "config.json", "unsupported architecture LlamaForCausalLM")


def test_remote_code_is_refused(folder):
    edit_config(folder, auto_map={"AutoModelForCausalLM": "modeling_x.Model"})
    expect_error(folder, "config.json", "never runs remote code")


def test_pickle_only_checkpoint_is_refused(folder):
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    expect_error(folder, "pytorch_model.bin", "never unpickles")


def test_no_weights(folder):
    (folder / "model.safetensors").unlink()
    expect_error(folder, "no *.safetensors weights")


def test_missing_shard_listed_in_the_index(folder):
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    weight_map = {
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "lm_head.weight": "model-00002-of-00002.safetensors",
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    expect_error(folder, "model-00002-of-00002.safetensors", "missing safetensors shard")


def test_truncated_shard(folder):
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    expect_error(folder, "model.safetensors", "truncated safetensors file")


def test_corrupt_header(folder):
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:20] = b"\x00garbage!!!!"
    path.write_bytes(bytes(data))
    expect_error(folder, "model.safetensors", "corrupt safetensors header")


def test_empty_shard(folder):
    (folder / "model.safetensors").write_bytes(b"")
    expect_error(folder, "model.safetensors", "truncated")


def _rewrite_without(folder, drop=None, reshape=None):
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    if drop:
        del tensors[drop]
    if reshape:
        tensors[reshape] = tensors[reshape][:-1].contiguous()
    save_file(tensors, folder / "model.safetensors")


def test_missing_tensor(folder):
    _rewrite_without(folder, drop="model.layers.1.mlp.down_proj.weight")
    expect_error(folder, "model.safetensors", "missing tensor model.layers.1.mlp.down_proj.weight")


def test_misshaped_tensor(folder):
    _rewrite_without(folder, reshape="model.layers.0.self_attn.k_proj.weight")
    expect_error(folder, "model.layers.0.self_attn.k_proj.weight", "has shape [31, 64]", "[32, 64]")


def test_config_that_does_not_match_the_weights(folder):
    edit_config(folder, hidden_size=128)
    expect_error(folder, "model.safetensors", "config.json implies")


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
def test_a_config_value_of_the_wrong_type_is_named(folder, field, value):
    """json's types are not the ones config.json means (true is 1, 2.0 is 2, "false" is true): each such value
    is a ModelError naming config.json and, where it is wrong by itself, the field (they were TypeErrors from
    deep inside the load, or silently taken: "false" tied the embeddings, null took the default)."""
    edit_config(folder, **{field: value})
    if field == "rope_theta" and value is None:  # null: the default, as transformers reads it
        assert resolve_model(folder).config.rope_theta == 10000.0
        return
    msg = expect_error(folder, "config.json")
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
def test_an_awq_config_value_of_the_wrong_type_is_named(folder, quantization, fragment):
    edit_config(
        folder,
        quantization_config={
            "quant_method": "awq",
            "bits": 4,
            "group_size": 32,
            "version": "gemm",
            "zero_point": True,
            **quantization,
        },
    )
    expect_error(folder, "config.json", fragment)


@pytest.mark.parametrize(
    "changes, fragment",
    [({"hidden_act": "gelu"}, "hidden_act 'gelu'"), ({"use_sliding_window": True}, "sliding-window attention")],
)
def test_a_model_our_kernels_would_run_differently_is_refused(folder, changes, fragment):
    """Accepted silently before, and run as SiLU with full attention: different outputs, no word."""
    edit_config(folder, **changes)
    expect_error(folder, "config.json", fragment)


def test_a_gguf_folder_is_told_gguf_is_not_read(folder):
    for f in folder.glob("*.safetensors"):
        f.unlink()
    (folder / "model-Q4_K_M.gguf").write_bytes(b"GGUF" + bytes(60))
    expect_error(folder, "model-Q4_K_M.gguf", "GGUF")


def test_quantized_weights_without_a_quantization_config_say_so(folder):
    """An AWQ checkpoint whose config.json lost its quantization_config (its linears are qweight/qzeros/scales):
    "missing tensor ...q_proj.weight" did not say why."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj."
    tensors[name + "qweight"] = tensors.pop(name + "weight").view(torch.int32)
    save_file(tensors, folder / "model.safetensors")
    expect_error(folder, name + "qweight", "no quantization_config")


def test_more_layers_in_config_than_in_the_weights_is_said_at_once(folder):
    """A typo of 10**9 layers used to list every tensor of every layer first (2.7 GB and 14 s at 10**6)."""
    edit_config(folder, num_hidden_layers=10**9)
    expect_error(folder, "config.json says 1000000000 layers, the weights hold 2")


def _rewrite_header(folder, change):
    """model.safetensors with change(header dict) applied and the data kept as it is."""
    import struct

    path = folder / "model.safetensors"
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


def test_a_header_whose_tensors_share_bytes_is_refused(folder):
    """Two names on one byte range load one tensor's bytes as another's: garbage weights, no error."""

    def alias(header):
        a, b = _first_two(header)
        header[b]["data_offsets"] = header[a]["data_offsets"]
        header[b]["shape"], header[b]["dtype"] = header[a]["shape"], header[a]["dtype"]

    _rewrite_header(folder, alias)
    expect_error(folder, "model.safetensors", "overlapping or misplaced tensors")


@pytest.mark.parametrize("bad", ["float offsets", "string offsets", "float shape"])
def test_a_header_with_numbers_that_are_not_integers_is_refused(folder, bad):
    def change(header):
        a, _ = _first_two(header)
        begin, end = header[a]["data_offsets"]
        if bad == "float offsets":
            header[a]["data_offsets"] = [float(begin), float(end)]
        elif bad == "string offsets":
            header[a]["data_offsets"] = [str(begin), str(end)]
        else:
            header[a]["shape"] = [d + 0.7 for d in header[a]["shape"]]

    _rewrite_header(folder, change)
    expect_error(folder, "model.safetensors", "corrupt safetensors header entry")


def test_a_tensor_in_two_shards_is_refused(folder):
    """The index said one shard and the other held a zeroed copy: the last shard read won, silently."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    save_file(tensors, folder / "model-00001-of-00002.safetensors")
    save_file({"lm_head.weight": tensors["lm_head.weight"] * 0}, folder / "model-00002-of-00002.safetensors")
    (folder / "model.safetensors").unlink()
    weight_map = {name: "model-00001-of-00002.safetensors" for name in tensors}
    weight_map["model.norm.weight"] = "model-00002-of-00002.safetensors"  # the index lists both shards
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    expect_error(folder, "lm_head.weight", "holds it twice")


@pytest.mark.parametrize(
    "weight_map, fragment",
    [({}, "names no shard"), ({"a": 5}, "not a file name"), ({"a": "../elsewhere.safetensors"}, "not a file name")],
)
def test_an_index_that_names_no_shard_or_not_a_file_is_refused(folder, weight_map, fragment):
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    expect_error(folder, "model.safetensors.index.json", fragment)


def test_a_tokenizer_with_more_tokens_than_the_model_has_rows_is_refused(folder):
    """Its ids past the embedding would index out of range on the first prompt: on a GPU a device-side assert
    that leaves CUDA unusable until the app restarts."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        tensors[name] = tensors[name][:1000].contiguous()
    save_file(tensors, folder / "model.safetensors")
    edit_config(folder, vocab_size=1000)
    expect_error(folder, "tokenizer", "vocab_size is 1000", "different models")


def test_no_tokenizer(folder):
    (folder / "tokenizer.json").unlink()
    expect_error(folder, "no tokenizer")


def test_broken_tokenizer(folder):
    (folder / "tokenizer.json").write_text("{}")
    expect_error(folder, "could not load the tokenizer")


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


def test_cuda_requested_without_cuda(folder):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")  # only meaningful where CUDA is absent (CI)
    # Why there is no CUDA depends on the torch build: CI's is CPU-only; a CUDA build on a machine without a
    # GPU (or driver) must say that instead.
    why = "CPU-only build" if torch.version.cuda is None else "no usable NVIDIA GPU/driver"
    expect_error(folder, "CUDA was requested", why, "--device cpu", device="cuda")


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
