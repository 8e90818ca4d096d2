"""Turn what the user typed (a folder, or a Hugging Face repo id) into a validated local model folder.

Never touches the network: repo ids are resolved from the local Hugging Face cache only.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from model_loader.config import Qwen2Config, read_config
from model_loader.errors import ModelError

log = logging.getLogger(__name__)

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
TOKENIZER_FILES = ("tokenizer.json",)
DEFAULT_REPO = "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"


@dataclass(frozen=True)
class ModelFolder:
    path: Path
    config: Qwen2Config
    shards: tuple[Path, ...]

    @property
    def name(self) -> str:
        """The model's name: the folder's, or the repo's for a Hugging Face cache snapshot."""
        if self.path.parent.name == "snapshots" and self.path.parent.parent.name.startswith("models--"):
            return self.path.parent.parent.name.split("--")[-1]
        return self.path.name if self.path.name not in ("", ".") else str(self.path)

    @property
    def quantized(self) -> bool:
        return self.config.awq is not None


def user_models_dir() -> Path:
    """Where r1desk keeps models it downloads or quantizes (the HF cache is searched too)."""
    from platformdirs import user_data_dir

    return Path(user_data_dir("r1desk", appauthor=False)) / "models"


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, read now (not when huggingface_hub was first imported)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"
    )
    return Path(home) / "hub"


def _looks_like_repo_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "~")) and "\\" not in spec


def resolve_model(spec: str | os.PathLike) -> ModelFolder:
    """A folder path or 'owner/name' (from the local HF cache) -> a validated ModelFolder."""
    path = Path(os.path.expanduser(str(spec)))
    if path.is_dir():
        return validate_folder(path)
    if isinstance(spec, str) and _looks_like_repo_id(spec) and not path.exists():
        local = user_models_dir() / spec.split("/")[1]
        if local.is_dir():
            try:
                return validate_folder(local)
            except ModelError as err:  # e.g. a download into r1desk's folder that has not finished
                try:
                    return validate_folder(_from_hf_cache(spec))  # a complete copy in the HF cache serves
                except ModelError:
                    raise err from None  # neither: what is wrong with r1desk's own copy
        return validate_folder(_from_hf_cache(spec))
    if path.exists():
        raise ModelError(f"{path}: not a folder; pass the model's folder, not a file inside it", str(path))
    raise ModelError(f"{path}: no such folder", str(path))


def _from_hf_cache(repo_id: str) -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, local_files_only=True, cache_dir=str(hf_cache_dir())))
    except Exception as err:  # LocalEntryNotFoundError, RepositoryNotFoundError, invalid id...
        raise ModelError(
            f"{repo_id}: not found in the local Hugging Face cache (r1desk never downloads at load time; "
            "download it first or pass a folder)",
            repo_id,
        ) from err


def validate_folder(folder: Path) -> ModelFolder:
    """Check everything we can without reading tensor data; raise ModelError naming the file."""
    folder = folder.resolve()
    config = read_config(folder)
    shards = _find_shards(folder)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES) and not (
        (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file()
    ):
        raise ModelError(
            f"{folder}: no tokenizer (tokenizer.json, or vocab.json + merges.txt) in the model folder", str(folder)
        )
    return ModelFolder(path=folder, config=config, shards=shards)


def _find_shards(folder: Path) -> tuple[Path, ...]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
            raise ModelError(f"{index}: invalid safetensors index ({err})", str(index)) from err
        if not names:
            raise ModelError(f"{index}: invalid safetensors index (its weight_map names no shard)", str(index))
        shards = []
        for name in names:
            # a shard is a file beside the index: not a path elsewhere on the disk
            if not isinstance(name, str) or Path(name).name != name or name in (".", ".."):
                raise ModelError(
                    f"{index}: invalid safetensors index (shard {name!r} is not a file name in the model folder)",
                    str(index),
                )
            shard = folder / name
            if not shard.is_file():
                raise ModelError(f"{shard}: missing safetensors shard listed in {index.name}", str(shard))
            shards.append(shard)
        return tuple(shards)
    shards = sorted(folder.glob("*.safetensors"))
    if shards:
        return tuple(shards)
    ggufs = sorted(p.name for p in folder.glob("*.gguf"))
    if ggufs:
        raise ModelError(
            f"{folder / ggufs[0]}: GGUF files (llama.cpp's format) are not supported; r1desk loads "
            "Hugging Face safetensors folders (bf16/fp16, or AWQ 4-bit)",
            str(folder / ggufs[0]),
        )
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ModelError(
            f"{folder / pickles[0]}: pickle checkpoint refused — r1desk never unpickles weights; "
            "use a safetensors version of this model",
            str(folder / pickles[0]),
        )
    raise ModelError(f"{folder}: no *.safetensors weights in the model folder", str(folder))


def find_local_models() -> list[ModelFolder]:
    """Compatible models in r1desk's own folder and the local HF cache (for doctor and the first-run screen)."""
    found: list[ModelFolder] = []
    candidates: list[Path] = []
    own = user_models_dir()
    if own.is_dir():
        candidates += [p for p in sorted(own.iterdir()) if p.is_dir()]
    try:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from huggingface_hub import scan_cache_dir

        for repo in scan_cache_dir(cache_dir=hf_cache_dir()).repos:
            if repo.repo_type != "model":
                continue
            for rev in sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True)[:1]:
                candidates.append(Path(rev.snapshot_path))
    except Exception:  # no cache folder yet, or an unreadable one: nothing found there
        pass
    for path in candidates:
        try:
            found.append(validate_folder(path))
        except ModelError:
            continue
        except Exception as err:  # a folder we fail to read must not hide the others (doctor, the welcome screen)
            log.warning("skipped %s while looking for models: %s: %s", path, type(err).__name__, err)
    return found


_VARIANT_SUFFIXES = ("-awq", "_awq", "-4bit", "_4bit", "-int4", "_int4", "-w4a16", "_w4a16")


def _family(name: str) -> str:
    """The name without its precision suffix: DeepSeek-R1-Distill-Qwen-1.5B-AWQ -> deepseek-r1-distill-qwen-1.5b."""
    key = name.lower()
    changed = True
    while changed:
        changed = False
        for suffix in _VARIANT_SUFFIXES:
            if key.endswith(suffix):
                key, changed = key[: -len(suffix)], True
    return key


def _same_shape(a: ModelFolder, b: ModelFolder) -> bool:
    fields = (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
    )
    return all(getattr(a.config, f) == getattr(b.config, f) for f in fields)


def find_variants(path, candidates: list[ModelFolder] | None = None) -> dict[str, Path | None]:
    """The same model in the other precision, among local models: {"dense": folder, "awq": folder} (None where
    absent; the given folder fills its own slot). Same model = same architecture shape and the same name once a
    precision suffix (-AWQ, -4bit, -int4, ...) is dropped: what `r1desk-cli quantize --out NAME-AWQ` makes."""
    folder = validate_folder(Path(path))
    found: dict[str, Path | None] = {"dense": None, "awq": None}
    found["awq" if folder.quantized else "dense"] = folder.path
    for other in find_local_models() if candidates is None else candidates:
        slot = "awq" if other.quantized else "dense"
        if found[slot] is None and _family(other.name) == _family(folder.name) and _same_shape(folder, other):
            found[slot] = other.path
    return found
