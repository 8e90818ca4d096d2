"""The 4-bit scheduler's decode with the research int4 GEMM (int4_gemm_rows' wide kernel) in place of the dense
copy + cuBLAS, for each shape and row bucket where int4_gemm_rows measured it faster, alternated with the dense
path in one process on one loaded model (a research tool: a GEMM that wins a linear alone may still lose the step,
as the first one did).

    python -m benchmarks.research.int4_gemm_rows --json BEST.json
    python -m benchmarks.research.int4_gemm_in_step MODEL_AWQ --configs BEST.json [--batch 8,32] [--rounds 2]
        [--tinygemm]   (torch's int4 kernel too, on a copy of the weights in its layout)

Prints, per round and path, the decode tok/s and step time at each batch (bench --batch's steady state), and how
many leading greedy tokens each sequence shares with the dense path's (rounding differs, so a few may part).
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks.research.int4_gemm_rows import arrival_counts, int4_gemm_wide
from model_loader import awq as fmt
from model_loader.awq import RowPackedInt4
from model_loader.bench_batch import _one_batch, batch_prompts
from model_loader.common_prefix import common_prefix
from model_loader.engine import Engine
from model_loader.linears import Linears
from model_loader.scheduler import Scheduler, SchedulerConfig


def chosen_configs(report: dict) -> dict[int, dict[str, dict]]:
    """{row bucket: {"NxK": the sweep's best wide variant}} where it beat the dense path."""
    return {
        int(rows): {shape: r for shape, r in by_shape.items() if r["wide_us"] < r["dense_us"]}
        for rows, by_shape in report.items()
    }


def with_gemm(dense_call, chosen: dict[int, dict[str, dict]]):
    """Linears.__call__ that sends 2..largest-bucket rows of a 4-bit weight to the wide GEMM where chosen."""
    buckets = sorted(chosen)

    def call(self, x, w):
        if isinstance(w, RowPackedInt4) and 1 < x.shape[0] <= buckets[-1]:
            bucket = next(b for b in buckets if x.shape[0] <= b)
            best = chosen[bucket].get(f"{w.out_features}x{w.in_features}")
            if best:
                return int4_gemm_wide(x.contiguous(), w, *best["config"], last_sums=best["last_sums"], pdl=best["pdl"])
        return dense_call(self, x, w)

    return call


def row_packed_ints(w: RowPackedInt4) -> tuple:
    """W's ints, zeros and scales as AWQ lays them out ([K, N], [K/group, N], [K/group, N]; rows in the dense
    order), unpacked from the row-packed layout (awq.RowPackedInt4 says where each nibble lives)."""
    n, k = w.shape
    shifts = torch.arange(0, 32, 4, device=w.qweight.device, dtype=torch.int32)
    blocks = w.qweight.view(n, k // (8 * w.interleave), 1, w.interleave)
    q = ((blocks >> shifts.view(1, 1, 8, 1)) & 0xF).reshape(n, k)  # [n, b, j, i] -> input 8*IB*b + IB*j + i
    z, s = w.zeros.float().round().to(torch.int32), w.scales
    if w.gate_up_pairs:  # stored (gate i, up i): back to [gate; up]
        q, z, s = (torch.cat([t[0::2], t[1::2]]) for t in (q, z, s))
    return q.t().contiguous(), z.t().contiguous(), s.t().contiguous()


def with_tinygemm(dense_call, model, largest: int):
    """Linears.__call__ that sends 2..largest rows of every 4-bit weight to torch's int4 kernel (tinygemm), on a
    copy of each weight in its layout (made here)."""
    copies = {}
    for layer in model.w["layers"]:
        for w in layer.values():
            if isinstance(w, RowPackedInt4) and id(w) not in copies:
                copies[id(w)] = fmt.to_int4pack(*row_packed_ints(w), w.group_size)

    def call(self, x, w):
        if isinstance(w, RowPackedInt4) and 1 < x.shape[0] <= largest:
            return fmt.int4_linear(x.contiguous(), copies[id(w)])
        return dense_call(self, x, w)

    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--configs", help="int4_gemm_rows' --json (without it: no wide GEMM path)")
    ap.add_argument("--batch", default="8,32")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test under TRITON_INTERPRET=1")
    ap.add_argument("--tinygemm", action="store_true", help="also torch's int4 kernel on its own copy of the weights")
    args = ap.parse_args()
    sizes = [int(b) for b in args.batch.split(",")]
    chosen = chosen_configs(json.loads(open(args.configs).read())) if args.configs else {}
    print("the wide GEMM where it won the sweep:", json.dumps(chosen), flush=True)
    engine = Engine.load(
        args.model, device=args.device, context_length=args.prompt_tokens + args.new_tokens + 16, use_triton=True
    )
    engine.warm_up()
    arrival_counts(engine.model.device)  # made before any graph capture launches the GEMM
    prompts = batch_prompts(engine, max(sizes), args.prompt_tokens)
    block = 64
    per_seq = -(-(args.prompt_tokens + args.new_tokens + 1) // block)
    config = SchedulerConfig(max_seqs=max(sizes), chunk=512, block_size=block)
    dense_call = Linears.__call__
    paths = {"dense": dense_call}
    if any(chosen.values()):
        paths["wide"] = with_gemm(dense_call, chosen)
    if args.tinygemm:
        paths["tinygemm"] = with_tinygemm(dense_call, engine.model, max(sizes))
    dense_ids: dict[int, list] = {}
    try:
        for round_ in range(args.rounds):
            for name, call in paths.items():
                Linears.__call__ = call  # before the scheduler: its graphs capture what this path launches
                scheduler = Scheduler(engine.model, engine.chat, num_blocks=max(sizes) * per_seq + 1, config=config)
                _one_batch(scheduler, prompts[: sizes[0]], args.new_tokens)  # untimed warm-up
                for size in sizes:
                    row = _one_batch(scheduler, prompts[:size], args.new_tokens)
                    if name == "dense":
                        dense_ids.setdefault(size, row["ids"])
                    same = [common_prefix(a, b, args.new_tokens) for a, b in zip(dense_ids[size], row["ids"])]
                    print(
                        f"round {round_} {name:5} {size:2} sequences: {row['decode_tok_s']:9.1f} tok/s, "
                        f"step {row['decode_step_ms']:.3f} ms; leading tokens as the dense path's: min {min(same)}, "
                        f"median {sorted(same)[len(same) // 2]} of {args.new_tokens}",
                        flush=True,
                    )
                del scheduler
                torch.cuda.empty_cache()
    finally:
        Linears.__call__ = dense_call


if __name__ == "__main__":
    main()
