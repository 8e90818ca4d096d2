"""Which decode-attention configuration makes the whole decode step fastest at each depth (a development tool)?

The whole decode step's GPU time for each decode-attention configuration, by context depth, on a CUDA GPU.

Inside the step the attention's kernels overlap their neighbours (programmatic dependent launch), so timing it
alone ranks its shapes differently: this captures one greedy decode graph per configuration (each candidate of
decode_attention.DECODE_ATTN_CONFIGS with and without `late_launch`; --extra: more shapes; --reduce SxD,...: each also
with its split reduce combining S splits per pass (0: all) over D dimensions per program) and times the graph itself at
each depth. The warm-up does the same on a smaller scale (decode_graphs.DecodeStep.tune).
usage: python -m benchmarks.decode_step_by_attention MODEL_DIR [--depths 512,4096,16384,32768] [--extra] [--sm-fill]
           [--per-sm 3,4] [--reverse] [--reduce 32x32,0x32] [--kv-cache 8-bit] [--whole-tiles] [--json OUT]
--kv-cache 8-bit: over the 8-bit cache (its own candidates, decode_attention.KV8_CONFIGS, too).
--whole-tiles: each configuration also with DecodeAttnConfig.whole_tiles flipped (timed right after it).
--per-sm N,...: also shapes that put N programs on every SM (_per_sm; 2026-12-05, for the 8-bit cache, whose
loop was bound by latency with two programs an SM).
"""

import argparse
import dataclasses
import json

import torch

from model_loader.engine import Engine
from model_loader.kernels import decode_attention

from benchmarks.profile_decode import time_graph


def _extra():
    C = decode_attention.DecodeAttnConfig
    return [
        C(128, 256, 128, 4, 4),
        C(64, 128, 128, 8, 3),
        C(128, 128, 64, 4, 3),
        C(64, 128, 64, 4, 4),
        C(64, 128, 128, 4, 2),
        C(128, 128, 128, 8, 2),
        C(128, 128, 128, 4, 3),
        C(64, 256, 256, 4, 2),
        C(64, 256, 256, 8, 2),
    ]


def _sm_fill(device, num_kv_heads: int):
    """Variants of the candidates (2026-12-04): the short-context shape with 64-token tiles, the split-per-SM
    shape with 8 warps, 64 fixed splits, two programs an SM (64- and, 2026-12-05, 128-token tiles: the 8-bit
    cache's transposed V leaves room for two 3-stage programs an SM); all with the first K/V tile read early."""
    C = decode_attention.DecodeAttnConfig
    two_per_sm = 2 * decode_attention.sm_splits(device, num_kv_heads)
    return [
        C(32, 64, 64, 4, 3, early_tile=True),
        C(decode_attention.SM_SPLITS, 128, 128, 8, 3, chunk_align=1, early_tile=True),
        C(64, 128, 128, 4, 3, early_tile=True),
        C(two_per_sm, 64, 64, 4, 3, chunk_align=1, early_tile=True),
        C(two_per_sm, 128, 128, 4, 3, chunk_align=1, early_tile=True),
    ]


def _per_sm(counts: list[int]):
    """N programs an SM (SM_SPLITS x splits_per_sm) for each N: 64-token tiles with 4 and 2 warps, 32-token tiles
    with 4, all 3 stages with the first tile early. With V transposed an 8-bit 64-token program takes 40,960 bytes
    of shared memory and 141 registers a thread at sm_90 (2026-12-05), so three fit an SM's registers."""
    C = decode_attention.DecodeAttnConfig
    return [
        C(decode_attention.SM_SPLITS, block, block, warps, 3, chunk_align=1, early_tile=True, splits_per_sm=n)
        for n in counts
        for block, warps in ((64, 4), (64, 2), (32, 4))
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--depths", default="512,4096,16384,32768")
    ap.add_argument("--json")
    ap.add_argument("--extra", action="store_true", help="also shapes outside the candidate list (_extra)")
    ap.add_argument("--sm-fill", action="store_true", help="also the 2026-12-04 variants (_sm_fill)")
    ap.add_argument("--per-sm", default="", help="also shapes with N programs an SM, for each N given: N,...")
    ap.add_argument("--reverse", action="store_true", help="time the configurations in reverse order (drift check)")
    ap.add_argument("--reduce", default="", help="reduce shapes to try besides each config's own: SxD,...")
    ap.add_argument("--kv-cache", default="16-bit", help="the KV cache's format: 16-bit or 8-bit")
    ap.add_argument(
        "--whole-tiles",
        action="store_true",
        help="each configuration also with whole_tiles flipped, timed right after it",
    )
    args = ap.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    engine = Engine.load(args.model, device="cuda", context_length=max(depths) + 512, kv_cache=args.kv_cache)
    engine.warm_up()
    step = engine.step
    kv8 = list(decode_attention.KV8_CONFIGS) if args.kv_cache == "8-bit" else []
    base = (
        list(decode_attention.DECODE_ATTN_CONFIGS)
        + kv8
        + (_extra() if args.extra else [])
        + (_sm_fill(engine.model.device, engine.model.cfg.num_key_value_heads) if args.sm_fill else [])
        + _per_sm([int(n) for n in filter(None, args.per_sm.split(","))])
    )
    configs = list(dict.fromkeys(dataclasses.replace(c, late_launch=late) for c in base for late in (False, True)))
    for shape in filter(None, args.reduce.split(",")):
        splits, dims = (int(x) for x in shape.split("x"))
        configs += [
            dataclasses.replace(c, reduce_splits=splits, reduce_dims=dims)  # 0: all splits in one pass
            for c in list(configs)
            if (c.reduce_splits, c.reduce_dims) == (0, 16)
        ]
    if args.whole_tiles:
        configs = [x for c in configs for x in (c, dataclasses.replace(c, whole_tiles=not c.whole_tiles))]
    configs = list(dict.fromkeys(configs))[:: -1 if args.reverse else 1]
    # split buffers for every shape tried (before any graph below is captured)
    if args.extra or args.sm_fill or args.per_sm or kv8 or args.whole_tiles:
        old = engine.model.decode_attention
        engine.model.decode_attention = decode_attention.DecodeAttention(
            old.num_heads, old.num_kv_heads, old.head_dim, engine.model.device, old.out.dtype, configs=configs
        )
        step.graphs.clear()  # the warm-up's graphs use the old buffers: every graph below is captured anew
    rows = {}
    for config in configs:
        step.plan = [(engine.model.max_ctx, config)]
        try:
            step.capture("greedy")
        except Exception as err:  # more shared memory or registers than this GPU has
            print(f"{str(config):70s} can't run here: {str(err)[:80]}", flush=True)
            continue
        graph = step.graphs[("greedy", config)]
        rows[str(config)] = {depth: round(time_graph(step, graph, depth), 1) for depth in depths}
        print(f"{str(config):70s} " + " ".join(f"{us:8.1f}" for us in rows[str(config)].values()), flush=True)
    best = {depth: min(rows, key=lambda c: rows[c][depth]) for depth in depths}
    for depth in depths:
        print(f"depth {depth}: best {best[depth]} {rows[best[depth]][depth]} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"model": args.model, "device": torch.cuda.get_device_name(), "step_us": rows, "best": best},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
