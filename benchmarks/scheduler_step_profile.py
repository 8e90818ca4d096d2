"""Where does a scheduler decode step's time go on a CUDA GPU, against the single-reply engine's step (a development
tool, not part of the app)?

At one depth, for the engine's greedy decode graph and for the scheduler's decode graph of each batch size given:
- GPU microseconds per replay, replays back to back (no host work between them);
- the same with what the scheduler adds to each step on the device: the inputs' copies and the greedy argmax
  (PagedForward.step and Scheduler._device_samples as the scheduler calls them, no host sync);
- torch.profiler's per-kernel totals of one replay, the engine's and batch 1's side by side, so the kernels that
  make up a difference are named;
- a fresh 512-token prompt's prefill graph, the engine's and the scheduler's (what time to first token is made of).

    python -m benchmarks.scheduler_step_profile MODEL_DIR [--depth 512] [--batch 1,8,32] [--json OUT]
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks.profile_decode import kernel_totals
from model_loader.engine import Engine
from model_loader.paged_model import SeqSlice
from model_loader.scheduler import Scheduler, SchedulerConfig

REPLAYS = 300


def gpu_us(run, calls: int = REPLAYS) -> float:
    """GPU microseconds per call of run(), calls back to back after one untimed call."""
    run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--depth", type=int, default=512)
    ap.add_argument("--batch", default="1,8,32")
    ap.add_argument("--json")
    args = ap.parse_args()
    batches = [int(b) for b in args.batch.split(",")]
    engine = Engine.load(args.model, device="cuda", context_length=args.depth + 1024)
    engine.warm_up()
    step = engine.step
    config = step.config_for(args.depth + 1)
    engine_graph = step.graphs[("greedy", config)]
    report = {"model": args.model, "device": torch.cuda.get_device_name(), "depth": args.depth, "batches": []}
    report["engine_us"] = round(step.time_replays(engine_graph, args.depth, REPLAYS), 1)
    step.pos.fill_(args.depth)
    engine_kernels = kernel_totals(engine_graph.replay, 20)
    print(f"engine: {report['engine_us']:.1f} us a replay (attention {config})")

    bs = 64
    per_seq = -(-(args.depth + 2) // bs)
    sched = Scheduler(
        engine.model,
        engine.chat,
        num_blocks=max(batches) * per_seq + 1,
        config=SchedulerConfig(max_seqs=max(batches), chunk=512, block_size=bs),
    )
    forward = sched.forward
    for b in batches:
        seqs = [
            SeqSlice(i, 1, args.depth + 1, list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)), True) for i in range(b)
        ]
        positions = [args.depth] * b
        tokens = torch.full((b,), 100, dtype=torch.int64, device="cuda")
        bucket = forward._bucket(b)
        graph, _ = forward.graphs[bucket]
        forward.step(tokens, positions, seqs)  # the static inputs for this batch
        replay_us = gpu_us(graph.replay)

        def scheduler_step():
            logits = forward.step(tokens, positions, seqs)
            tokens.copy_(torch.argmax(logits, dim=-1))

        with torch.inference_mode():
            step_us = gpu_us(scheduler_step)
            kernels = kernel_totals(scheduler_step, 20)
        row = {
            "sequences": b,
            "bucket": bucket,
            "replay_us": round(replay_us, 1),
            "step_us": round(step_us, 1),
            "tok_s_gpu": round(b * 1e6 / step_us, 1),
            "kernels": kernels,
        }
        report["batches"].append(row)
        print(f"batch {b} (bucket {bucket}): replay {replay_us:.1f} us, with inputs and argmax {step_us:.1f} us")
    prompt = list(range(1000, 1512))
    engine_prefill = engine.prefill_graphs.graphs[(True, 512)]
    engine.prefill_graphs.run(prompt, 0)
    report["prefill_512_engine_us"] = round(gpu_us(engine_prefill.replay, 50), 1)
    forward._replay_prefill(512, prompt, SeqSlice(0, 512, 512, list(range(1, 9)), True))
    report["prefill_512_scheduler_us"] = round(gpu_us(forward.prefill_graphs[512][0].replay, 50), 1)
    print(
        f"a fresh 512-token prompt's prefill graph: engine {report['prefill_512_engine_us']:.1f} us, "
        f"scheduler {report['prefill_512_scheduler_us']:.1f} us"
    )
    one = next((r for r in report["batches"] if r["sequences"] == 1), None)
    if one is not None:
        print("\nkernel                                                                  engine us   batch-1 us")
        names = list(dict.fromkeys(list(engine_kernels) + list(one["kernels"])))
        rows = [
            (name, engine_kernels.get(name, {}).get("us", 0.0), one["kernels"].get(name, {}).get("us", 0.0))
            for name in names
        ]
        for name, e, p in sorted(rows, key=lambda r: -abs(r[2] - r[1])):
            print(f"{name[:70]:<72}{e:9.1f}  {p:9.1f}")
        print(f"{'sum':<72}{sum(r[1] for r in rows):9.1f}  {sum(r[2] for r in rows):9.1f}")
    report["engine_kernels"] = engine_kernels
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
