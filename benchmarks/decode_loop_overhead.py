"""What engine.generate's decode loop costs beyond the decode graph itself (a development tool).

At 512 and 16,384 tokens of context: microseconds per token of a real greedy reply (generate_ids, 256 tokens)
against the same graph replayed 200 times alone, with the loop's per-step token copy to pinned memory, with its
event record, with the host waiting three steps behind (as the engine's queue does), and right after a fresh
prefill. H200, 2026-12-05 (BENCHMARKS, eighteenth session): at 512 the copy is the whole difference (~9 us); at
16k the reply is ~30 us a token slower than all of these.
usage: python benchmarks/decode_loop_overhead.py MODEL_DIR"""
import sys
import torch
from model_loader.bench import bench_prompt
from model_loader.engine import Engine
from model_loader.events import Finished, SamplingSettings

e = Engine.load(sys.argv[1], device="cuda", context_length=33040)
e.warm_up()
N = 200
ring = torch.empty(8, dtype=torch.int64, pin_memory=True)
events = [torch.cuda.Event() for _ in range(8)]
for depth in (512, 16384):
    prompt = bench_prompt(e, depth)
    cfg = e.step.config_for(depth + 1)
    g = e.step.graphs[("greedy", cfg)]
    def loop(copy, record, sync_every=0):
        e.step.pos.fill_(depth); g.replay()
        s, t = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(); s.record()
        for i in range(N):
            g.replay()
            if copy:
                ring[i % 8:i % 8 + 1].copy_(e.step.token, non_blocking=True)
            if record:
                events[i % 8].record()
            if sync_every and i >= sync_every:
                events[(i - sync_every) % 8].synchronize()
        t.record(); t.synchronize()
        return s.elapsed_time(t) * 1000 / N
    for rnd in range(2):
        e.reset_cache()
        fin = [ev for ev in e.generate_ids(prompt, SamplingSettings(temperature=0, max_new_tokens=256, ignore_eos=True))
               if isinstance(ev, Finished)][0]
        gen = 1e6 / fin.stats.decode_tok_s
        r = dict(replay=loop(False, False), copy=loop(True, False), copy_record=loop(True, True),
                 copy_record_sync3=loop(True, True, 3))
        e.reset_cache()
        list(e.generate_ids(prompt, SamplingSettings(temperature=0, max_new_tokens=2, ignore_eos=True)))
        r["replay_after_prefill"] = loop(False, False)
        print(depth, rnd, f"generate {gen:.1f} us/token;", " ".join(f"{k} {v:.1f}" for k, v in r.items()), flush=True)
