"""Where the time of one decode step goes on a CUDA GPU (a development tool, not part of the app).

Prints the pure GPU time of the captured decode graph (replays back to back, no host sync per token), the
same step run eagerly, and torch.profiler's per-kernel totals for one eager step.
usage: python benchmarks/profile_decode.py MODEL_DIR [torch|triton|dequantize]  (the 4-bit kernel, for AWQ models)
"""

import sys

import torch

from model_loader.engine import Engine


def main(model: str, int4_kernel: str | None = None) -> None:
    engine = Engine.load(model, device="cuda", context_length=4096, int4_kernel=int4_kernel)
    engine.warm_up()
    step = engine.step
    with torch.inference_mode():
        engine.model.prefill(torch.arange(512, device="cuda") + 1000, 0)
    for mode in ("greedy", "sample"):
        step.pos.fill_(512)
        step.token.fill_(1)
        graph = step.graphs[(mode, step.config_for(513))]
        for _ in range(10):
            graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        n = 200
        step.pos.fill_(512)
        start.record()
        for _ in range(n):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / n
        print(f"graph[{mode}]: {ms * 1000:.1f} us/step -> {1000 / ms:.0f} tok/s (GPU only)")
    # eager, for the launch-overhead comparison and the kernel table
    step.pos.fill_(512)
    with torch.inference_mode():
        for _ in range(3):
            step._step("greedy", 512)
        torch.cuda.synchronize()
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step._step("greedy", 512)
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
