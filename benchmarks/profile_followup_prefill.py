"""Where does the time of a follow-up prefill go on a CUDA GPU (a development tool, not part of the app)?

For each (cached prefix, new tokens): the GPU time of the captured prefill graph the engine would replay
(replays back to back), and torch.profiler's per-kernel totals over a few replays, with the GEMMs' share and
their TFLOP/s (2 x weights x rows), so the 2,048-token follow-up's 10 ms bar can be weighed kernel by kernel;
and the GPU's idle time between kernels, by the pair of kernels around it.
usage: python -m benchmarks.profile_followup_prefill MODEL_DIR [--cases 512+2048,512+1024,4096+2048] [--json OUT]
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.profile_decode import kernel_totals
from model_loader.engine import Engine

REPLAYS_TIMED = 30
REPLAYS_PROFILED = 5
GEMM_MARKERS = ("gemm", "sm90_xmma", "cutlass", "nvjet", "ampere_", "sm80_xmma")


def replay_ms(graph, replays: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays


def short_name(name: str) -> str:
    if any(m in name.lower() for m in GEMM_MARKERS):
        return "GEMM"
    return name.split("(")[0].split("<")[0].strip()[:40]


def kernel_gaps(run, calls: int) -> tuple[float, dict]:
    """Idle GPU time between consecutive kernels of run() (one CUDA graph replay), per call: the total and by
    (kernel before, kernel after), named by short_name. What the graph's time is beyond its kernels' sum."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    spans = sorted(
        (e.time_range.start, e.time_range.end, short_name(e.name))
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0
    )
    by_pair: dict = defaultdict(float)
    total = 0.0
    for (_, end, before), (start, _, after) in zip(spans, spans[1:]):
        gap = start - end
        if 0 <= gap < 50:  # between replays the host launches the next one: not the graph's own gaps
            by_pair[(before, after)] += gap / calls
            total += gap / calls
    return total, dict(sorted(by_pair.items(), key=lambda kv: -kv[1]))


def linear_params(model) -> int:
    """Weights a prefill row multiplies through (the decoder layers' linears; the LM head sees one row)."""
    cfg = model.cfg
    h, i = cfg.hidden_size, cfg.intermediate_size
    return cfg.num_hidden_layers * ((cfg.q_size + 2 * cfg.kv_size) * h + h * cfg.q_size + 3 * i * h)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--cases", default="512+2048,512+1024,4096+2048")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--json")
    args = ap.parse_args()
    engine = Engine.load(args.model, context_length=args.context)
    engine.warm_up()
    graphs = engine.prefill_graphs
    results = []
    for case in args.cases.split(","):
        prefix, new = (int(x) for x in case.split("+"))
        bucket = graphs.bucket_for(new, prefix)
        graph = graphs.graphs[(False, bucket)]
        graphs.tokens[:new].random_(0, engine.model.cfg.vocab_size)
        graphs.last.fill_(new - 1)
        graphs.start.fill_(prefix)
        ms = replay_ms(graph, REPLAYS_TIMED)
        kernels = kernel_totals(graph.replay, REPLAYS_PROFILED)
        gemm_us = sum(k["us"] for name, k in kernels.items() if any(m in name.lower() for m in GEMM_MARKERS))
        flop = 2 * linear_params(engine.model) * bucket
        row = {
            "prefix": prefix,
            "new": new,
            "bucket": bucket,
            "graph_ms": round(ms, 3),
            "gemm_ms": round(gemm_us / 1000, 3),
            "gemm_tflops": round(flop / (gemm_us * 1e-6) / 1e12, 1),
            "all_tflops": round(flop / (ms * 1e-3) / 1e12, 1),
            "kernels": kernels,
        }
        results.append(row)
        print(
            f"{prefix} + {new} (bucket {bucket}): {ms:.3f} ms per replay; GEMMs {row['gemm_ms']} ms "
            f"({row['gemm_tflops']} TFLOP/s), whole graph {row['all_tflops']} TFLOP/s of linear work"
        )
        for name, k in list(kernels.items())[:14]:
            print(f"  {k['us']:9.1f} us  x{k['launches']:<4} {name}")
        idle, pairs = kernel_gaps(graph.replay, REPLAYS_PROFILED)
        row["idle_us"] = round(idle, 1)
        row["idle_by_pair"] = {f"{a} -> {b}": round(us, 1) for (a, b), us in pairs.items()}
        print(f"  idle between kernels: {idle:.1f} us per replay; by boundary:")
        for (before, after), us in list(pairs.items())[:10]:
            print(f"  {us:9.1f} us  {before} -> {after}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    engine.close()


if __name__ == "__main__":
    main()
