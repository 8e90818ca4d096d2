"""Where does the time to ready go on a machine that never ran r1desk (issue 12, point 4)?

Loads a model and warms it up with an empty Triton cache (a fresh folder, unless --cache names one), and
reports the load's parts, each warm-up step's wall time, and every Triton kernel compile and C launcher build
with its duration (the compile and the launcher constructor are wrapped for timing only; nothing else changes).
Run it twice with the same --cache to see a cached start.

    python -m benchmarks.first_start_profile --model M [--cache DIR] [--context 4096] [--json F] [--sample-walk]

--sample-walk samples the compile walk's stack every 5 ms and prints where its first step (the slowest, whichever
part of the walk comes first) spends its time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path


def sample_walk(samples: list) -> None:
    """Every 5 ms, the compile walk thread's stack (innermost last) while it runs."""
    walk = None
    while walk is None:
        walk = next((t for t in threading.enumerate() if t.name == "r1desk-twin-walk"), None)
        time.sleep(0.002)
    while walk.is_alive():
        frame = sys._current_frames().get(walk.ident)
        stack = []
        while frame is not None:
            code = frame.f_code
            stack.append(f"{Path(code.co_filename).parent.name}/{Path(code.co_filename).name}:{code.co_name}")
            frame = frame.f_back
        samples.append((time.perf_counter(), tuple(reversed(stack))))
        time.sleep(0.005)


def print_samples(stacks: list, what: str) -> None:
    """Where the sampled stacks spent their time: inclusive (a frame anywhere on the stack) and innermost."""
    from collections import Counter

    inclusive, innermost = Counter(), Counter()
    for stack in stacks:
        inclusive.update(set(stack))
        if stack:
            innermost[stack[-1]] += 1
    print(f"{what}: {len(stacks)} samples (5 ms apart); inclusive:")
    for frame, n in inclusive.most_common(25):
        print(f"  {n:5d}  {frame}")
    print("  innermost:")
    for frame, n in innermost.most_common(12):
        print(f"  {n:5d}  {frame}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--cache", help="Triton cache folder (default: a new empty one)")
    ap.add_argument("--context", default="4096")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--switch-interval", type=float, help="sys.setswitchinterval before loading (seconds)")
    ap.add_argument(
        "--compile-switch-interval",
        type=float,
        help="the GIL switch interval the compile pool sets while it compiles (default: "
        "precompile.COMPILE_SWITCH_INTERVAL_S, 0.005; e.g. 0.0005 to compare)",
    )
    ap.add_argument(
        "--sample-walk",
        action="store_true",
        help="sample the compile walk's stack every 5 ms and print where its first step spends time",
    )
    args = ap.parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    if args.compile_switch_interval:
        from model_loader.kernels import precompile

        precompile.COMPILE_SWITCH_INTERVAL_S = args.compile_switch_interval
    cache = args.cache or tempfile.mkdtemp(prefix="triton-cache-")
    os.environ["TRITON_CACHE_DIR"] = cache
    # The marker that says a warm-up completed on this machine (model_loader.kernel_cache) lives in the user's
    # cache folder: with an empty Triton cache it must be missing too, or the engine skips compiling beside the
    # load and compiles everything on its own thread during the warm-up (what a first start never does, and
    # several times slower).
    if not os.listdir(cache):
        os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="r1desk-cache-")
    t_start = time.perf_counter()

    import triton
    import triton.compiler
    import triton.compiler.compiler
    from triton.runtime import driver

    compiles: list[dict] = []
    launchers: list[dict] = []
    lock = threading.Lock()
    original_compile = triton.compiler.compiler.compile

    def timed_compile(src, *a, **kw):
        t = time.perf_counter()
        try:
            return original_compile(src, *a, **kw)
        finally:
            name = getattr(getattr(src, "fn", None), "__name__", type(src).__name__)
            with lock:
                compiles.append(
                    {
                        "kernel": name,
                        "s": time.perf_counter() - t,
                        "at_s": t - t_start,
                        "thread": threading.current_thread().name,
                        "constexprs": str(getattr(src, "constants", ""))[:160],
                    }
                )

    triton.compiler.compiler.compile = timed_compile
    triton.compiler.compile = timed_compile
    try:
        active = driver.active
    except RuntimeError:  # no GPU driver (a CPU run of this script): nothing launches
        active = None
    original_launcher = getattr(active, "launcher_cls", None)

    def timed_launcher(src, metadata):
        t = time.perf_counter()
        try:
            return original_launcher(src, metadata)
        finally:
            with lock:
                launchers.append(
                    {
                        "kernel": getattr(getattr(src, "fn", None), "__name__", "?"),
                        "s": time.perf_counter() - t,
                        "at_s": t - t_start,
                        "thread": threading.current_thread().name,
                    }
                )

    if active is not None:
        active.launcher_cls = timed_launcher

    import logging

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")  # the warm-up logs its timings
    from model_loader.engine import Engine

    steps: list[tuple[float, str]] = []
    samples: list[tuple[float, tuple]] = []
    if args.sample_walk:
        threading.Thread(target=sample_walk, args=(samples,), name="walk-sampler", daemon=True).start()
    t0 = time.perf_counter()
    engine = Engine.load(args.model, context_length=args.context)
    t_loaded = time.perf_counter()
    ahead = engine.compiles_beside_load  # the walk beside the load (a first start), for its timeline
    timeline = [{"ended": label, "at_s": round(at - t_start, 3)} for label, at in (ahead.timeline if ahead else [])]
    first = engine.first_start
    engine.warm_up(progress=lambda done, total, what: steps.append((time.perf_counter(), what)))
    t_ready = time.perf_counter()
    step_times = [{"step": a[1], "s": round(b[0] - a[0], 3)} for a, b in zip(steps, steps[1:])]
    result = {
        "model": engine.info.model_name,
        "quantization": engine.info.quantization,
        "cache": cache,
        "switch_interval_s": sys.getswitchinterval(),
        "compile_threads": os.environ.get("R1DESK_COMPILE_THREADS"),
        "first_start_marker_missing": first,
        "imports_s": round(t0 - t_start, 3),
        "load_s": round(t_loaded - t0, 3),
        "load_breakdown": {k: round(v, 3) for k, v in engine.info.load_breakdown.items()},
        "warm_up_s": round(t_ready - t_loaded, 3),
        "ready_s": round(t_ready - t0, 3),
        "warm_up_steps": step_times,
        "compiles": len(compiles),
        "compile_s_total": round(sum(c["s"] for c in compiles), 3),
        "launchers": len(launchers),
        "launcher_s_total": round(sum(c["s"] for c in launchers), 3),
        "gemv_choice": engine.info.gemv,
        "decode_attention": engine.info.decode_attention,
        "compile_workers": engine.info.compile_workers,
        "walk_timeline": timeline,
        "load_started_at_s": round(t0 - t_start, 3),
        "loaded_at_s": round(t_loaded - t_start, 3),
        "ready_at_s": round(t_ready - t_start, 3),
        "compile_list": sorted(compiles, key=lambda c: -c["s"]),
        "launcher_list": launchers,
    }
    print(
        f"{result['model']} ({result['quantization'] or 'dense'}): ready in {result['ready_s']} s = load "
        f"{result['load_s']} s {result['load_breakdown']} + warm-up {result['warm_up_s']} s "
        f"(imports before: {result['imports_s']} s)"
    )
    for s in step_times:
        print(f"  {s['s']:7.3f} s  {s['step']}")
    if timeline:  # times since this script started (as the compiles' "at" below)
        print(
            f"the walk beside the load (load began at {result['load_started_at_s']} s, ended at "
            f"{result['loaded_at_s']} s; ready at {result['ready_at_s']} s):"
        )
        for row in timeline:
            print(f"  at {row['at_s']:6.2f}  {row['ended']}")
    labels = [label for label, _ in ahead.timeline] if ahead is not None else []
    if samples and "twin built" in labels:
        first = labels.index("twin built") + 1  # the walk's first step
        if first < len(labels):
            begin, end = ahead.timeline[first - 1][1], ahead.timeline[first][1]
            print_samples(
                [stack for t, stack in samples if begin <= t <= end],
                f"the walk's first step ({labels[first]}, {end - begin:.2f} s)",
            )
    if result["compile_workers"]:
        print(f"in worker processes: {result['compile_workers']}")
    print(
        f"Triton compiles: {result['compiles']}, {result['compile_s_total']} s; C launchers: "
        f"{result['launchers']}, {result['launcher_s_total']} s"
    )
    on_pool = [c for c in compiles if c["thread"].startswith("r1desk-compile")]
    print(
        f"  compiled ahead on the pool: {len(on_pool)} ({sum(c['s'] for c in on_pool):.3f} s of compile time); "
        f"elsewhere: {len(compiles) - len(on_pool)} "
        f"({', '.join(sorted({c['kernel'] + '@' + c['thread'] for c in compiles if c not in on_pool}))})"
    )
    for c in result["compile_list"][:40]:
        print(f"  {c['s']:6.3f} s  at {c['at_s']:6.2f}  {c['kernel']}  [{c['thread']}] {c['constexprs']}")
    by_start = sorted(launchers, key=lambda c: c["at_s"])
    if by_start:
        off_pool = [c for c in by_start if not c["thread"].startswith("r1desk-compile")]
        print(
            f"C launchers built from {by_start[0]['at_s']:.2f} to {max(c['at_s'] + c['s'] for c in by_start):.2f} s;"
            f" off the pool: {len(off_pool)} ({sum(c['s'] for c in off_pool):.3f} s: "
            f"{', '.join(sorted({c['kernel'] + '@' + c['thread'] for c in off_pool}))})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    engine.close()


if __name__ == "__main__":
    main()
