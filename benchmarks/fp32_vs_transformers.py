"""Does our engine in fp32 give the same greedy ids as transformers' fp32 on a full-size model (issue 12, point 6)?

Our engine with `--dtype fp32` on the GPU (Triton kernels, CUDA graphs) against transformers' Qwen2ForCausalLM
in fp32 on the same GPU, greedy, on the prompts of tests/test_qwen2_vs_transformers.py. Reports per prompt whether
the ids are equal for N tokens, and otherwise where they first differ and transformers' logit gap between its top
two tokens there (a gap of a few 1e-6 is a tie that any change of summation order may break; TF32 used to break
gaps of 0.005-0.09).

    python -m benchmarks.fp32_vs_transformers --model M [--tokens 48] [--json F]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--json")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    from model_loader.engine import Engine
    from model_loader.events import Finished, SamplingSettings
    from tests.test_qwen2_vs_transformers import PROMPTS

    torch.backends.cuda.matmul.allow_tf32 = False  # transformers' side in true fp32 too (the default; stated)
    torch.backends.cudnn.allow_tf32 = False
    engine = Engine.load(args.model, device="cuda", dtype="fp32", context_length=2048)
    engine.warm_up()
    hf = (
        AutoModelForCausalLM.from_pretrained(
            args.model, dtype=torch.float32, local_files_only=True, trust_remote_code=False
        )
        .cuda()
        .eval()
    )
    rows = []
    for name, messages in PROMPTS.items():
        ids = engine.chat.render(messages).ids
        settings = SamplingSettings(temperature=0, max_new_tokens=args.tokens, ignore_eos=True)
        ours = [e for e in engine.generate(messages, settings) if isinstance(e, Finished)][0].token_ids
        engine.reset_cache()
        with torch.no_grad():
            out = hf.generate(
                torch.tensor([ids], device="cuda"),
                do_sample=False,
                max_new_tokens=args.tokens,
                min_new_tokens=args.tokens,
                pad_token_id=0,
                output_scores=True,
                return_dict_in_generate=True,
            )
        theirs = out.sequences[0, len(ids) :].tolist()
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        row = {"prompt": name, "prompt_tokens": len(ids), "equal": first is None, "first_difference": first}
        if first is not None:
            top2 = out.scores[first][0].float().topk(2).values
            row["hf_top2_gap_there"] = float(top2[0] - top2[1])
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {
        "model": engine.info.model_name,
        "dtype": engine.info.dtype,
        "kernels": engine.info.kernels,
        "cuda_graphs": engine.info.cuda_graphs,
        "tokens": args.tokens,
        "prompts": rows,
        "all_equal": all(r["equal"] for r in rows),
    }
    print(
        f"{sum(r['equal'] for r in rows)}/{len(rows)} prompts: greedy ids equal to transformers' fp32 for "
        f"{args.tokens} tokens"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
