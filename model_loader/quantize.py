"""r1desk-cli quantize: our own AWQ (activation-aware weight quantization, Lin et al. 2023) for Qwen2 models.

Layer by layer, calibration text runs through the model; for each group of linears that share an input we
search per-input-channel scales s = mean|x|^a / mean|w~|^(1-a) (a on a grid) that minimise the error of the
block's output when the weights are quantized as W*s (and the input divided by s), fold s into the
preceding RMSNorm or linear, optionally search a per-group clipping range, and quantize group-wise
asymmetric int4. The next layer sees the output of this layer with the scaled (unquantized) weights.
The result is written in AWQ's GEMM layout (awq.pack), loadable by r1desk, transformers and vLLM.

Blocks, as in the reference implementation: q/k/v (scale folded into input_layernorm, error measured on the
attention output), gate/up (folded into post_attention_layernorm, error on the MLP output), down (folded
into up_proj's rows, error on down's output). o_proj is not scaled: with grouped-query attention its input
channels cannot be rescaled through v_proj. q and k skip clipping (attention scores are sensitive to it).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from model_loader import awq as fmt
from model_loader.kernels.reference import keep_off_cudnn
from model_loader.errors import ModelError

N_GRID = 20
CLIP_SHRINK = 0.5  # search clipping down to half the group's max
CALIBRATION_FILE = Path(__file__).resolve().parent.parent / "assets" / "calibration" / "passages.jsonl"


@dataclass
class QuantizeReport:
    out_dir: str
    layers: int
    group_size: int
    calibration_tokens: int
    seconds: float
    mean_scale_loss_reduction: float  # mean over blocks of 1 - best_loss / loss_at_ratio_0 (plain RTN)


def pseudo_quantize(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group-wise asymmetric int4 round-to-nearest of W [out, in] along `in`.
    Returns (dequantized W, ints q [out, in], (scales, zeros) [out, in/group])."""
    out_f, in_f = w.shape
    g = w.reshape(-1, group)
    w_max, w_min = g.amax(dim=1, keepdim=True), g.amin(dim=1, keepdim=True)
    scales = (w_max - w_min).clamp(min=1e-5) / 15
    zeros = (-torch.round(w_min / scales)).clamp(0, 15)
    q = (torch.round(g / scales) + zeros).clamp(0, 15)
    deq = ((q - zeros) * scales).reshape(out_f, in_f)
    return deq, q.reshape(out_f, in_f), torch.stack([scales.reshape(out_f, -1), zeros.reshape(out_f, -1)])


def calibration_tokens(
    tokenizer_encode: Callable[[str], list[int]], eos: int, calib: Path | None, samples: int, seq_len: int
) -> torch.Tensor:
    """Passages -> [samples, seq_len] token blocks (concatenated with EOS between passages, then cut)."""
    path = Path(calib) if calib else CALIBRATION_FILE
    if not path.is_file():
        raise ModelError(f"{path}: calibration file not found")
    texts = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                texts.append(json.loads(line)["text"])
            except (ValueError, KeyError, TypeError) as err:
                raise ModelError(f'{path}: not a JSON-lines file of {{"text": ...}} objects ({err})') from err
        else:
            texts.append(line)
    ids: list[int] = []
    for text in texts:
        ids += tokenizer_encode(text) + [eos]
        if len(ids) >= samples * seq_len:
            break
    n = min(samples, len(ids) // seq_len)
    if n < 1:
        raise ModelError(f"{path}: too little calibration text ({len(ids)} tokens; need at least {seq_len})")
    return torch.tensor(ids[: n * seq_len]).view(n, seq_len)


class LayerMath:
    """The fp32 forward of one decoder layer on [S, L, H] activations, with replaceable linear weights."""

    def __init__(self, cfg, cos, sin):
        self.cfg, self.cos, self.sin = cfg, cos, sin

    def norm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps) * w

    def attention(self, x, W):
        """x: normed [S, L, H] -> o_proj output [S, L, H]."""
        cfg = self.cfg
        s, length, _ = x.shape
        d, hq, hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        qkv = x @ torch.cat([W["q"], W["k"], W["v"]]).t() + W["qkv_b"]
        q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
        q = q.view(s, length, hq, d).transpose(1, 2)
        k = k.view(s, length, hkv, d).transpose(1, 2)
        v = v.view(s, length, hkv, d).transpose(1, 2)
        c, sn = self.cos[:length], self.sin[:length]

        def rope(t):
            t1, t2 = t[..., : d // 2], t[..., d // 2 :]
            return torch.cat((t1 * c - t2 * sn, t2 * c + t1 * sn), dim=-1)

        q, k = rope(q), rope(k)
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(s, length, hq * d)

    @staticmethod
    def mlp_act(x, W):
        return F.silu(x @ W["gate"].t()) * (x @ W["up"].t())


def _search_scales(
    x: torch.Tensor, weights: list[torch.Tensor], block: Callable[[list[torch.Tensor]], torch.Tensor], group: int
) -> tuple[torch.Tensor, float]:
    """Best per-input-channel scale for linears sharing input x [N, in]; block(ws) -> output for weights ws."""
    x_mean = x.abs().reshape(-1, x.shape[-1]).mean(0)
    w_all = torch.cat(weights)
    wg = w_all.abs().reshape(-1, group)
    w_mean = (wg / wg.amax(dim=1, keepdim=True).clamp(min=1e-8)).reshape(w_all.shape).mean(0)
    ref = block(weights)
    best, best_scales, base = float("inf"), None, None
    for i in range(N_GRID):
        ratio = i / N_GRID
        scales = (x_mean.pow(ratio) / w_mean.pow(1 - ratio).clamp(min=1e-4)).clamp(min=1e-4)
        scales = scales / (scales.max() * scales.min()).sqrt()
        trial = [pseudo_quantize(w * scales, group)[0] / scales for w in weights]
        loss = (block(trial) - ref).pow(2).mean().item()
        if i == 0:
            base = loss
        if loss < best:
            best, best_scales = loss, scales
    return best_scales, (1 - best / base) if base else 0.0


def _search_clip(
    w: torch.Tensor, x: torch.Tensor, group: int, max_tokens: int = 512, rows_per_batch: int = 1024
) -> torch.Tensor:
    """Per (output row, group) clipping of W [out, in] that minimises the error of x @ W.T on a sample of
    tokens; returns W clipped. Output rows go in batches to bound memory ([rows, tokens, groups] floats)."""
    out_f, in_f = w.shape
    xs = x.reshape(-1, in_f)
    xs = xs[torch.linspace(0, xs.shape[0] - 1, min(max_tokens, xs.shape[0]), device=xs.device).long()]
    xg = xs.view(xs.shape[0], in_f // group, group)  # [T, G, g]
    clipped = []
    for r0 in range(0, out_f, rows_per_batch):
        wg = w[r0 : r0 + rows_per_batch].reshape(-1, in_f // group, group)  # [O, G, g]
        org_max = wg.abs().amax(dim=-1, keepdim=True)  # [O, G, 1]
        best_max = org_max.clone()
        ref = torch.einsum("tgk,ogk->otg", xg, wg)
        min_err = torch.full(org_max.shape[:2], float("inf"), device=w.device)
        for i in range(int(N_GRID * CLIP_SHRINK)):
            max_val = org_max * (1 - i / N_GRID)
            q = pseudo_quantize(wg.clamp(-max_val, max_val).reshape(-1, in_f), group)[0].view_as(wg)
            err = (torch.einsum("tgk,ogk->otg", xg, q) - ref).pow(2).mean(dim=1)  # [O, G]
            better = err < min_err
            min_err = torch.where(better, err, min_err)
            best_max = torch.where(better[..., None], max_val, best_max)
        clipped.append(wg.clamp(-best_max, best_max).reshape(-1, in_f))
    return torch.cat(clipped)


def quantize(
    model_dir,
    out_dir,
    group_size: int = 128,
    calib: str | None = None,
    samples: int = 128,
    seq_len: int = 512,
    device: str | None = None,
    clip: bool = True,
    progress: Callable[[int, int, str], None] | None = None,
) -> QuantizeReport:
    from model_loader.device import pick_device, use_device
    from model_loader.locate import resolve_model
    from model_loader.qwen2 import rope_tables
    from model_loader.tokenizer import load_tokenizer
    from model_loader.weights import load_weights

    t0 = time.perf_counter()
    folder = resolve_model(model_dir)
    cfg = folder.config
    if cfg.awq is not None:
        raise ModelError(f"{folder.path / 'config.json'}: this model is already quantized")
    for width in (cfg.hidden_size, cfg.intermediate_size, cfg.q_size):
        if width % group_size:
            raise ModelError(f"group size {group_size} does not divide the layer width {width}")
    if group_size not in fmt.SUPPORTED_GROUP_SIZES:
        raise ModelError(f"group size {group_size} is not supported (32, 64, 128 or 256)")
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ModelError(f"{out}: output folder exists and is not empty")
    keep_off_cudnn()
    dev = pick_device(device)
    use_device(dev)
    tok = load_tokenizer(folder.path)
    eos = cfg.eos_token_id[0] if cfg.eos_token_id else tok.eos_token_id
    tokens = calibration_tokens(lambda t: tok.encode(t, add_special_tokens=False), eos, calib, samples, seq_len)
    # Weights stay in their stored precision on the device; each layer is processed in fp32.
    store = torch.bfloat16 if dev.type == "cuda" else torch.float32
    w = load_weights(cfg, folder.shards, dev, store)
    cos, sin = rope_tables(cfg, seq_len, dev)
    math = LayerMath(cfg, cos, sin)
    q, kv, i_size = cfg.q_size, cfg.kv_size, cfg.intermediate_size
    h = F.embedding(tokens.to(dev), w["embed"]).float()  # [S, L, H]
    tensors: dict[str, torch.Tensor] = {}
    gains: list[float] = []
    saved_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # exact fp32 for the search, restored below
    try:
        with torch.inference_mode():
            for index, layer in enumerate(w["layers"]):
                if progress:
                    progress(index, cfg.num_hidden_layers, "searching scales")
                qkv_w = layer["qkv_w"].float()
                W = {
                    "q": qkv_w[:q],
                    "k": qkv_w[q : q + kv],
                    "v": qkv_w[q + kv :],
                    "qkv_b": layer["qkv_b"].float(),
                    "o": layer["o_w"].float(),
                    "gate": layer["gate_up_w"][:i_size].float(),
                    "up": layer["gate_up_w"][i_size:].float(),
                    "down": layer["down_w"].float(),
                }
                ln1, ln2 = layer["ln1"].float(), layer["ln2"].float()

                # q/k/v: error on the attention block's output; fold into input_layernorm
                x1 = math.norm(h, ln1)
                s, gain = _search_scales(
                    x1,
                    [W["q"], W["k"], W["v"]],
                    lambda ws: math.attention(x1, {**W, "q": ws[0], "k": ws[1], "v": ws[2]}) @ W["o"].t(),
                    group_size,
                )
                gains.append(gain)
                ln1 = ln1 / s
                W["q"], W["k"], W["v"] = W["q"] * s, W["k"] * s, W["v"] * s
                x1 = math.norm(h, ln1)
                attn = math.attention(x1, W)
                h2 = h + attn @ W["o"].t()

                # gate/up: error on the MLP output; fold into post_attention_layernorm
                x2 = math.norm(h2, ln2)
                s, gain = _search_scales(
                    x2,
                    [W["gate"], W["up"]],
                    lambda ws: math.mlp_act(x2, {"gate": ws[0], "up": ws[1]}) @ W["down"].t(),
                    group_size,
                )
                gains.append(gain)
                ln2 = ln2 / s
                W["gate"], W["up"] = W["gate"] * s, W["up"] * s
                x2 = math.norm(h2, ln2)
                act = math.mlp_act(x2, W)

                # down: error on its own output; fold into up_proj's rows
                s, gain = _search_scales(act, [W["down"]], lambda ws: act @ ws[0].t(), group_size)
                gains.append(gain)
                W["up"] = W["up"] / s[:, None]
                W["down"] = W["down"] * s
                act = act / s
                h_next = h2 + act @ W["down"].t()

                if progress:
                    progress(index, cfg.num_hidden_layers, "clipping and packing")
                inputs = {"q": x1, "k": x1, "v": x1, "o": attn, "gate": x2, "up": x2, "down": act}
                names = {
                    "q": "self_attn.q_proj",
                    "k": "self_attn.k_proj",
                    "v": "self_attn.v_proj",
                    "o": "self_attn.o_proj",
                    "gate": "mlp.gate_proj",
                    "up": "mlp.up_proj",
                    "down": "mlp.down_proj",
                }
                prefix = f"model.layers.{index}."
                for key, name in names.items():
                    weight = W[key]
                    if clip and key not in ("q", "k"):
                        weight = _search_clip(weight, inputs[key], group_size)
                    _, ints, (scales, zeros) = pseudo_quantize(weight, group_size)
                    # AWQ layout: ints and zeros transposed to [in, out] and packed along out
                    tensors[prefix + name + ".qweight"] = fmt.pack(ints.t().contiguous().to(torch.int32)).cpu()
                    tensors[prefix + name + ".qzeros"] = fmt.pack(zeros.t().contiguous().to(torch.int32)).cpu()
                    tensors[prefix + name + ".scales"] = scales.t().contiguous().half().cpu()
                b = W["qkv_b"].half().cpu()
                tensors[prefix + "self_attn.q_proj.bias"] = b[:q].clone()
                tensors[prefix + "self_attn.k_proj.bias"] = b[q : q + kv].clone()
                tensors[prefix + "self_attn.v_proj.bias"] = b[q + kv :].clone()
                tensors[prefix + "input_layernorm.weight"] = ln1.half().cpu()
                tensors[prefix + "post_attention_layernorm.weight"] = ln2.half().cpu()
                h = h_next
                for k in list(layer):  # free this layer's dense weights as we go
                    layer[k] = None
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved_tf32
    tensors["model.embed_tokens.weight"] = w["embed"].half().cpu()
    tensors["model.norm.weight"] = w["norm"].half().cpu()
    if not cfg.tie_word_embeddings:
        tensors["lm_head.weight"] = w["lm_head"].half().cpu()
    _write_folder(folder.path, out, tensors, group_size)
    if progress:
        progress(cfg.num_hidden_layers, cfg.num_hidden_layers, "done")
    return QuantizeReport(
        out_dir=str(out),
        layers=cfg.num_hidden_layers,
        group_size=group_size,
        calibration_tokens=tokens.numel(),
        seconds=time.perf_counter() - t0,
        mean_scale_loss_reduction=sum(gains) / len(gains),
    )


def _write_folder(src: Path, out: Path, tensors: dict, group_size: int) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    config["torch_dtype"] = "float16"
    config["quantization_config"] = {
        "quant_method": "awq",
        "version": "gemm",
        "bits": 4,
        "zero_point": True,
        "group_size": group_size,
        "modules_to_not_convert": None,
    }
    tmp = out / "model.safetensors.partial"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata={"format": "pt"})
    tmp.replace(out / "model.safetensors")  # a crash never leaves a half-written checkpoint behind
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "special_tokens_map.json",
        "vocab.json",
        "merges.txt",
        "chat_template.jinja",
        "chat_template.json",
        "LICENSE",
    ):
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
