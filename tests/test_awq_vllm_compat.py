"""The AWQ folders `r1desk-cli quantize` writes, checked against what vLLM's AWQ loader does with them.

vLLM is not installed here (it needs CUDA), so every rule below is re-implemented in plain Python/torch from
vLLM's source, not from our writer (model_loader/quantize.py, model_loader/awq.py); our code only makes the
folder under test, and model_loader.awq.dequantize appears once, as the thing a result is compared against.

Source read: vLLM 0.34.0, the PyPI wheel vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl (sha256 79ca4b3c...
0f044ca2), whose vllm/_version.py gives __commit_id__ 'g62d4bc3c7' (git commit 62d4bc3c7). Files, all under vllm/:
  model_executor/layers/quantization/__init__.py  "awq", "awq_marlin" and "auto_awq" all map to AutoAWQConfig
  transformers_utils/model_arch_config_convertor.py  _normalize_quantization_config: config.json's
      quantization_config, quant_method lower-cased
  config/model.py  ModelConfig._verify_quantization (override_quantization_method picks the method);
      dtype "auto" keeps a float16 model float16
  model_executor/model_loader/weight_utils.py  get_quant_config: hf_config.quantization_config first
      (quant_config.json / quantize_config.json are read only when config.json has none)
  model_executor/layers/quantization/base_config.py  get_from_keys, get_from_keys_or
  model_executor/layers/quantization/auto_awq.py  AutoAWQConfig (__init__, from_config, get_supported_act_dtypes,
      get_min_capability, override_quantization_method, get_quant_method, maybe_update_config),
      BaseAWQLinearMethod.create_weights, AutoAWQMarlinLinearMethod.create_weights,
      _convert_awq_to_standard_format (_REVERSE_AWQ_PACK_ORDER)
  model_executor/layers/quantization/awq_triton.py  awq_dequantize_kernel (the reverse-order shifts and
      (q - z) * s), awq_dequantize_triton's asserts, AWQ_TRITON_SUPPORTED_GROUP_SIZES
  model_executor/layers/quantization/utils/marlin_utils.py  query_marlin_supported_quant_types,
      _check_marlin_supported (MARLIN_SUPPORTED_GROUP_SIZES), check_marlin_supports_layer
  model_executor/layers/quantization/utils/quant_utils.py  is_layer_skipped (match_mode="substring")
  transformers_utils/config.py, transformers_utils/utils.py  get_safetensors_params_metadata,
      parse_safetensors_file_metadata (the safetensors header)
  model_executor/models/qwen2.py  Qwen2ForCausalLM: packed_modules_mapping, Qwen2Model.hf_to_vllm_mapper,
      Qwen2Attention (QKVParallelLinear with bias, o_proj RowParallelLinear without), Qwen2MLP
      (MergedColumnParallelLinear gate_up_proj, RowParallelLinear down_proj), RMSNorms, lm_head tie
  model_executor/layers/linear.py  QKVParallelLinear (output sizes, kv-head replication, shard offsets),
      MergedColumnParallelLinear, RowParallelLinear
  model_executor/parameter.py  load_qkv_weight, load_merged_column_weight, load_row_parallel_weight (narrow, then
      assert equal shapes), _adjust_shard_indexes_for_packing (packed offsets and sizes // pack_factor)
  model_executor/models/utils.py  AutoWeightsLoader (an unexpected name raises, except a ".bias" suffix and
      rotary inv_freq tensors)
  model_executor/model_loader/default_loader.py  a quantized model's every parameter must come from the checkpoint
The previous generation (AWQConfig in awq.py, AWQMarlinConfig in awq_marlin.py), read at vllm-project/vllm commit
2ab31a815160135b1215193371de249d66faba47: AWQMarlinConfig.from_config reads only "bits", "group_size" and
"zero_point" (no w_bit/q_group_size aliases), is_awq_marlin_compatible, verify_marlin_supports_shape
(output % 64, input % 128 per partition); the older AWQConfig accepts float16 activations only.

Not covered: running vLLM's CUDA kernels (csrc/quantization/awq, Marlin); those are compiled code, not read here.
"""

import json
import struct

import pytest
import torch

GROUP = 32  # the tiny model's widths (64, 128) allow 32 and 64; 32 gives every linear several groups
BITS = 4
PACK = 32 // BITS  # AutoAWQConfig.pack_factor

# vllm/model_executor/layers/quantization/utils/marlin_utils.py
MARLIN_SUPPORTED_GROUP_SIZES = [-1, 32, 64, 128]
GPTQ_MARLIN_MIN_THREAD_N, GPTQ_MARLIN_MIN_THREAD_K = 64, 128  # awq_marlin.py's shape rule (previous generation)
# vllm/model_executor/layers/quantization/awq_triton.py
AWQ_TRITON_SUPPORTED_GROUP_SIZES = [-1, 32, 64, 128]
# auto_awq.py AutoAWQConfig.get_supported_act_dtypes; awq.py AWQConfig.get_supported_act_dtypes (previous)
AUTO_AWQ_ACT_DTYPES, OLD_AWQ_ACT_DTYPES = [torch.half, torch.bfloat16], [torch.half]
# auto_awq.py maybe_update_config: parameters of these dtypes are "unquantized"
UNQUANT_DTYPES = ("F16", "BF16", "F32")  # safetensors' names for torch.float16, bfloat16, float32

# qwen2.py: Qwen2ForCausalLM.packed_modules_mapping and Qwen2Model.hf_to_vllm_mapper (orig_to_new_stacked)
PACKED_MODULES_MAPPING = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
HF_TO_VLLM_STACKED = {
    ".q_proj": (".qkv_proj", "q"),
    ".k_proj": (".qkv_proj", "k"),
    ".v_proj": (".qkv_proj", "v"),
    ".gate_proj": (".gate_up_proj", 0),
    ".up_proj": (".gate_up_proj", 1),
}
SAFETENSORS_DTYPE = {torch.int32: "I32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32"}


# ---------------------------------------------------------------------------------------------------------------
# The configuration, as vLLM reads it
# ---------------------------------------------------------------------------------------------------------------


def get_from_keys(config: dict, keys: list):
    """base_config.py QuantizationConfig.get_from_keys: the first of the keys present, else ValueError."""
    for key in keys:
        if key in config:
            return config[key]
    raise ValueError(f"Cannot find any of {keys} in the model's quantization config.")


def get_from_keys_or(config: dict, keys: list, default):
    try:
        return get_from_keys(config, keys)
    except ValueError:
        return default


def auto_awq_config(quant_cfg: dict) -> dict:
    """auto_awq.py AutoAWQConfig.from_config and __init__ (TYPE_MAP has 4 bits only)."""
    weight_bits = get_from_keys(quant_cfg, ["w_bit", "bits"])
    group_size = get_from_keys(quant_cfg, ["q_group_size", "group_size"])
    zero_point = get_from_keys(quant_cfg, ["zero_point"])
    lm_head_quantized = get_from_keys_or(quant_cfg, ["lm_head"], default=False)
    modules_to_not_convert = get_from_keys_or(quant_cfg, ["modules_to_not_convert"], None)
    if weight_bits not in (4,):
        raise ValueError(f"Unsupported num_bits = {weight_bits}. Supported: 4.")
    return {
        "weight_bits": weight_bits,
        "pack_factor": 32 // weight_bits,
        "group_size": group_size,
        "zero_point": zero_point,
        "lm_head_quantized": lm_head_quantized,
        "modules_to_not_convert": modules_to_not_convert or [],
    }


def awq_marlin_config_previous(quant_cfg: dict) -> dict:
    """awq_marlin.py (commit 2ab31a81) AWQMarlinConfig.from_config: the plain keys only; then
    verify_marlin_supported(uint4, group_size, has_zp=zero_point) in __init__."""
    cfg = {k: get_from_keys(quant_cfg, [k]) for k in ("bits", "group_size", "zero_point")}
    assert marlin_supported(cfg["bits"], cfg["group_size"], cfg["zero_point"]), cfg
    return cfg


def marlin_supported(bits, group_size, has_zp) -> bool:
    """marlin_utils.py _check_marlin_supported on CUDA, capability >= 75: with zero points only uint4."""
    supported_types = ["uint4"] if has_zp else ["uint4b8", "uint8b128"]
    quant_type = {4: "uint4"}.get(bits)
    return quant_type in supported_types and group_size in MARLIN_SUPPORTED_GROUP_SIZES


def override_quantization_method(hf_quant_cfg: dict, user_quant) -> str | None:
    """auto_awq.py AutoAWQConfig.override_quantization_method, on a CUDA platform."""
    if hf_quant_cfg.get("quant_method", "").lower() != "awq":
        return None
    return "auto_awq" if user_quant in (None, "awq", "awq_marlin", "auto_awq", "marlin") else None


# ---------------------------------------------------------------------------------------------------------------
# Which layers are quantized: maybe_update_config + is_layer_skipped
# ---------------------------------------------------------------------------------------------------------------


def safetensors_header(path) -> dict:
    """transformers_utils/utils.py parse_safetensors_file_metadata: 8 bytes little-endian length, then JSON."""
    with open(path, "rb") as f:
        length = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(length).decode("utf-8"))


def modules_to_not_convert_from_metadata(metadata: dict) -> list[str]:
    """auto_awq.py AutoAWQConfig.maybe_update_config, when the config lists none: every module none of whose
    tensors has a dtype outside float16/bfloat16/float32."""
    layers = {name.rsplit(".", 1)[0] for name in metadata}
    quant_layers = {
        name.rsplit(".", 1)[0]
        for name, info in metadata.items()
        if (dtype := info.get("dtype", None)) and dtype not in UNQUANT_DTYPES
    }
    return list(layers - quant_layers)


def is_layer_skipped(prefix: str, ignored: list[str], fused_mapping: dict) -> bool:
    """quant_utils.py is_layer_skipped, match_mode="substring" (as AutoAWQConfig.get_quant_method calls it)."""

    def match(p):
        return any(layer in p for layer in ignored)

    proj_name = prefix.split(".")[-1]
    if proj_name in fused_mapping and match(prefix):
        return True
    if proj_name in fused_mapping:
        skipped = None
        for shard in fused_mapping[proj_name]:
            shard_skipped = match(prefix.replace(proj_name, shard))
            if skipped is None:
                skipped = shard_skipped
            elif shard_skipped != skipped:
                raise ValueError(f"Detected some but not all shards of {prefix} are quantized.")
        return skipped
    return match(prefix)


# ---------------------------------------------------------------------------------------------------------------
# The model vLLM builds for Qwen2 and how it loads a checkpoint into it
# ---------------------------------------------------------------------------------------------------------------


def qwen2_linears(cfg: dict, tp: int) -> dict:
    """qwen2.py's four linears per layer, with linear.py's sizes for one of `tp` ranks:
    name -> (kind, input_size, input_size_per_partition, output_partition_sizes, shard names, bias)."""
    h, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = h // heads  # Qwen2Attention: hidden_size // total_num_heads
    inter = cfg["intermediate_size"]
    assert heads % tp == 0, "Qwen2Attention: total_num_heads % tp_size"
    assert kv % tp == 0 if kv >= tp else tp % kv == 0, "Qwen2Attention: kv heads split or replicated"
    num_heads, num_kv = heads // tp, max(1, kv // tp)  # QKVParallelLinear
    return {
        "self_attn.qkv_proj": ("qkv", h, h, [num_heads * head_dim, num_kv * head_dim, num_kv * head_dim], "qkv", True),
        "self_attn.o_proj": ("row", heads * head_dim, heads * head_dim // tp, [h], None, False),
        "mlp.gate_up_proj": ("merged", h, h, [inter // tp, inter // tp], (0, 1), False),
        "mlp.down_proj": ("row", inter, inter // tp, [h], None, False),
    }


def create_weights(input_size, input_size_per_partition, output_partition_sizes, group_size, params_dtype) -> dict:
    """auto_awq.py BaseAWQLinearMethod.create_weights (AutoAWQMarlinLinearMethod's are the same shapes):
    parameter name -> (shape, dtype), after the same two checks."""
    group = group_size if group_size != -1 else input_size
    if input_size_per_partition % group != 0:
        raise ValueError("The input size is not aligned with the quantized weight shape.")
    out = sum(output_partition_sizes)
    if out % PACK != 0:
        raise ValueError("The output size is not aligned with the quantized weight shape.")
    return {
        "qweight": ((input_size_per_partition, out // PACK), torch.int32),
        "qzeros": ((input_size_per_partition // group, out // PACK), torch.int32),
        "scales": ((input_size_per_partition // group, out), params_dtype),
    }


def map_checkpoint_name(name: str) -> tuple[str, object]:
    """qwen2.py hf_to_vllm_mapper (orig_to_new_stacked): q/k/v -> qkv_proj, gate/up -> gate_up_proj."""
    for old, (new, shard) in HF_TO_VLLM_STACKED.items():
        if old in name:
            return name.replace(old, new), shard
    return name, None


def vllm_load(config: dict, metadata: dict, tensors: dict, tp: int = 1, rank: int = 0) -> dict:
    """What vLLM does with the folder for one rank of `tp`: reads the config, decides which linears are quantized,
    creates their parameters, loads every checkpoint tensor into them with the parameter's narrow-and-assert, and
    checks nothing is left over or missing. Returns {vLLM parameter name: tensor} (fp16 scales, as params_dtype)."""
    quant = config["quantization_config"]
    assert override_quantization_method(quant, None) == "auto_awq"
    qc = auto_awq_config(quant)
    ignored = qc["modules_to_not_convert"] or modules_to_not_convert_from_metadata(metadata)
    params_dtype = torch.float16
    layers = config["num_hidden_layers"]
    linears = qwen2_linears(config, tp)

    params, spec, filled = {}, {}, {}
    for i in range(layers):
        for name, (kind, in_size, in_part, out_parts, _, bias) in linears.items():
            prefix = f"model.layers.{i}.{name}"
            if is_layer_skipped(prefix, ignored, PACKED_MODULES_MAPPING):
                raise AssertionError(f"{prefix}: vLLM would treat it as unquantized (modules_to_not_convert)")
            for pname, (shape, dtype) in create_weights(
                in_size, in_part, out_parts, qc["group_size"], params_dtype
            ).items():
                params[f"{prefix}.{pname}"] = torch.full(shape, -1, dtype=dtype)
                spec[f"{prefix}.{pname}"] = (kind, out_parts, pname != "scales")
                filled[f"{prefix}.{pname}"] = torch.zeros(shape, dtype=torch.bool)
            if bias:
                params[f"{prefix}.bias"] = torch.full((sum(out_parts),), -1, dtype=params_dtype)
                spec[f"{prefix}.bias"] = (kind, out_parts, False)
                filled[f"{prefix}.bias"] = torch.zeros(sum(out_parts), dtype=torch.bool)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            params[f"model.layers.{i}.{norm}.weight"] = torch.full((config["hidden_size"],), -1, dtype=params_dtype)
    params["model.embed_tokens.weight"] = torch.full((config["vocab_size"], config["hidden_size"]), -1.0)
    params["model.norm.weight"] = torch.full((config["hidden_size"],), -1, dtype=params_dtype)
    if not config.get("tie_word_embeddings", False):  # ParallelLMHead; not LinearBase, so AWQ leaves it unquantized
        assert not qc["lm_head_quantized"]
        params["lm_head.weight"] = torch.full((config["vocab_size"], config["hidden_size"]), -1.0)

    loaded = set()
    for ckpt_name, tensor in tensors.items():
        if "rotary_emb.inv_freq" in ckpt_name:  # AutoWeightsLoader drops these
            continue
        name, shard = map_checkpoint_name(ckpt_name)
        if name not in params:
            if name.endswith(".bias"):  # AutoWeightsLoader ignores unexpected biases
                continue
            raise AssertionError(f"{ckpt_name}: vLLM has no parameter {name} (AutoWeightsLoader raises)")
        param = params[name]
        if name not in spec:  # plain parameters (norms, embeddings, lm_head): whole-tensor copy, same shape
            assert tuple(tensor.shape) == tuple(param.shape), (ckpt_name, tuple(tensor.shape), tuple(param.shape))
            assert metadata[ckpt_name]["dtype"] in UNQUANT_DTYPES, (ckpt_name, metadata[ckpt_name]["dtype"])
            param.copy_(tensor)
            loaded.add((name, None))
            continue
        kind, out_parts, packed = spec[name]
        is_bias = name.endswith(".bias")
        if packed:  # vLLM copy_()s into its int32 parameter whatever comes; the bits only survive from int32
            assert metadata[ckpt_name]["dtype"] == "I32", (ckpt_name, metadata[ckpt_name]["dtype"])
        else:
            assert metadata[ckpt_name]["dtype"] in UNQUANT_DTYPES, (ckpt_name, metadata[ckpt_name]["dtype"])
        factor = PACK if packed else 1
        out_dim = 0 if is_bias else 1  # qweight/qzeros/scales: output_dim=1, input_dim=0; bias: output_dim=0
        if kind == "row":  # RowvLLMParameter.load_row_parallel_weight: narrow the input dim by rank
            size = param.shape[0]
            part = tensor.narrow(0, rank * size, size)
            assert part.shape == param.shape, (ckpt_name, tuple(part.shape), tuple(param.shape))
            target = param
        else:  # load_qkv_weight / load_merged_column_weight
            if kind == "qkv":
                index = "qkv".index(shard)
                shard_offset, shard_size = sum(out_parts[:index]), out_parts[index]
                kv = config["num_key_value_heads"]
                replicas = tp // kv if tp >= kv else 1  # QKVParallelLinear.num_kv_head_replicas
                shard_rank = rank if shard == "q" else rank // replicas
            else:
                shard_offset, shard_size = sum(out_parts[:shard]), out_parts[shard]
                shard_rank = rank
            # _adjust_shard_indexes_for_packing: packed along the output dim, both // pack_factor
            shard_offset, shard_size = shard_offset // factor, shard_size // factor
            target = param.narrow(out_dim, shard_offset, shard_size)
            part = tensor.narrow(out_dim, shard_rank * shard_size, shard_size)
            assert part.shape == target.shape, (ckpt_name, tuple(part.shape), tuple(target.shape))
            # vLLM narrows without checking the checkpoint tensor's full size: stricter here, the shard must be
            # exactly the unsharded size (tp * its part), so nothing is cut off silently
            assert tensor.shape[out_dim] == shard_size * (tp if kind != "qkv" or shard == "q" else tp // replicas), (
                ckpt_name,
                tuple(tensor.shape),
            )
        target.copy_(part)
        mask = filled[name] if kind == "row" else filled[name].narrow(out_dim, shard_offset, shard_size)
        assert not mask.any(), f"{ckpt_name}: overlaps a shard already loaded"
        mask.fill_(True)
        loaded.add((name, shard))

    missing = [n for n in params if not any(ln == n for ln, _ in loaded)]
    assert missing == [], f"not initialized from checkpoint: {missing}"
    unfilled = [n for n, m in filled.items() if not m.all()]
    assert unfilled == [], f"shards missing (StackedColumnParallelLinear.pop_missing_shards): {unfilled}"
    return params


# ---------------------------------------------------------------------------------------------------------------
# The packing order and the dequantization, as vLLM's kernels compute them
# ---------------------------------------------------------------------------------------------------------------


def reverse_awq_order() -> torch.Tensor:
    """awq_triton.py: reverse_awq_order_tensor = ((tl.arange(0, 2) * 4)[None, :] + tl.arange(0, 4)[:, None])
    .reshape(8), i.e. [0, 4, 1, 5, 2, 6, 3, 7] (auto_awq.py _REVERSE_AWQ_PACK_ORDER is the same list)."""
    return ((torch.arange(0, 2) * 4)[None, :] + torch.arange(0, 4)[:, None]).reshape(8)


def triton_unpack(packed: torch.Tensor) -> torch.Tensor:
    """awq_triton.py awq_dequantize_kernel: each int32 interleaved three times (8 copies side by side), then
    output column 8c + j = (packed[:, c] >> shifts[j]) & 0xF with shifts = reverse_awq_order_tensor * 4."""
    rows, cols = packed.shape
    copies = packed.repeat_interleave(8, dim=1)  # tl.interleave(x, x), three times
    shifts = (reverse_awq_order() * 4).to(torch.int32).repeat(cols)
    return (copies >> shifts) & 0xF


def vllm_dequantize(qweight, qzeros, scales, group_size) -> torch.Tensor:
    """awq_triton.py awq_dequantize_kernel: iweights = (iweights - zeros) * scales, stored in the scales' dtype
    (fp16); zeros and scales of row k are those of group k // group_size. Returns W^T [in, out], as vLLM's
    ops.awq_dequantize does (AutoAWQLinearMethod.apply then computes x @ W^T with torch.matmul)."""
    q = triton_unpack(qweight)
    z = triton_unpack(qzeros)
    rows = torch.arange(qweight.shape[0]) // group_size
    return (q - z[rows]).to(scales.dtype) * scales[rows]


def convert_awq_to_standard_format(qweight, qzeros):
    """auto_awq.py _convert_awq_to_standard_format (the path of AutoAWQMarlinLinearMethod, vLLM's CUDA default for
    group sizes Marlin supports): unpack with the reverse order, repack qweight along the input dim and qzeros,
    transposed, along the output dim, both in the standard order (value i at bits 4i)."""
    mask = (1 << BITS) - 1
    order = reverse_awq_order()
    shifts = torch.arange(0, 32, BITS, dtype=torch.int32)
    k, n_packed = qweight.shape
    n = n_packed * PACK
    unpacked = ((qweight.unsqueeze(-1) >> shifts) & mask)[:, :, order].reshape(k, n)
    unpacked = unpacked.reshape(k // PACK, PACK, n)
    new_qw = (unpacked.to(torch.int32) << shifts[None, :, None]).sum(dim=1, dtype=torch.int32)
    g = qzeros.shape[0]
    zp = ((qzeros.unsqueeze(-1) >> shifts) & mask)[:, :, order].reshape(g, n).T
    zp = zp.reshape(n // PACK, PACK, g)
    new_qz = (zp.to(torch.int32) << shifts[None, :, None]).sum(dim=1, dtype=torch.int32)
    return new_qw, new_qz


def dequantize_standard(qw_std, qz_std, scales, group_size) -> torch.Tensor:
    """The standard (GPTQ-like, uint4 with zero points) layout read back: qweight [K/8, N] holds k = 8i + j at
    bits 4j of row i; qzeros [N/8, G] holds n = 8i + j likewise. W^T [in, out] = (q - z) * s in fp16."""
    shifts = torch.arange(0, 32, BITS, dtype=torch.int32)
    k8, n = qw_std.shape
    q = ((qw_std[:, None, :] >> shifts[None, :, None]) & 0xF).reshape(k8 * PACK, n)
    n8, g = qz_std.shape
    z = ((qz_std[:, None, :] >> shifts[None, :, None]) & 0xF).reshape(n8 * PACK, g).T
    rows = torch.arange(q.shape[0]) // group_size
    return (q - z[rows]).to(scales.dtype) * scales[rows]


def dense_layers(config: dict, params: dict, group_size: int) -> list[dict]:
    """Per layer: each fused linear's W^T [in, out] as vLLM's dequantize kernel computes it."""
    out = []
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.append(
            {
                name: vllm_dequantize(
                    params[p + name + ".qweight"],
                    params[p + name + ".qzeros"],
                    params[p + name + ".scales"],
                    group_size,
                )
                for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
            }
        )
    return out


# ---------------------------------------------------------------------------------------------------------------
# The folder under test, and the originals
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def awq_folder(tiny_model, tmp_path_factory):
    from model_loader.quantize import quantize

    out = tmp_path_factory.mktemp("vllm-compat") / "tiny-awq"
    quantize(tiny_model, out, group_size=GROUP, samples=2, seq_len=64, device="cpu")
    return out


@pytest.fixture(scope="module")
def folder(awq_folder):
    from safetensors.torch import load_file

    config = json.loads((awq_folder / "config.json").read_text(encoding="utf-8"))
    metadata = safetensors_header(awq_folder / "model.safetensors")
    tensors = load_file(awq_folder / "model.safetensors")
    return config, metadata, tensors


@pytest.fixture(scope="module")
def original(tiny_model):
    from safetensors.torch import load_file

    return {k: v.float() for k, v in load_file(tiny_model / "model.safetensors").items()}


def relative_errors(config: dict, dense: list[dict], tensors: dict, original: dict) -> dict:
    """How far each layer's quantized linears are from the unquantized model's, as functions: on fixed random
    inputs, with AWQ's input scales folded back (our quantizer divides q/k/v and gate/up inputs by s through the
    RMSNorm weights and down's through up_proj's rows, so linears compare through their norms, and gate_up with
    down as the whole MLP). Returns the worst relative error (||y_q - y|| / ||y||) of each kind."""
    g = torch.Generator().manual_seed(0)
    h = config["hidden_size"]
    q_size = h  # num_attention_heads * head_dim, head_dim = hidden_size // num_attention_heads in vLLM's Qwen2
    kv_size = config["num_key_value_heads"] * (h // config["num_attention_heads"])
    inter = config["intermediate_size"]
    worst = {"q": 0.0, "k": 0.0, "v": 0.0, "o": 0.0, "gate": 0.0, "mlp": 0.0}

    def rel(a, b):
        return ((a - b).norm() / b.norm()).item()

    for i, layer in enumerate(dense):
        p = f"model.layers.{i}."
        z = torch.randn(64, h, generator=g)  # an RMS-normalised input: unit mean square per row on average
        ln1, ln1q = original[p + "input_layernorm.weight"], tensors[p + "input_layernorm.weight"].float()
        ln2, ln2q = (
            original[p + "post_attention_layernorm.weight"],
            tensors[p + "post_attention_layernorm.weight"].float(),
        )
        qkv = layer["self_attn.qkv_proj"].float()
        for key, lo, hi in (("q", 0, q_size), ("k", q_size, q_size + kv_size), ("v", q_size + kv_size, None)):
            ref = (z * ln1) @ original[p + f"self_attn.{key}_proj.weight"].T
            got = (z * ln1q) @ qkv[:, lo:hi]
            worst[key] = max(worst[key], rel(got, ref))
        a = torch.randn(64, h, generator=g)
        worst["o"] = max(
            worst["o"], rel(a @ layer["self_attn.o_proj"].float(), a @ original[p + "self_attn.o_proj.weight"].T)
        )
        gate_up = layer["mlp.gate_up_proj"].float()
        x2, x2q = z * ln2, z * ln2q
        gate_ref = x2 @ original[p + "mlp.gate_proj.weight"].T
        worst["gate"] = max(worst["gate"], rel(x2q @ gate_up[:, :inter], gate_ref))
        act = torch.nn.functional.silu(gate_ref) * (x2 @ original[p + "mlp.up_proj.weight"].T)
        act_q = torch.nn.functional.silu(x2q @ gate_up[:, :inter]) * (x2q @ gate_up[:, inter:])
        mlp_ref = act @ original[p + "mlp.down_proj.weight"].T
        worst["mlp"] = max(worst["mlp"], rel(act_q @ layer["mlp.down_proj"].float(), mlp_ref))
    return worst


def rtn_error(w: torch.Tensor, group: int) -> float:
    """Relative error of plain group-wise asymmetric round-to-nearest int4 of W [out, in] (the textbook scheme,
    written here): the size of the error 4-bit quantization itself brings."""
    wg = w.reshape(-1, group)
    lo, hi = wg.amin(1, keepdim=True), wg.amax(1, keepdim=True)
    s = (hi - lo).clamp(min=1e-5) / 15
    zp = (-torch.round(lo / s)).clamp(0, 15)
    deq = ((torch.round(wg / s) + zp).clamp(0, 15) - zp) * s
    return ((deq.reshape(w.shape) - w).norm() / w.norm()).item()


# ---------------------------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------------------------


def test_config_json_as_vllm_reads_it(awq_folder, folder):
    from transformers import AutoConfig  # vLLM reads config.json through transformers' config classes

    config, _, _ = folder
    hf = AutoConfig.from_pretrained(awq_folder)
    quant = hf.quantization_config
    assert isinstance(quant, dict) and quant == config["quantization_config"]
    # the method: quant_method lower-cased is "awq", which AutoAWQConfig takes over, asked for or not
    assert quant["quant_method"].lower() == "awq"
    for user_quant in (None, "awq", "awq_marlin", "marlin"):
        assert override_quantization_method(quant, user_quant) == "auto_awq"
    # AutoAWQConfig.from_config: the keys it reads, first match wins: no alias may disagree
    qc = auto_awq_config(quant)
    assert (qc["weight_bits"], qc["pack_factor"], qc["group_size"], qc["zero_point"]) == (4, 8, GROUP, True)
    for alias, key in (("w_bit", "bits"), ("q_group_size", "group_size")):
        assert alias not in quant or quant[alias] == quant[key]
    assert qc["lm_head_quantized"] is False  # no "lm_head" key: lm_head stays a float tensor
    assert quant.get("modules_to_not_convert") in (None, [])  # so vLLM derives it from the tensors' dtypes
    # the previous generation's AWQMarlinConfig reads the plain keys only, and must accept them
    assert awq_marlin_config_previous(quant) == {"bits": 4, "group_size": GROUP, "zero_point": True}
    # the kernels: Marlin (CUDA, AutoAWQMarlinLinearMethod) and the Triton kernel take this group size
    assert marlin_supported(qc["weight_bits"], qc["group_size"], qc["zero_point"])
    assert qc["group_size"] in AWQ_TRITON_SUPPORTED_GROUP_SIZES
    # activations: --dtype auto keeps the config's float16, which both generations accept
    dtype = getattr(hf, "dtype", None) or hf.torch_dtype  # transformers 5 / 4.x
    assert dtype == torch.float16
    assert dtype in AUTO_AWQ_ACT_DTYPES and dtype in OLD_AWQ_ACT_DTYPES
    # the quantization config is in config.json; no separate quant_config.json / quantize_config.json needed
    assert not (awq_folder / "quant_config.json").exists() and not (awq_folder / "quantize_config.json").exists()


def test_which_tensors_vllm_treats_as_quantized(folder):
    config, metadata, tensors = folder
    # the header agrees with the tensors (the test reads dtypes from the header, as vLLM does)
    assert {k for k in metadata if k != "__metadata__"} == set(tensors)
    for name, t in tensors.items():
        assert metadata[name]["dtype"] == SAFETENSORS_DTYPE[t.dtype] and metadata[name]["shape"] == list(t.shape)
    ignored = modules_to_not_convert_from_metadata(metadata)
    layers = config["num_hidden_layers"]
    expected_unquantized = {"model.embed_tokens", "model.norm", "lm_head", "__metadata__"} | {
        f"model.layers.{i}.{n}" for i in range(layers) for n in ("input_layernorm", "post_attention_layernorm")
    }
    assert set(ignored) == expected_unquantized
    for i in range(layers):
        for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
            assert not is_layer_skipped(f"model.layers.{i}.{name}", ignored, PACKED_MODULES_MAPPING)
    # the dtypes AutoAWQ writes and vLLM's metadata scan expects: qweight and qzeros int32; scales and every
    # unquantized tensor float16 (the config's dtype)
    for name, info in metadata.items():
        if name == "__metadata__":
            continue
        suffix = name.rsplit(".", 1)[1]
        assert info["dtype"] == {"qweight": "I32", "qzeros": "I32"}.get(suffix, "F16"), (name, info["dtype"])


@pytest.mark.parametrize("tp", [1, 2])
def test_every_tensor_loads_into_vllms_parameters(folder, tp):
    """Names, shapes and the q/k/v and gate/up fusions, on every rank of tensor parallel 1 and 2."""
    config, metadata, tensors = folder
    ranks = [vllm_load(config, metadata, tensors, tp, rank) for rank in range(tp)]
    p = "model.layers.0."
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    qkv_out = config["hidden_size"] + 2 * config["num_key_value_heads"] * head_dim
    assert tuple(ranks[0][p + "self_attn.qkv_proj.qweight"].shape) == (config["hidden_size"], qkv_out // tp // PACK)
    assert tuple(ranks[0][p + "mlp.down_proj.qzeros"].shape) == (
        config["intermediate_size"] // tp // GROUP,
        config["hidden_size"] // PACK,
    )
    if tp == 1:  # unsharded, the fused tensors are the checkpoint's shards side by side
        for fused, shards in (("self_attn.qkv_proj", "qkv"), ("mlp.gate_up_proj", ("gate", "up"))):
            names = (
                [f"self_attn.{s}_proj" for s in shards]
                if fused.startswith("self_attn")
                else [f"mlp.{s}_proj" for s in shards]
            )
            for part in ("qweight", "qzeros", "scales"):
                cat = torch.cat([tensors[p + n + "." + part] for n in names], dim=1)
                assert torch.equal(ranks[0][p + fused + "." + part], cat.to(ranks[0][p + fused + "." + part].dtype))


def test_tensor_parallel_4_is_refused_for_the_tiny_models_shapes(folder):
    """o_proj's input (64) split four ways is 16, under one group of 32: vLLM's create_weights refuses it, and so
    does this re-implementation (the divisibility check can fail)."""
    config, metadata, tensors = folder
    with pytest.raises(ValueError, match="input size is not aligned"):
        vllm_load(config, metadata, tensors, tp=4, rank=0)


def test_packing_order_and_dequantization_match_the_unquantized_model(folder, original):
    from model_loader.awq import dequantize  # ours: only as the thing compared against

    config, metadata, tensors = folder
    params = vllm_load(config, metadata, tensors)
    dense = dense_layers(config, params, GROUP)
    # 1. vLLM's kernel reads the same numbers r1desk's engine runs, bit for bit (its fp16 rounding of them)
    for i, layer in enumerate(dense):
        p = f"model.layers.{i}."
        parts = [[tensors[f"{p}self_attn.{s}_proj.{n}"] for n in ("qweight", "qzeros", "scales")] for s in "qkv"]
        ours_qkv = torch.cat([dequantize(*part, GROUP).t() for part in parts], dim=1)
        assert torch.equal(layer["self_attn.qkv_proj"], ours_qkv.half())
    # 2. and they are the unquantized model's weights, within 4-bit quantization error: the yardstick is plain
    #    round-to-nearest's relative weight error at this group size (about 0.08 here); each layer's q, k, v, o
    #    and gate outputs stay within 1.5x it of the originals', the whole MLP (gate, up and down, three errors
    #    adding up) within 1.5 * sqrt(3)x. A plain-order qweight puts them above 1 (next test).
    rtn = max(rtn_error(w, GROUP) for n, w in original.items() if n.endswith("proj.weight"))
    assert 0.05 < rtn < 0.15
    worst = relative_errors(config, dense, tensors, original)
    assert max(v for k, v in worst.items() if k != "mlp") < 1.5 * rtn, (worst, rtn)
    assert worst["mlp"] < 1.5 * 3**0.5 * rtn, (worst, rtn)
    # 3. the Marlin path's conversion to the standard layout gives the same weights
    for i, layer in enumerate(dense):
        for name in ("self_attn.qkv_proj", "mlp.down_proj"):
            p = f"model.layers.{i}.{name}."
            qw_std, qz_std = convert_awq_to_standard_format(params[p + "qweight"], params[p + "qzeros"])
            assert torch.equal(dequantize_standard(qw_std, qz_std, params[p + "scales"], GROUP), layer[name])
    # 4. tensor parallel 2: each rank's dequantized slice is the matching part of the whole
    ranks = [dense_layers(config, vllm_load(config, metadata, tensors, 2, r), GROUP) for r in range(2)]
    h = config["hidden_size"]
    kv = config["num_key_value_heads"] * (h // config["num_attention_heads"])
    inter = config["intermediate_size"]
    for i, layer in enumerate(dense):
        full_qkv = layer["self_attn.qkv_proj"]
        q, k, v = full_qkv[:, :h], full_qkv[:, h : h + kv], full_qkv[:, h + kv :]
        for r in range(2):
            got = ranks[r][i]["self_attn.qkv_proj"]
            want = torch.cat([t.chunk(2, dim=1)[r] for t in (q, k, v)], dim=1)
            assert torch.equal(got, want)
            gate, up = layer["mlp.gate_up_proj"][:, :inter], layer["mlp.gate_up_proj"][:, inter:]
            assert torch.equal(ranks[r][i]["mlp.gate_up_proj"], torch.cat([gate.chunk(2, 1)[r], up.chunk(2, 1)[r]], 1))
            assert torch.equal(ranks[r][i]["self_attn.o_proj"], layer["self_attn.o_proj"].chunk(2, 0)[r])
            assert torch.equal(ranks[r][i]["mlp.down_proj"], layer["mlp.down_proj"].chunk(2, 0)[r])


def natural_order_repack(packed: torch.Tensor) -> torch.Tensor:
    """A writer's plausible bug: the right nibbles in the plain order (column 8c + j at bits 4j)."""
    ints = triton_unpack(packed)
    rows, cols = ints.shape
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    return (ints.view(rows, cols // 8, 8).to(torch.int32) << shifts).sum(-1, dtype=torch.int32)


def header_of(tensors: dict) -> dict:
    return {k: {"dtype": SAFETENSORS_DTYPE[t.dtype], "shape": list(t.shape)} for k, t in tensors.items()}


def test_the_checks_catch_a_broken_writer(folder, original):
    """Each kind of check fails on a folder a broken writer could have made."""
    config, metadata, tensors = folder

    def broken(change):
        t = dict(tensors)
        change(t)
        return t

    # packing order: qweight packed in the plain order -> the weights vLLM computes are far from the originals
    swapped = broken(lambda t: t.update({k: natural_order_repack(v) for k, v in t.items() if k.endswith("qweight")}))
    params = vllm_load(config, header_of(swapped), swapped)
    worst = relative_errors(config, dense_layers(config, params, GROUP), swapped, original)
    assert min(worst.values()) > 1.0, worst
    # zero points in the plain order alone also show
    zswapped = broken(lambda t: t.update({k: natural_order_repack(v) for k, v in t.items() if k.endswith("qzeros")}))
    params = vllm_load(config, header_of(zswapped), zswapped)
    worst = relative_errors(config, dense_layers(config, params, GROUP), zswapped, original)
    assert min(worst.values()) > 0.3, worst
    # shapes: scales stored [out, in/group] (transposed) do not fit the parameter
    transposed = broken(
        lambda t: t.update({k: v.t().contiguous() for k, v in t.items() if k.endswith("o_proj.scales")})
    )
    with pytest.raises(AssertionError, match="o_proj.scales"):
        vllm_load(config, header_of(transposed), transposed)
    # dtypes: q_proj's packed tensors as float16 -> vLLM counts q_proj unquantized, k and v not: it refuses
    as_float = broken(lambda t: t.update({k: v.half() for k, v in t.items() if ".q_proj.q" in k}))
    with pytest.raises(ValueError, match="some but not all shards"):
        vllm_load(config, header_of(as_float), as_float)
    # qweight alone as float16: vLLM would copy it into its int32 parameter, values and all; refused here
    as_float = broken(lambda t: t.update({k: v.half() for k, v in t.items() if k.endswith("o_proj.qweight")}))
    with pytest.raises(AssertionError, match="o_proj.qweight"):
        vllm_load(config, header_of(as_float), as_float)
    # scales in float32 still load (vLLM copies them into the float16 parameter), int scales do not
    int_scales = broken(lambda t: t.update({k: v.int() for k, v in t.items() if k.endswith("down_proj.scales")}))
    with pytest.raises(AssertionError, match="down_proj.scales"):
        vllm_load(config, header_of(int_scales), int_scales)
    # names: a missing shard, and a tensor vLLM has no parameter for
    no_v = broken(lambda t: t.pop("model.layers.1.self_attn.v_proj.qzeros"))
    with pytest.raises(AssertionError, match="shards missing"):
        vllm_load(config, header_of(no_v), no_v)
    extra = broken(lambda t: t.update({"model.layers.0.mlp.down_proj.weight": torch.zeros(64, 128, dtype=torch.half)}))
    with pytest.raises(AssertionError, match="no parameter"):
        vllm_load(config, header_of(extra), extra)
    # config: the group size the tensors were not written for, and 8 bits
    for change, error, message in ((dict(group_size=64), AssertionError, "qzeros"), (dict(bits=8), ValueError, "8")):
        cfg = {**config, "quantization_config": {**config["quantization_config"], **change}}
        with pytest.raises(error, match=message):
            vllm_load(cfg, metadata, tensors)


def test_tensor_parallel_sizes_the_1_5b_shapes_allow():
    """vLLM's per-partition checks (create_weights, QKVParallelLinear's head split) applied to
    DeepSeek-R1-Distill-Qwen-1.5B's shapes (model_loader.testmodel's "full" preset): which --tensor-parallel-size
    works with each group size `r1desk-cli quantize --group-size` can write (docs/scale-out.md quotes this)."""
    from model_loader.testmodel import PRESETS

    cfg = PRESETS["full"]

    def fits(tp, group):
        try:
            for _, in_size, in_part, out_parts, _, _ in qwen2_linears(cfg, tp).values():
                create_weights(in_size, in_part, out_parts, group, torch.float16)
            return True
        except (AssertionError, ValueError):
            return False

    allowed = {group: [tp for tp in (1, 2, 4, 8) if fits(tp, group)] for group in (32, 64, 128, 256)}
    # 12 heads rule out 8; down_proj's input per rank (8960 / tp) must be a multiple of the group size:
    # 2240 (tp 4) is one of 32 and 64, not of 128; 4480 (tp 2) one of 128, not of 256
    assert allowed == {32: [1, 2, 4], 64: [1, 2, 4], 128: [1, 2], 256: [1]}
    # Marlin and vLLM's Triton kernel take group sizes 32, 64 and 128, not 256
    assert [g for g in (32, 64, 128, 256) if marlin_supported(4, g, True)] == [32, 64, 128]

    # the previous generation's AWQ-Marlin also wants each rank's output width % 64 and input width % 128
    # (verify_marlin_supports_shape), or that layer falls back to the plain AWQ kernel; 0.34 pads instead
    def all_marlin(tp):
        return all(
            sum(out_parts) % GPTQ_MARLIN_MIN_THREAD_N == 0 and in_part % GPTQ_MARLIN_MIN_THREAD_K == 0
            for _, _, in_part, out_parts, _, _ in qwen2_linears(cfg, tp).values()
        )

    assert [tp for tp in allowed[64] if all_marlin(tp)] == [1, 2]  # tp 4: down_proj's 2240 is not a multiple of 128
