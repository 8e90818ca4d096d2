"""Qwen2 model configuration, read from the folder's config.json (field names as in HF's config)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from model_loader.errors import ModelError

SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM",)


@dataclass(frozen=True)
class AwqConfig:
    """config.json's quantization_config for an AWQ (GEMM, 4-bit, zero point) checkpoint."""

    group_size: int
    modules_to_not_convert: tuple[str, ...] = ()

    def quantizes(self, module: str) -> bool:
        """Whether a linear module (e.g. model.layers.3.mlp.up_proj) is stored quantized (as transformers decides)."""
        return not any(key in module for key in self.modules_to_not_convert)


def _positive_int(raw: dict, key: str, path: Path, default=None, what: str = "config.json") -> int:
    """raw[key] (default where absent or null) as an integer >= 1; a bool, a float, a string or a number < 1 is
    a ModelError naming the field (json gives true for 1 and 2.0 for 2, which failed far from the cause)."""
    value = raw.get(key)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        got = "missing" if value is None else f"got {value!r}"
        raise ModelError(f"{path}: invalid {what} ({key} must be a positive integer; {got})", str(path))
    return value


def _positive_float(raw: dict, key: str, path: Path, default: float) -> float:
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ModelError(f"{path}: invalid config.json ({key} must be a positive number; got {value!r})", str(path))
    return float(value)


def _token_ids(raw: dict, key: str, path: Path) -> list[int]:
    value = raw.get(key)
    ids = (
        [value]
        if isinstance(value, int) and not isinstance(value, bool)
        else value
        if isinstance(value, list)
        else []
        if value is None
        else None
    )
    if ids is None or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
        raise ModelError(
            f"{path}: invalid config.json ({key} must be a token id or a list of them; got {value!r})", str(path)
        )
    return ids


def parse_awq(raw: dict, path: Path, widths: tuple[int, ...]) -> AwqConfig:
    """Validate quantization_config; every failure is one line naming config.json and the problem."""
    if not isinstance(raw, dict):
        raise ModelError(f"{path}: invalid config.json (quantization_config must be an object; got {raw!r})", str(path))
    method = str(raw.get("quant_method", "")).lower()
    if method != "awq":
        raise ModelError(
            f"{path}: unsupported quantization {method or raw!r}; r1desk reads AWQ (4-bit, GEMM) "
            "or unquantized bf16/fp16 checkpoints",
            str(path),
        )
    bits = raw.get("bits", raw.get("w_bit"))
    if bits != 4 or not isinstance(bits, int):
        raise ModelError(f"{path}: AWQ with {bits!r} bits is not supported (only 4-bit)", str(path))
    version = str(raw.get("version", "gemm")).lower()
    if version != "gemm":
        raise ModelError(
            f'{path}: AWQ version {raw.get("version")!r} is not supported (only "gemm" packing)', str(path)
        )
    if not raw.get("zero_point", True):
        raise ModelError(f"{path}: AWQ without zero points is not supported", str(path))
    group = raw.get("group_size", raw.get("q_group_size"))
    if group not in (32, 64, 128, 256) or not isinstance(group, int):
        raise ModelError(f"{path}: AWQ group size {group!r} is not supported (32, 64, 128 or 256)", str(path))
    for width in widths:
        if width % group:
            raise ModelError(f"{path}: AWQ group size {group} does not divide the layer width {width}", str(path))
    skip = raw.get("modules_to_not_convert") or []
    if not isinstance(skip, list) or not all(isinstance(name, str) and name for name in skip):
        raise ModelError(
            f"{path}: invalid quantization_config (modules_to_not_convert must be a list of module "
            f"names; got {skip!r})",
            str(path),
        )
    return AwqConfig(group_size=group, modules_to_not_convert=tuple(skip))


@dataclass(frozen=True)
class Qwen2Config:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int = 32768
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)
    head_dim: int = 0  # derived when absent
    quantization_config: dict | None = None
    awq: AwqConfig | None = None

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim


def read_config(folder: Path) -> Qwen2Config:
    """Parse and check config.json; every failure names the file and the problem."""
    path = folder / "config.json"
    if not path.is_file():
        raise ModelError(f"{path}: missing config.json — this folder is not a Hugging Face model folder", str(path))
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelError(f"{path}: invalid config.json ({err})", str(path)) from err
    if not isinstance(raw, dict):
        raise ModelError(f"{path}: invalid config.json (top level is not an object)", str(path))
    if raw.get("auto_map"):
        raise ModelError(
            f"{path}: this model needs custom code from the folder (auto_map); r1desk never runs remote code",
            str(path),
        )
    archs = raw.get("architectures") or []
    archs = [str(a) for a in archs] if isinstance(archs, list) else [str(archs)]
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        name = ", ".join(archs) if archs else f"model_type={raw.get('model_type')!r}"
        raise ModelError(
            f"{path}: unsupported architecture {name}; r1desk runs Qwen2ForCausalLM models "
            "(DeepSeek-R1-Distill-Qwen, Qwen2.5)",
            str(path),
        )
    rope_scaling = raw.get("rope_scaling")
    if rope_scaling and (
        not isinstance(rope_scaling, dict)
        or (rope_scaling.get("rope_type") or rope_scaling.get("type")) not in (None, "default")
    ):
        raise ModelError(f"{path}: unsupported rope_scaling {rope_scaling!r}", str(path))
    act = raw.get("hidden_act", "silu")
    if act not in ("silu", "swish"):  # the MLP's kernels compute SiLU: another activation would run as SiLU
        raise ModelError(f"{path}: unsupported hidden_act {act!r}; r1desk's Qwen2 kernels compute SiLU", str(path))
    if raw.get("use_sliding_window") is True:  # attention would see the whole context where the model doesn't
        raise ModelError(
            f"{path}: sliding-window attention (use_sliding_window) is not supported; r1desk attends "
            "over the whole context",
            str(path),
        )
    required = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    missing = [
        k for k in required if isinstance(raw.get(k), bool) or not isinstance(raw.get(k), int) or raw.get(k) <= 0
    ]
    if missing:
        raise ModelError(f"{path}: invalid config.json (missing or non-positive {', '.join(missing)})", str(path))
    heads = raw["num_attention_heads"]
    kv_heads = _positive_int(raw, "num_key_value_heads", path, heads)
    head_dim = _positive_int(raw, "head_dim", path, raw["hidden_size"] // heads or None)
    if head_dim * heads != raw["hidden_size"] and raw.get("head_dim") is None:
        raise ModelError(f"{path}: invalid config.json (hidden_size not divisible by num_attention_heads)", str(path))
    if heads % kv_heads:
        raise ModelError(
            f"{path}: invalid config.json (num_attention_heads not a multiple of num_key_value_heads)", str(path)
        )
    awq = None
    if raw.get("quantization_config"):
        widths = (raw["hidden_size"], raw["intermediate_size"], heads * head_dim)
        awq = parse_awq(raw["quantization_config"], path, widths)
    eos_ids = _token_ids(raw, "eos_token_id", path)
    bos_ids = _token_ids(raw, "bos_token_id", path)
    tied = raw.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):  # "false" would be true
        raise ModelError(
            f"{path}: invalid config.json (tie_word_embeddings must be true or false; got {tied!r})", str(path)
        )
    dtype = raw.get("torch_dtype") or raw.get("dtype") or "bfloat16"
    return Qwen2Config(
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_hidden_layers=raw["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=raw["vocab_size"],
        max_position_embeddings=_positive_int(raw, "max_position_embeddings", path, 32768),
        rope_theta=_positive_float(raw, "rope_theta", path, 10000.0),
        rms_norm_eps=_positive_float(raw, "rms_norm_eps", path, 1e-6),
        tie_word_embeddings=tied,
        torch_dtype=str(dtype),
        bos_token_id=bos_ids[0] if bos_ids else None,
        eos_token_id=eos_ids,
        head_dim=head_dim,
        quantization_config=raw.get("quantization_config"),
        awq=awq,
    )
