"""Where does the time of one decode step go on a CUDA GPU, by context depth (a development tool, not part of the app)?

For each depth: the pure GPU time of the captured decode graph the engine would replay there (replays back to
back, no host sync per token), and torch.profiler's per-kernel totals over a few replays of that graph (CUPTI
reports the kernels inside a graph), so two depths or two models can be compared kernel by kernel.
usage: python -m benchmarks.profile_decode MODEL_DIR [--int4-kernel torch|triton|dequantize]
           [--depths 512,4096,16384] [--context N] [--mode greedy|sample] [--kv-cache 16-bit|8-bit] [--json OUT]
"""

import argparse
import json
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from model_loader.engine import Engine

STEPS_TIMED = 200
STEPS_PROFILED = 20


def graph_for(step, mode: str, depth: int):
    config = step.config_for(depth + 1)
    return step.graphs[(mode, config)], config


def time_graph(step, graph, depth: int) -> float:
    """GPU microseconds per replay, starting at `depth` (the graph advances the position itself)."""
    return step.time_replays(graph, depth, STEPS_TIMED)


def kernel_table(step, run, depth: int) -> dict:
    """{kernel name: GPU microseconds per step} over STEPS_PROFILED calls of run()."""
    step.pos.fill_(depth)
    return kernel_totals(run, STEPS_PROFILED)


def kernel_totals(run, calls: int) -> dict:
    """{kernel name: {"us": GPU microseconds per call, "launches": per call}} over `calls` calls of run()."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    per_kernel = defaultdict(float)
    counts = defaultdict(int)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time_total > 0:
            name = event.name if len(event.name) < 90 else event.name[:87] + "..."
            per_kernel[name] += event.device_time_total / calls
            counts[name] += 1
    return {
        name: {"us": round(us, 2), "launches": counts[name] // calls}
        for name, us in sorted(per_kernel.items(), key=lambda item: -item[1])
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--int4-kernel")
    ap.add_argument("--depths", default="512,4096,16384")
    ap.add_argument("--context", type=int)
    ap.add_argument("--json")
    ap.add_argument(
        "--gemv-early",
        type=int,
        help="weight chunks our GEMV requests before its input is ready "
        "(gemv.GEMV_EARLY_CHUNKS; 0: none, as before 2026-12-04)",
    )
    ap.add_argument(
        "--mode",
        choices=("greedy", "sample"),
        default="greedy",
        help="sample: the window's defaults (temperature 0.6, top-p 0.95)",
    )
    ap.add_argument("--kv-cache", default="16-bit", choices=("16-bit", "8-bit"))
    args = ap.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    context = args.context or max(depths) + 512
    if context < max(depths) + STEPS_TIMED + 20:  # the graph writes K/V at every position it replays over
        ap.error(f"--context must be at least the deepest depth + {STEPS_TIMED + 20}")
    if args.gemv_early is not None:
        from model_loader.kernels import gemv

        gemv.GEMV_EARLY_CHUNKS = args.gemv_early
    engine = Engine.load(
        args.model, device="cuda", context_length=context, int4_kernel=args.int4_kernel, kv_cache=args.kv_cache
    )
    engine.warm_up()
    step = engine.step
    if args.mode == "sample":
        engine.params.set(0.6, 0.95, 0, engine.model.cfg.vocab_size)
        if not step.captured("sample"):
            step.capture("sample")
    report = {
        "model": args.model,
        "device": torch.cuda.get_device_name(),
        "context": context,
        "plan": [(upper, str(config)) for upper, config in step.plan],
        "depths": [],
    }
    for depth in depths:
        graph, config = graph_for(step, args.mode, depth)
        us = time_graph(step, graph, depth)
        kernels, source = kernel_table(step, graph.replay, depth), "graph"
        if not kernels:  # a CUPTI that doesn't report the kernels inside graphs: the same step run eagerly
            with torch.inference_mode():
                kernels, source = kernel_table(step, lambda: step._step(args.mode, depth, config), depth), "eager"
        report["depths"].append(
            {
                "depth": depth,
                "attention_config": str(config),
                "step_us": round(us, 1),
                "tok_s": round(1e6 / us, 1),
                "kernels_from": source,
                "kernels_sum_us": round(sum(k["us"] for k in kernels.values()), 1),
                "kernels": kernels,
            }
        )
        print(f"depth {depth:>6}: {us:7.1f} us/step -> {1e6 / us:6.1f} tok/s (GPU only; attention {config})")
        for name, k in list(kernels.items())[:12]:
            print(f"    {k['us']:8.1f} us  x{k['launches']:<4} {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
