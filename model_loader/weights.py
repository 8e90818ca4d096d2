"""safetensors -> fused Qwen2 weights on the device, with a bytes-done progress callback.

Files are checked from their headers before any tensor data is read, so a truncated, corrupt or
mismatched checkpoint fails in milliseconds with a message that names the shard and the tensor.
Tensor data is read from the memory-mapped safetensors file (never pickle) and copied straight into the
fused device buffers (QKV and gate/up), so no second full-size copy is ever made.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from model_loader.config import Qwen2Config
from model_loader.errors import ModelError

ProgressFn = Callable[[int, int], None]

_ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I32": 4, "I64": 8, "I8": 1, "U8": 1, "BOOL": 1, "I16": 2,
             "F8_E4M3": 1, "F8_E5M2": 1}
_FLOAT_DTYPES = ("BF16", "F16", "F32")


class _LazyDtypes(dict):
    """safetensors dtype names -> torch dtypes, filled on first use (torch is imported lazily)."""

    def __missing__(self, key):
        import torch

        self.update({"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "I32": torch.int32,
                     "I64": torch.int64, "U8": torch.uint8, "I8": torch.int8})
        return dict.__getitem__(self, key)


_TORCH_DTYPES = _LazyDtypes()


@dataclass(frozen=True)
class TensorEntry:
    shard: Path
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    offset: int = 0  # from the start of the data section


def _data_start(shard: Path) -> int:
    with open(shard, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def read_header(shard: Path) -> dict[str, TensorEntry]:
    """Parse one safetensors header and check the file is complete."""
    try:
        size = os.path.getsize(shard)
        with open(shard, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelError(f"{shard}: truncated safetensors file (no header)", str(shard))
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, 100_000_000):
                raise ModelError(f"{shard}: corrupt safetensors header (declared size {n} bytes)", str(shard))
            raw = json.loads(f.read(n))
    except ModelError:
        raise
    except (OSError, ValueError) as err:
        raise ModelError(f"{shard}: corrupt safetensors header ({err.__class__.__name__})", str(shard)) from err
    if not isinstance(raw, dict):
        raise ModelError(f"{shard}: corrupt safetensors header", str(shard))
    data_size = size - 8 - n
    entries: dict[str, TensorEntry] = {}
    for name, info in raw.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError) as err:
            raise ModelError(f"{shard}: corrupt safetensors header entry for {name}", str(shard)) from err
        numel = 1
        for d in shape:
            numel *= d
        if dtype not in _ITEMSIZE or end - begin != numel * _ITEMSIZE[dtype] or begin < 0:
            raise ModelError(f"{shard}: corrupt safetensors entry {name} ({dtype} {list(shape)})", str(shard))
        if end > data_size:
            raise ModelError(
                f"{shard}: truncated safetensors file ({size} bytes; tensor {name} needs {8 + n + end})", str(shard)
            )
        entries[name] = TensorEntry(shard, dtype, shape, end - begin, begin)
    return entries


def expected_shapes(cfg: Qwen2Config) -> dict[str, tuple[int, ...]]:
    """Every dense tensor a Qwen2ForCausalLM checkpoint must hold, with its shape."""
    h, i, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.q_size, cfg.kv_size
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (cfg.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.q_proj.bias": (q,),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        })
    return shapes


def index_checkpoint(cfg: Qwen2Config, shards: tuple[Path, ...]) -> dict[str, TensorEntry]:
    """Headers of all shards, checked against the config: every tensor present, shaped and typed right."""
    entries: dict[str, TensorEntry] = {}
    for shard in shards:
        entries.update(read_header(shard))
    for name, shape in expected_shapes(cfg).items():
        entry = entries.get(name)
        if entry is None:
            where = shards[0].parent if len(shards) > 1 else shards[0]
            raise ModelError(f"{where}: missing tensor {name}", str(where))
        if entry.shape != shape:
            raise ModelError(
                f"{entry.shard}: tensor {name} has shape {list(entry.shape)}, config.json implies {list(shape)}",
                str(entry.shard),
            )
        if entry.dtype not in _FLOAT_DTYPES:
            raise ModelError(f"{entry.shard}: tensor {name} has unsupported dtype {entry.dtype}", str(entry.shard))
    return entries


def load_weights(cfg: Qwen2Config, shards: tuple[Path, ...], device, dtype, progress: ProgressFn | None = None):
    """Read the checkpoint into fused device tensors; returns a dict of names -> tensors (see qwen2.Weights)."""
    import torch

    entries = index_checkpoint(cfg, shards)
    needed = expected_shapes(cfg)
    total = sum(entries[n].nbytes for n in needed)
    done = 0
    h, i, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.q_size, cfg.kv_size

    def empty(*shape):
        return torch.empty(shape, device=device, dtype=dtype)

    out: dict[str, object] = {
        "embed": empty(cfg.vocab_size, h),
        "norm": empty(h),
        "layers": [
            {
                "ln1": empty(h), "ln2": empty(h),
                "qkv_w": empty(q + 2 * kv, h), "qkv_b": empty(q + 2 * kv),
                "o_w": empty(h, q), "gate_up_w": empty(2 * i, h), "down_w": empty(h, i),
            }
            for _ in range(cfg.num_hidden_layers)
        ],
    }
    out["lm_head"] = out["embed"] if cfg.tie_word_embeddings else empty(cfg.vocab_size, h)

    def destination(name: str):
        """The device buffer (or slice of a fused buffer) a checkpoint tensor is copied into."""
        if name == "model.embed_tokens.weight":
            return out["embed"]
        if name == "model.norm.weight":
            return out["norm"]
        if name == "lm_head.weight":
            return out["lm_head"]
        layer = out["layers"][int(name.split(".")[2])]
        leaf = name.split(".", 3)[3]
        slices = {
            "input_layernorm.weight": layer["ln1"],
            "post_attention_layernorm.weight": layer["ln2"],
            "self_attn.q_proj.weight": layer["qkv_w"][:q],
            "self_attn.k_proj.weight": layer["qkv_w"][q:q + kv],
            "self_attn.v_proj.weight": layer["qkv_w"][q + kv:],
            "self_attn.q_proj.bias": layer["qkv_b"][:q],
            "self_attn.k_proj.bias": layer["qkv_b"][q:q + kv],
            "self_attn.v_proj.bias": layer["qkv_b"][q + kv:],
            "self_attn.o_proj.weight": layer["o_w"],
            "mlp.gate_proj.weight": layer["gate_up_w"][:i],
            "mlp.up_proj.weight": layer["gate_up_w"][i:],
            "mlp.down_proj.weight": layer["down_w"],
        }
        return slices[leaf]

    if progress:
        progress(0, total)
    # Tensor bytes are read through a memory map of each shard (the same bytes safetensors' own loader reads,
    # header already validated above) and copied straight from the page cache into the device buffers, a few
    # tensors at a time: no intermediate CPU tensor, so a 3.5 GB checkpoint in the page cache loads in about
    # a second instead of several. Progress is reported from this thread only.
    maps = {}
    try:
        for shard in {entries[n].shard for n in needed}:
            with open(shard, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # private: torch wants a writable buffer
            maps[shard] = (mm, torch.frombuffer(mm, dtype=torch.uint8), _data_start(shard))

        def copy_one(name: str) -> int:
            entry = entries[name]
            _, raw, data_start = maps[entry.shard]
            begin = data_start + entry.offset
            src = raw[begin:begin + entry.nbytes].view(_TORCH_DTYPES[entry.dtype]).view(entry.shape)
            destination(name).copy_(src)
            return entry.nbytes

        names = sorted(needed, key=lambda n: (str(entries[n].shard), entries[n].offset))
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="r1desk-load") as pool:
            for nbytes in pool.map(copy_one, names):
                done += nbytes
                if progress:
                    progress(done, total)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
    except torch.cuda.OutOfMemoryError:
        raise
    except (OSError, ValueError, RuntimeError) as err:
        raise ModelError(f"{next(iter(maps), shards[0])}: could not read tensor data ({err})", str(shards[0])) from err
    finally:
        maps.clear()  # drop the views, then the maps (closed when garbage-collected)
    return out
