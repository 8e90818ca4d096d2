"""Without Triton's kernels, does the CUDA-graph path compute what the eager path does, and how fast is each?

One engine loaded with `use_triton=False` (what a machine without a C compiler runs: kernels/torch_graph_ops.py
in CUDA graphs), a 500-token prompt, then teacher-forced: the prefill's last logits from the fresh-prefill graph and
from the eager prefill, and 256 decode steps, each step's logits from its decode graph and from the eager reference
decode at the same position over the same cache (the eager step's K/V overwrite the graph's). Reports the largest
and median difference, the steps whose top token differs and, for those, the eager top-2 gap there (a flip where the
gap is larger than the difference would be a bug; under it, rounding decides a near tie). Then greedy decode speed
with graphs and, in a second load, without.

    python -m benchmarks.no_triton_graphs --model M [--json F]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def teacher_forced(engine, prompt: list[int], steps: int) -> dict:
    from model_loader.events import Finished, SamplingSettings

    model, step = engine.model, engine.step
    greedy = SamplingSettings(temperature=0, max_new_tokens=steps, ignore_eos=True)
    tokens = [e for e in engine.generate_ids(prompt, greedy) if isinstance(e, Finished)][-1].token_ids
    with torch.inference_mode():
        eager = model.prefill(torch.tensor(prompt, device=model.device), 0).float()
        graph = engine.prefill_graphs.run(prompt, 0).float()
        res = {"prefill_max_abs_diff": float((eager - graph).abs().max()), "logit_abs_max": float(eager.abs().max())}
        diffs, flips = [], []
        for j, tok in enumerate([int(eager.argmax())] + tokens[: steps - 1]):
            pos = len(prompt) + j
            step.token.fill_(tok)
            step.pos.fill_(pos)
            g = step.run("greedy", pos).float().clone()  # the graph of this position's span
            model.set_decode_attention_config(None)  # eager: the reference attention over the exact length
            pos_t = torch.tensor([pos], device=model.device, dtype=torch.int32)
            e = model.decode(torch.tensor([tok], device=model.device), pos_t, pos).float()
            diffs.append(float((g - e).abs().max()))
            if int(g.argmax()) != int(e.argmax()):
                top2 = torch.topk(e[0], 2).values
                flips.append({"step": j, "diff": round(diffs[-1], 4), "top2_gap": round(float(top2[0] - top2[1]), 4)})
    res.update(
        decode_max_abs_diff=max(diffs),
        decode_median_abs_diff=sorted(diffs)[len(diffs) // 2],
        top1_flips=len(flips),
        flips=flips[:20],
    )
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--json")
    args = ap.parse_args()
    from model_loader.bench import bench_prompt
    from model_loader.engine import Engine
    from model_loader.events import Finished, SamplingSettings

    out = {}
    for graphs in (True, False):
        engine = Engine.load(args.model, device="cuda", context_length=4096, use_triton=False, use_cuda_graphs=graphs)
        engine.warm_up()
        prompt = bench_prompt(engine, 500)
        if graphs:
            out["graph_vs_eager"] = teacher_forced(engine, prompt, 256)
            out["spans"] = [upper for upper, _ in engine.step.plan]
        greedy = SamplingSettings(temperature=0, max_new_tokens=256, ignore_eos=True)
        done = [e for e in engine.generate_ids(prompt, greedy) if isinstance(e, Finished)][-1]
        out["graphs" if graphs else "eager"] = {"decode_tok_s": done.stats.decode_tok_s, "ttft_ms": done.stats.ttft_ms}
        del engine
        torch.cuda.empty_cache()
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
