"""What engine.generate's decode loop costs beyond the decode graph itself (a development tool).

At each depth: microseconds per token of a real greedy reply (generate_ids, 256 tokens) against the same graph
replayed alone (200 times), with the loop's per-step token copy to pinned memory, with its event record, with the
host waiting three steps behind (as the engine's queue does), and right after a fresh prefill. --queued also
times replies with engine.QUEUED_STEPS set to each value (is the host's pacing part of it?; not run yet: the
session that wrote it had no device time left).
H200, 2026-12-05 (BENCHMARKS, eighteenth session): at 512 the copy is the whole difference (~9 us); at 16k the
reply is ~30 us a token slower than all of these.
usage: python benchmarks/decode_loop_overhead.py MODEL_DIR [--depths 512,16384] [--queued 4,16] [--rounds 2]
"""

import argparse

import torch

from model_loader import engine as engine_module
from model_loader.bench import bench_prompt
from model_loader.engine import Engine
from model_loader.events import Finished, SamplingSettings

REPLAYS = 200
RING = 8


def reply_us_per_token(engine: Engine, prompt: list[int], new_tokens: int = 256) -> float:
    engine.reset_cache()
    final = [ev for ev in engine.generate_ids(prompt, SamplingSettings(temperature=0, max_new_tokens=new_tokens,
                                                                       ignore_eos=True))
             if isinstance(ev, Finished)][0]
    return 1e6 / final.stats.decode_tok_s


def replay_us(engine: Engine, depth: int, copy: bool, record: bool, wait_behind: int = 0) -> float:
    """GPU microseconds per replay of the graph that serves `depth`, with the decode loop's extras as asked."""
    step = engine.step
    graph = step.graphs[("greedy", step.config_for(depth + 1))]
    ring = torch.empty(RING, dtype=torch.int64, pin_memory=True)
    events = [torch.cuda.Event() for _ in range(RING)]
    step.pos.fill_(depth)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for i in range(REPLAYS):
        graph.replay()
        if copy:
            ring[i % RING:i % RING + 1].copy_(step.token, non_blocking=True)
        if record:
            events[i % RING].record()
        if wait_behind and i >= wait_behind:
            events[(i - wait_behind) % RING].synchronize()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / REPLAYS


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--depths", default="512,16384")
    ap.add_argument("--queued", default="", help="QUEUED_STEPS values to time replies with, e.g. 4,16")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    engine = Engine.load(args.model, device="cuda", context_length=max(depths) + 512)
    engine.warm_up()
    for depth in depths:
        prompt = bench_prompt(engine, depth)
        for rnd in range(args.rounds):
            reply = reply_us_per_token(engine, prompt)
            row = dict(replay=replay_us(engine, depth, False, False), copy=replay_us(engine, depth, True, False),
                       copy_record=replay_us(engine, depth, True, True),
                       copy_record_wait3=replay_us(engine, depth, True, True, 3))
            reply_us_per_token(engine, prompt, new_tokens=2)  # a fresh prefill, then the graph alone
            row["replay_after_prefill"] = replay_us(engine, depth, False, False)
            print(depth, rnd, f"reply {reply:.1f} us/token;", " ".join(f"{k} {v:.1f}" for k, v in row.items()),
                  flush=True)
    default = engine_module.QUEUED_STEPS
    for queued in [int(q) for q in args.queued.split(",") if q]:
        engine_module.QUEUED_STEPS = queued
        print(f"queued {queued}:", " ".join(f"{d} {reply_us_per_token(engine, bench_prompt(engine, d)):.1f}"
                                            for d in depths), flush=True)
    engine_module.QUEUED_STEPS = default


if __name__ == "__main__":
    main()
