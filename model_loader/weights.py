"""safetensors -> fused Qwen2 weights on the device, with a bytes-done progress callback.

Files are checked from their headers before any tensor data is read, so a truncated, corrupt or
mismatched checkpoint fails in milliseconds with a message that names the shard and the tensor.
Tensor data is read from the memory-mapped safetensors file (never pickle) and copied straight into the
fused device buffers (QKV and gate/up), so no second full-size copy is ever made.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from model_loader.config import AwqConfig, Qwen2Config
from model_loader.errors import ModelError

ProgressFn = Callable[[int, int], None]

_ITEMSIZE = {
    "BF16": 2,
    "F16": 2,
    "F32": 4,
    "F64": 8,
    "I32": 4,
    "I64": 8,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "I16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
_FLOAT_DTYPES = ("BF16", "F16", "F32")


class _LazyDtypes(dict):
    """safetensors dtype names -> torch dtypes, filled on first use (torch is imported lazily)."""

    def __missing__(self, key):
        import torch

        self.update(
            {
                "BF16": torch.bfloat16,
                "F16": torch.float16,
                "F32": torch.float32,
                "I32": torch.int32,
                "I64": torch.int64,
                "U8": torch.uint8,
                "I8": torch.int8,
            }
        )
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
    except (OSError, ValueError, RecursionError) as err:  # RecursionError: JSON nested past the parser's depth
        raise ModelError(f"{shard}: corrupt safetensors header ({err.__class__.__name__})", str(shard)) from err
    if not isinstance(raw, dict):
        raise ModelError(f"{shard}: corrupt safetensors header", str(shard))
    data_size = size - 8 - n
    entries: dict[str, TensorEntry] = {}
    for name, info in raw.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError) as err:
            raise ModelError(f"{shard}: corrupt safetensors header entry for {name}", str(shard)) from err
        if not all(_is_count(v) for v in (*shape, begin, end)):  # ints, as the format says: 64.7 is no size
            raise ModelError(
                f"{shard}: corrupt safetensors header entry for {name} (shape {info['shape']!r}, "
                f"offsets {info['data_offsets']!r})",
                str(shard),
            )
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
    # As the format requires (and safetensors' own reader checks): the tensors tile the data, in order, with no
    # gap and no overlap. Two names on one byte range would load one tensor's bytes as another's.
    at = 0
    for entry in sorted(entries.values(), key=lambda e: (e.offset, e.nbytes)):  # an empty tensor first
        if entry.offset != at:
            name = next(k for k, v in entries.items() if v is entry)
            raise ModelError(
                f"{shard}: corrupt safetensors header (tensor {name} starts at byte {entry.offset} "
                f"of the data, where {at} was expected: overlapping or misplaced tensors)",
                str(shard),
            )
        at += entry.nbytes
    return entries


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


LINEARS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


def linear_shapes(cfg: Qwen2Config) -> dict[str, tuple[int, int]]:
    """(out, in) of each linear layer, by its short name."""
    h, i, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.q_size, cfg.kv_size
    return {
        "self_attn.q_proj": (q, h),
        "self_attn.k_proj": (kv, h),
        "self_attn.v_proj": (kv, h),
        "self_attn.o_proj": (h, q),
        "mlp.gate_proj": (i, h),
        "mlp.up_proj": (i, h),
        "mlp.down_proj": (h, i),
    }


def expected_shapes(cfg: Qwen2Config, awq: AwqConfig | None = None) -> dict[str, tuple[int, ...]]:
    """Every tensor a Qwen2ForCausalLM checkpoint must hold, with its shape (AWQ tensors where quantized)."""
    h, q, kv = cfg.hidden_size, cfg.q_size, cfg.kv_size
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (cfg.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.bias": (q,),
                p + "self_attn.k_proj.bias": (kv,),
                p + "self_attn.v_proj.bias": (kv,),
            }
        )
        for short, (n_out, n_in) in linear_shapes(cfg).items():
            name = p + short
            if awq is not None and awq.quantizes(name):
                g = awq.group_size
                shapes.update(
                    {
                        name + ".qweight": (n_in, n_out // 8),
                        name + ".qzeros": (n_in // g, n_out // 8),
                        name + ".scales": (n_in // g, n_out),
                    }
                )
            else:
                shapes[name + ".weight"] = (n_out, n_in)
    return shapes


def index_checkpoint(
    cfg: Qwen2Config, shards: tuple[Path, ...], awq: AwqConfig | None = None
) -> dict[str, TensorEntry]:
    """Headers of all shards, checked against the config: every tensor present, shaped and typed right."""
    entries: dict[str, TensorEntry] = {}
    for shard in shards:
        for name, entry in read_header(shard).items():
            if name in entries:  # which copy is meant? Neither is taken silently
                raise ModelError(
                    f"{shard}: tensor {name} is also in {entries[name].shard.name}: the checkpoint holds it twice",
                    str(shard),
                )
            entries[name] = entry
    layers = {
        int(part)
        for name in entries
        if name.startswith("model.layers.")
        for part in [name.split(".")[2]]
        if part.isdigit()
    }
    if cfg.num_hidden_layers > len(layers):  # before listing every tensor of every layer config.json claims
        where = shards[0].parent if len(shards) > 1 else shards[0]
        raise ModelError(
            f"{where}: config.json says {cfg.num_hidden_layers} layers, the weights hold {len(layers)}", str(where)
        )
    for name, shape in expected_shapes(cfg, awq).items():
        entry = entries.get(name)
        if entry is None:
            where = shards[0].parent if len(shards) > 1 else shards[0]
            if name.endswith(".weight") and name[: -len("weight")] + "qweight" in entries:
                raise ModelError(
                    f"{where}: the weights are quantized ({name[: -len('weight')]}qweight), but "
                    "config.json has no quantization_config to say how",
                    str(where),
                )
            raise ModelError(f"{where}: missing tensor {name}", str(where))
        if entry.shape != shape:
            raise ModelError(
                f"{entry.shard}: tensor {name} has shape {list(entry.shape)}, config.json implies {list(shape)}",
                str(entry.shard),
            )
        wanted = ("I32",) if name.endswith((".qweight", ".qzeros")) else _FLOAT_DTYPES
        if entry.dtype not in wanted:
            raise ModelError(f"{entry.shard}: tensor {name} has unsupported dtype {entry.dtype}", str(entry.shard))
    return entries


def _copy_tensors(
    entries: dict[str, TensorEntry], names: list[str], destination, device, progress, done: int, total: int
) -> int:
    """Copy checkpoint tensors into destination(name) (a device tensor or slice), reporting bytes done.

    Tensor bytes are read through a memory map of each shard (the same bytes safetensors' own loader reads;
    the header was validated before) and copied straight from the page cache into the device buffers, a few
    tensors at a time: no intermediate CPU tensor, so a checkpoint in the page cache loads several times faster
    than through one. Progress is reported from the calling thread only."""
    import torch

    maps = {}
    try:
        for shard in {entries[n].shard for n in names}:
            with open(shard, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # private: torch wants a writable buffer
            maps[shard] = (mm, torch.frombuffer(mm, dtype=torch.uint8), _data_start(shard))

        def copy_one(name: str) -> int:
            entry = entries[name]
            _, raw, data_start = maps[entry.shard]
            begin = data_start + entry.offset
            src = raw[begin : begin + entry.nbytes].view(_TORCH_DTYPES[entry.dtype]).view(entry.shape)
            destination(name).copy_(src)
            return entry.nbytes

        ordered = sorted(names, key=lambda n: (str(entries[n].shard), entries[n].offset))
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="r1desk-load") as pool:
            for nbytes in pool.map(copy_one, ordered):
                done += nbytes
                if progress:
                    progress(done, total)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
    except torch.cuda.OutOfMemoryError:
        raise
    except (OSError, ValueError, RuntimeError) as err:
        shard = next(iter(maps), None) or entries[names[0]].shard
        raise ModelError(f"{shard}: could not read tensor data ({err})", str(shard)) from err
    finally:
        maps.clear()  # drop the views, then the maps (closed when garbage-collected)
    return done


def host_mapped_alias(pinned, device="cuda"):
    """A tensor on CUDA `device` that reads `pinned` (page-locked host memory) in place, over the bus.

    Under unified addressing, page-locked host memory is mapped into the GPU's address space, so kernels can
    read it directly; torch.as_tensor wraps such a pointer through the CUDA array interface. Used for the
    embedding table: every step reads one 3 KB row of it, so keeping its ~0.45 GB in host RAM costs almost
    nothing and frees that much VRAM. Returns None if the alias can't be made or reads wrong values."""
    import torch

    class _Interface:  # bf16 has no typestr: expose the bits as int16, view as the real dtype after.
        # (torch refuses read-only CUDA array interfaces; nothing writes through the alias.)
        def __init__(self, t):
            self.__cuda_array_interface__ = {
                "shape": tuple(t.shape),
                "typestr": "<i2",
                "data": (t.data_ptr(), False),
                "version": 3,
                "strides": None,
            }

    try:
        if pinned.element_size() != 2 or not pinned.is_pinned():
            return None
        alias = torch.as_tensor(_Interface(pinned.view(torch.int16)), device=device).view(pinned.dtype)
        if alias.data_ptr() != pinned.data_ptr():  # a copy into VRAM after all (another GPU's context, say)
            return None
        rows = torch.tensor([0, pinned.shape[0] // 2, pinned.shape[0] - 1])
        if not torch.equal(alias[rows.to(alias.device)].cpu(), pinned[rows]):
            return None
        return alias
    except Exception:  # no unified addressing, or a torch without this path: keep the table in VRAM
        return None


def load_peak_bytes(cfg: Qwen2Config, shards: tuple[Path, ...], dtype, embed_on_host: bool) -> int:
    """About the most device memory load_weights takes for this checkpoint: its tensors in the model's dtype
    (AWQ's packed ints as they are; the embedding table not, where it stays in host memory) and, for AWQ, one
    fused gate/up unpacked to int32 on the way (_fuse_awq_linears). Read from the headers only."""
    total = 0
    for name, entry in index_checkpoint(cfg, shards, cfg.awq).items():
        if name == "model.embed_tokens.weight" and embed_on_host and not cfg.tie_word_embeddings:
            continue
        numel = entry.nbytes // _ITEMSIZE[entry.dtype]
        total += entry.nbytes if entry.dtype == "I32" else numel * dtype.itemsize
    if cfg.awq is not None:
        total += 3 * 2 * cfg.intermediate_size * cfg.hidden_size * 4  # values, zeros, scales side by side
    return total


def twin_entries(
    cfg: Qwen2Config, shards: tuple[Path, ...], awq: AwqConfig | None, twin: Qwen2Config
) -> dict[str, TensorEntry]:
    """Checkpoint entries for `twin` (cfg with fewer layers and tokens: model_loader.compile_ahead): each
    tensor's dtype as the checkpoint stores it (layer i of the twin takes layer i's), its shape as the twin's
    config implies. Only read with load_weights(read_values=False)."""
    entries = index_checkpoint(cfg, shards, awq)
    return {name: dataclasses.replace(entries[name], shape=shape) for name, shape in expected_shapes(twin, awq).items()}


def load_weights(
    cfg: Qwen2Config,
    shards: tuple[Path, ...],
    device,
    dtype,
    progress: ProgressFn | None = None,
    awq: AwqConfig | None = None,
    int4_layout: str | None = None,
    embed_on_host: bool = False,
    entries: dict[str, TensorEntry] | None = None,
    read_values: bool = True,
):
    """Read the checkpoint into fused device tensors: a dict with embed, norm, lm_head and per-layer ln1, ln2,
    qkv_w, qkv_b, o_w, gate_up_w, down_w. Linear weights are dense [out, in] tensors; an AWQ checkpoint's
    become awq.RowPackedInt4 (int4_layout "triton"), awq.Int4Weight ("torch": torch's int4 kernel) or dense
    (None: dequantised once here). read_values=False reads nothing: the same tensors, uninitialised (a shape
    twin's, with its `entries`: twin_entries)."""
    import torch

    if entries is None:
        entries = index_checkpoint(cfg, shards, awq)
    needed = list(expected_shapes(cfg, awq))
    total = sum(entries[n].nbytes for n in needed)
    h, i, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.q_size, cfg.kv_size

    def empty(*shape, dt=dtype):
        return torch.empty(shape, device=device, dtype=dt)

    dense_linears = awq is None
    out: dict[str, object] = {
        "embed": empty(cfg.vocab_size, h),
        "norm": empty(h),
        "layers": [
            {
                "ln1": empty(h),
                "ln2": empty(h),
                "qkv_b": empty(q + 2 * kv),
                **(
                    {
                        "qkv_w": empty(q + 2 * kv, h),
                        "o_w": empty(h, q),
                        "gate_up_w": empty(2 * i, h),
                        "down_w": empty(h, i),
                    }
                    if dense_linears
                    else {}
                ),
            }
            for _ in range(cfg.num_hidden_layers)
        ],
    }
    embed_on_host = embed_on_host and not cfg.tie_word_embeddings and torch.device(device).type == "cuda"
    if embed_on_host:  # read into page-locked host memory; aliased onto the GPU after loading
        out["embed"] = torch.empty((cfg.vocab_size, h), dtype=dtype, pin_memory=True)
    out["lm_head"] = out["embed"] if cfg.tie_word_embeddings else empty(cfg.vocab_size, h)
    raw: dict[str, torch.Tensor] = {}  # AWQ checkpoints: per-linear tensors, fused after reading

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
        fixed = {
            "input_layernorm.weight": lambda: layer["ln1"],
            "post_attention_layernorm.weight": lambda: layer["ln2"],
            "self_attn.q_proj.bias": lambda: layer["qkv_b"][:q],
            "self_attn.k_proj.bias": lambda: layer["qkv_b"][q : q + kv],
            "self_attn.v_proj.bias": lambda: layer["qkv_b"][q + kv :],
        }
        if leaf in fixed:
            return fixed[leaf]()
        if dense_linears:
            return {
                "self_attn.q_proj.weight": layer["qkv_w"][:q],
                "self_attn.k_proj.weight": layer["qkv_w"][q : q + kv],
                "self_attn.v_proj.weight": layer["qkv_w"][q + kv :],
                "self_attn.o_proj.weight": layer["o_w"],
                "mlp.gate_proj.weight": layer["gate_up_w"][:i],
                "mlp.up_proj.weight": layer["gate_up_w"][i:],
                "mlp.down_proj.weight": layer["down_w"],
            }[leaf]
        entry = entries[name]
        raw[name] = torch.empty(entry.shape, device=device, dtype=_TORCH_DTYPES[entry.dtype])
        return raw[name]

    if progress:
        progress(0, total)
    if read_values:
        _copy_tensors(entries, needed, destination, device, progress, 0, total)
    else:
        for name in needed:
            destination(name)  # allocates the AWQ tensors that are fused below
    if embed_on_host:
        alias = host_mapped_alias(out["embed"], device)
        out["embed_host"] = out["embed"]  # keeps the host memory alive as long as the alias
        out["embed"] = alias if alias is not None else out["embed"].to(device)
        if alias is None:
            del out["embed_host"]
    if awq is not None:
        _fuse_awq_linears(cfg, awq, raw, out, dtype, int4_layout)
    return out


FUSED_GROUPS = {  # our fused weight -> the checkpoint's linears, concatenated along `out`
    "qkv_w": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o_w": ("self_attn.o_proj",),
    "gate_up_w": ("mlp.gate_proj", "mlp.up_proj"),
    "down_w": ("mlp.down_proj",),
}


def _fuse_awq_linears(cfg: Qwen2Config, awq: AwqConfig, raw: dict, out: dict, dtype, int4_layout: str | None) -> None:
    """Unpack each layer's AWQ tensors on the device, fuse QKV and gate/up along `out`, then convert to the
    int4 kernels' layout (or dequantise to dense where no int4 kernel can run or a member is unquantized)."""
    import torch

    from model_loader import awq as fmt

    g = awq.group_size
    for index, layer in enumerate(out["layers"]):
        for fused, members in FUSED_GROUPS.items():
            names = [f"model.layers.{index}.{m}" for m in members]
            if all(awq.quantizes(n) for n in names):
                q = torch.cat([fmt.unpack(raw.pop(n + ".qweight")) for n in names], dim=1)
                z = torch.cat([fmt.unpack(raw.pop(n + ".qzeros")) for n in names], dim=1)
                s = torch.cat([raw.pop(n + ".scales") for n in names], dim=1)
                if int4_layout == "triton":  # any shape AWQ allows (widths are multiples of 8 and of g)
                    layer[fused] = fmt.to_row_packed(q, z, s, g)
                    if fused == "gate_up_w":  # the GEMV then outputs the MLP's SiLU(gate) * up directly
                        layer[fused] = fmt.pair_gate_up(layer[fused])
                elif int4_layout == "torch" and fmt.int4pack_ok(q.shape[0], q.shape[1], g):
                    layer[fused] = fmt.to_int4pack(q, z, s, g)
                else:
                    layer[fused] = fmt.dequantize_ints(q, z, s, g).to(dtype)
            else:
                parts = []
                for n in names:
                    if awq.quantizes(n):
                        parts.append(
                            fmt.dequantize(
                                raw.pop(n + ".qweight"), raw.pop(n + ".qzeros"), raw.pop(n + ".scales"), g
                            ).to(dtype)
                        )
                    else:
                        parts.append(raw.pop(n + ".weight").to(dtype))
                layer[fused] = torch.cat(parts, dim=0)
