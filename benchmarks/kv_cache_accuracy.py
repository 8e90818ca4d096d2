"""How far does the 8-bit KV cache move the model's outputs from the 16-bit cache's (a development tool)?

Teacher-forced: one token sequence (greedy continuation of a prompt under the 16-bit cache, or --random ids) is
prefilled with all logits under each cache format, in chunks as the engine does (the first chunk through SDPA
over the dequantized cache, later ones through our prefill attention over the cache), so every position attends
over a cache of that format up to its depth. Reported per depth band: how often the two pick the same top token,
the mean and largest KL(p16 || p8), and the largest logit difference. And the attention kernels' own error: the
decode attention over the 8-bit cache against the same rows in 16-bit, relative to the output's size.

On random weights (make-test-model) these measure numerical perturbation, not answer quality.
usage: python -m benchmarks.kv_cache_accuracy MODEL_DIR [--tokens 8192] [--prompt-tokens 512] [--json OUT]
"""

import argparse
import json

import torch

from model_loader.engine import Engine
from model_loader.kv_cache import KV_8BIT, KV_16BIT


def sequence(engine, prompt_tokens: int, total: int) -> list[int]:
    """A prompt of ordinary text (about prompt_tokens ids) and its greedy continuation (16-bit cache) up to
    `total` ids, as the engine's decode step makes it."""
    from model_loader.events import SamplingSettings

    sentence = "Explain, step by step, how a heat pump moves heat from a cold place to a warm one. "
    messages = [{"role": "user", "content": sentence * max(1, prompt_tokens // 20)}]
    ids = engine.chat.render(messages).ids
    events = list(
        engine.generate(messages, SamplingSettings(temperature=0, max_new_tokens=total - len(ids), ignore_eos=True))
    )
    return ids + list(events[-1].token_ids)


@torch.inference_mode()
def all_logits(engine, ids: list[int]) -> torch.Tensor:
    return engine.model.prefill(torch.tensor(ids, device=engine.model.device), 0, all_logits=True)


def compare(ref: torch.Tensor, other: torch.Tensor, bands: list[int]) -> list[dict]:
    rows, lo = [], 0
    for hi in bands:
        a, b = ref[lo:hi].float(), other[lo:hi].float()
        pa, lpa, lpb = a.softmax(-1), a.log_softmax(-1), b.log_softmax(-1)
        kl = (pa * (lpa - lpb)).sum(-1)
        rows.append(
            {
                "positions": f"{lo}-{hi - 1}",
                "top1_agree": (a.argmax(-1) == b.argmax(-1)).float().mean().item(),
                "kl_mean": kl.mean().item(),
                "kl_max": kl.max().item(),
                "max_logit_diff": (a - b).abs().max().item(),
            }
        )
        lo = hi
    return rows


def attention_error(model16, model8, depths: list[int]) -> dict:
    """The decode attention's output over each cache at these depths (layer 0's K/V as the prefill left them),
    for random queries: max |out8 - out16| / max |out16|."""
    out = {}
    for depth in depths:
        errs = []
        for layer in (0, model16.cfg.num_hidden_layers - 1):
            q = (
                torch.randn(
                    model16.cfg.num_attention_heads, model16.cfg.head_dim, device=model16.device, dtype=model16.dtype
                )
                * 4
            )
            pos = torch.tensor([depth - 1], dtype=torch.int32, device=model16.device)
            a = (
                model16.decode_attention(q, model16.k_cache[layer], model16.v_cache[layer], pos, depth, model16.scale)
                .float()
                .clone()
            )
            b = model8.decode_attention(
                q,
                model8.k_cache[layer],
                model8.v_cache[layer],
                pos,
                depth,
                model8.scale,
                scales=model8.cache_scales(layer),
            ).float()
            errs.append(((a - b).abs().max() / a.abs().max()).item())
        out[depth] = max(errs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--random", action="store_true", help="random ids instead of a greedy continuation")
    ap.add_argument("--json")
    args = ap.parse_args()
    ctx = args.tokens + 256
    e16 = Engine.load(args.model, context_length=ctx, kv_cache=KV_16BIT)
    e16.warm_up()
    if args.random:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, 150000, (args.tokens,), generator=g).tolist()
    else:
        ids = sequence(e16, args.prompt_tokens, args.tokens)
    ref = all_logits(e16, ids).cpu()
    e8 = Engine.load(args.model, context_length=ctx, kv_cache=KV_8BIT)
    e8.warm_up()
    got = all_logits(e8, ids).cpu()
    bands = [b for b in (512, 2048, 4096, 8192, 16384, 32768) if b < len(ids)] + [len(ids)]
    rows = compare(ref, got, bands)
    att = attention_error(e16.model, e8.model, [d for d in (512, 2048, len(ids)) if d <= len(ids)])
    print(
        f"{e16.info.model_name} on {e16.info.device_name} ({e16.info.dtype}"
        f"{', ' + e16.info.quantization if e16.info.quantization else ''}), {len(ids)} tokens "
        f"({'random ids' if args.random else f'{args.prompt_tokens}-token prompt + greedy continuation'})"
    )
    for r in rows:
        print(
            f"positions {r['positions']:>12}: same top token {100 * r['top1_agree']:6.2f}%   KL mean "
            f"{r['kl_mean']:.2e} max {r['kl_max']:.2e}   max |logit diff| {r['max_logit_diff']:.3f}"
        )
    for depth, err in att.items():
        print(f"decode attention at depth {depth}: max |8-bit - 16-bit| / max |16-bit| = {err:.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"model": args.model, "device": e16.info.device_name, "bands": rows, "attention_rel_err": att},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
