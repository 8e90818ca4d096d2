"""Does the engine run right on a GPU that is not the thread's current one (machines with two or more GPUs)?

Triton launches and CUDA graphs go to the thread's current device, which is cuda:0 unless the engine makes its
own GPU current (engine.use_device), and torch captures graphs on a stream of the GPU of its first capture unless
given one (kernels.side_stream.graph_capture). This loads the model on the last GPU, then on cuda:0, from one
thread whose current device is set back to cuda:0 before every call,
warms both up (Triton kernels, tuned decode graphs, prefill graphs), and checks: the prompt's logits agree
between the two; a seeded sampled reply repeats itself on the last GPU (its generator is the one seeded); the
engine on the last GPU left no tensors on cuda:0; and it all ran (a kernel launched on the wrong GPU fails with
an illegal memory access). Greedy replies, fresh and follow-up, are compared too, for information: each GPU's
warm-up tunes its own kernel choices, whose different summation orders may part two greedy replies at a near
tie. Prints JSON; exit status 1 when a check fails.

    python -m benchmarks.second_gpu_check --model M [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def reply(engine, messages, settings):
    from model_loader.events import Finished

    return [ev for ev in engine.generate(messages, settings) if isinstance(ev, Finished)][0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    from model_loader.engine import Engine
    from model_loader.events import SamplingSettings

    count = torch.cuda.device_count()
    if count < 2:
        print(json.dumps({"error": f"this machine has {count} GPU(s); the check needs two"}))
        return 1
    last = f"cuda:{count - 1}"
    greedy = SamplingSettings(temperature=0, max_new_tokens=args.tokens, ignore_eos=True)
    sampled = SamplingSettings(temperature=0.6, top_p=0.95, max_new_tokens=args.tokens, ignore_eos=True, seed=7)
    first = [{"role": "user", "content": "Explain why the sky is blue, step by step."}]
    result: dict = {"gpus": [torch.cuda.get_device_name(i) for i in range(count)], "checked_on": last}
    ids: dict = {}
    logits: dict = {}
    for device in (last, "cuda:0"):
        # Before each of the engine's calls the thread's current device is set back to cuda:0 (Engine.load leaves
        # it on the model's GPU): each call must make its own GPU current.
        torch.cuda.set_device(0)
        before = torch.cuda.memory_allocated(0)
        engine = Engine.load(args.model, device=device, context_length=4096)
        torch.cuda.set_device(0)
        engine.warm_up()
        with torch.inference_mode():
            prompt = torch.tensor(engine.chat.render(first).ids, device=engine.model.device)
            logits[device] = engine.model.prefill(prompt, 0).float().cpu()
        engine.reset_cache()
        torch.cuda.set_device(0)
        a = reply(engine, first, greedy)
        follow = [*first, {"role": "assistant", "content": a.text}, {"role": "user", "content": "Shorter, please."}]
        torch.cuda.set_device(0)
        b = reply(engine, follow, greedy)
        torch.cuda.set_device(0)
        s1 = reply(engine, first, sampled)
        torch.cuda.set_device(0)
        s2 = reply(engine, first, sampled)
        ids[device] = (a.token_ids, b.token_ids)
        result[device] = {
            "device": engine.info.device,
            "kernels": engine.info.kernels,
            "cuda_graphs": engine.info.cuda_graphs,
            "follow_up_reused": b.stats.prefix_reused_tokens,
            "seeded_sample_repeats": s1.token_ids == s2.token_ids,
            "decode_tok_s": round(a.stats.decode_tok_s, 1),
            "cuda0_bytes_added": torch.cuda.memory_allocated(0) - before,
        }
        engine.close()
    result["same_greedy_ids"] = ids[last] == ids["cuda:0"]
    diff = (logits[last] - logits["cuda:0"]).abs().max().item()
    result["prompt_logits_max_abs_diff"] = diff
    ok = (
        diff <= 0.02 * logits["cuda:0"].abs().max().item()
        and result[last]["seeded_sample_repeats"]
        and result[last]["device"] == last
        and result[last]["cuda0_bytes_added"] == 0
    )
    result["ok"] = ok
    print(json.dumps(result, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
