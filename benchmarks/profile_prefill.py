"""Where do TTFT and time-to-ready go on a CUDA GPU (a development tool, not part of the app)?

The load (its parts) and the warm-up, then the eager prefill (model.prefill, not the captured prefill graphs) of 1
to 2,048 tokens, wall time and the host's time to issue it, and torch.profiler's tables for a 512-token prefill.

    python -m benchmarks.profile_prefill MODEL_DIR
"""

import argparse
import time

import torch

from model_loader.engine import Engine


def main(model: str) -> None:
    t0 = time.perf_counter()
    engine = Engine.load(model, device="cuda", context_length=4096)
    t1 = time.perf_counter()
    engine.warm_up()
    t2 = time.perf_counter()
    print(f"load {t1 - t0:.2f}s {engine.info.load_breakdown}  warm-up {t2 - t1:.2f}s")
    ids = torch.arange(512, device="cuda") + 1000
    for _ in range(3):
        engine.model.prefill(ids, 0)
    torch.cuda.synchronize()
    for n in (1, 16, 128, 512, 2048):
        x = torch.arange(n, device="cuda") + 1000
        engine.model.prefill(x, 0)
        torch.cuda.synchronize()
        t = time.perf_counter()
        reps = 10
        for _ in range(reps):
            engine.model.prefill(x, 0)
        t_cpu = time.perf_counter() - t
        torch.cuda.synchronize()
        t_all = time.perf_counter() - t
        print(f"prefill {n:5d} tokens: {t_all / reps * 1000:.2f} ms wall (host issue {t_cpu / reps * 1000:.2f} ms)")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.model.prefill(ids, 0)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=15))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    main(ap.parse_args().model)
