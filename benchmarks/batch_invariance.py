"""Is a sequence's text the same alone and in a batch once the linear layers are taken out of the question?

Decodes N different prompts greedily through the scheduler, each alone and then all together, with every linear
layer of a step run one row at a time (the single-token path a sequence alone takes). Every other kernel of the
batched step (norms, RoPE and cache writes, the paged attention) works row by row, so the texts must agree for all
the tokens: a shorter agreement means one of them depends on the batch. Then, for comparison, the same with the
linears as they run (cuBLAS GEMMs over all the rows), where on a GPU rounding makes them part early.

    python -m benchmarks.batch_invariance MODEL_DIR [--sequences 4] [--new-tokens 256]

Measured on an H100 (2026-12-06): row by row 256 of 256 tokens equal for each of 4 sequences (docs/BENCHMARKS.md,
"Exactness").
"""

from __future__ import annotations

import argparse
import json

import torch

from model_loader.bench_batch import batch_prompts
from model_loader.common_prefix import common_prefix
from model_loader.engine import Engine
from model_loader.events import Finished, SamplingSettings
from model_loader.linears import Linears
from model_loader.scheduler import Scheduler, SchedulerConfig


def texts(engine, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    settings = SamplingSettings(temperature=0, max_new_tokens=new_tokens, ignore_eos=True)
    blocks = len(prompts) * -(-(len(prompts[0]) + new_tokens + 1) // 64) + 1
    scheduler = Scheduler(engine.model, engine.chat, blocks, SchedulerConfig(max_seqs=len(prompts)))
    out: dict[int, Finished] = {}
    for i, ids in enumerate(prompts):
        scheduler.submit(
            ids, settings, sink=lambda ev, i=i: out.__setitem__(i, ev) if isinstance(ev, Finished) else None
        )
    scheduler.run_until_idle()
    scheduler.close()
    return [out[i].token_ids for i in range(len(prompts))]


def agreement(engine, prompts, new_tokens: int) -> list[int]:
    alone = [texts(engine, [p], new_tokens)[0] for p in prompts]
    together = texts(engine, prompts, new_tokens)
    return [common_prefix(a, b, new_tokens) for a, b in zip(alone, together)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--sequences", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    engine = Engine.load(args.model, device=args.device, context_length=1024)
    engine.warm_up()
    prompts = batch_prompts(engine, args.sequences, 512)
    as_they_run = agreement(engine, prompts, args.new_tokens)
    call, mlp = Linears.__call__, Linears.mlp

    def row_by_row(self, x, w):
        return torch.cat([call(self, x[i : i + 1], w) for i in range(x.shape[0])])

    def mlp_row_by_row(self, x, gate_up, down, silu):
        return torch.cat([mlp(self, x[i : i + 1], gate_up, down, silu) for i in range(x.shape[0])])

    Linears.__call__, Linears.mlp = row_by_row, mlp_row_by_row
    try:
        rowwise = agreement(engine, prompts, args.new_tokens)
    finally:
        Linears.__call__, Linears.mlp = call, mlp
    print(
        json.dumps(
            {
                "device": engine.info.device_name,
                "new_tokens": args.new_tokens,
                "linears_as_they_run": as_they_run,
                "linears_row_by_row": rowwise,
            }
        )
    )


if __name__ == "__main__":
    main()
