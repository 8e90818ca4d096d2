"""What does engine.generate's decode loop cost beyond the decode graph itself (a development tool, CUDA GPU)?

At each depth: microseconds per token of a real greedy reply (generate_ids, 256 tokens) against the same graph
replayed alone (200 times), with the loop's per-step token copy to pinned memory, with its event record, with the
host waiting three steps behind (as the engine's queue does), and right after a fresh prefill. --queued also
times replies with decode_loop.QUEUED_STEPS set to each value (is the host's pacing part of it?; not yet run on a
GPU). --clocks samples NVML's SM and memory clocks, power and throttle
reasons every millisecond during each measurement and prints their means next to it (is the reply's GPU slower
clocked than the graph alone?). Each reply also prints its per-token latency over its first 32 tokens against its
last 128, and --long N times a reply of N tokens too: the per-token cost of the extra tokens, free of anything a
reply pays once.
What it found: docs/BENCHMARKS.md, "A reply at depth against its graph".
usage: python -m benchmarks.decode_loop_overhead MODEL_DIR [--depths 512,16384] [--queued 4,16] [--rounds 2]
       [--clocks] [--long 768] [--ring-ab]
--ring-ab: replies with the committed tokens read from the commit kernel's host ring (the engine's default with
Triton) and with a copy after every step (forced_tokens.HOST_RING off), alternating, per depth.
"""

import argparse
import statistics
import threading

import torch

from model_loader import decode_loop as loop_module
from model_loader import forced_tokens
from model_loader.bench import bench_prompt
from model_loader.engine import Engine
from model_loader.events import Finished, SamplingSettings

REPLAYS = 200
RING = 8


class ClockSampler:
    """NVML readings every millisecond on a thread while `with sampler.span(label):` runs; report() gives each
    span's means. A no-op where NVML can't be read."""

    def __init__(self, engine: Engine, enabled: bool):
        self.read, self.spans = None, {}
        if not enabled:
            return
        try:
            import pynvml

            from model_loader.stats import nvml_handle

            pynvml.nvmlInit()
            handle = nvml_handle(pynvml, engine.info.gpu_uuid)
            if handle is None:
                return
            reasons = (
                getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
            )
            self.read = lambda: (
                pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
                pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                reasons(handle),
            )
        except Exception as err:
            print("no clocks:", err)

    def span(self, label: str):
        sampler = self

        class Span:
            def __enter__(self):
                self.stop, self.rows = threading.Event(), []
                if sampler.read is not None:
                    self.thread = threading.Thread(target=self.poll, daemon=True)
                    self.thread.start()

            def poll(self):
                while not self.stop.wait(0.001):
                    self.rows.append(sampler.read())

            def __exit__(self, *exc):
                self.stop.set()
                if sampler.read is not None:
                    self.thread.join()
                    sampler.spans[label] = self.rows

        return Span()

    def report(self, label: str) -> str:
        rows = self.spans.pop(label, None)
        if not rows:
            return ""
        reasons = 0
        for row in rows:
            reasons |= row[3]
        return (
            f" [sm {statistics.mean(r[0] for r in rows):.0f} MHz (min {min(r[0] for r in rows)}), mem"
            f" {statistics.mean(r[1] for r in rows):.0f} MHz, {statistics.mean(r[2] for r in rows):.0f} W,"
            f" throttle {reasons:#x}, {len(rows)} samples]"
        )


def reply_stats(engine: Engine, prompt: list[int], new_tokens: int = 256):
    engine.reset_cache()
    final = [
        ev
        for ev in engine.generate_ids(
            prompt, SamplingSettings(temperature=0, max_new_tokens=new_tokens, ignore_eos=True)
        )
        if isinstance(ev, Finished)
    ][0]
    return final.stats


def reply_us_per_token(engine: Engine, prompt: list[int], new_tokens: int = 256) -> float:
    return 1e6 / reply_stats(engine, prompt, new_tokens).decode_tok_s


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
            ring[i % RING : i % RING + 1].copy_(step.token, non_blocking=True)
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
    ap.add_argument("--clocks", action="store_true", help="NVML clocks, power and throttle reasons per measurement")
    ap.add_argument("--long", type=int, default=0, help="also a reply of this many tokens (marginal cost)")
    ap.add_argument("--ring-ab", action="store_true", help="only: replies with the host ring against a copy per step")
    args = ap.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    engine = Engine.load(args.model, device="cuda", context_length=max(depths) + 512)
    engine.warm_up()
    if args.ring_ab:
        for depth in depths:
            prompt = bench_prompt(engine, depth)
            for rnd in range(args.rounds):
                row = {}
                for ring in (True, False, True, False):
                    forced_tokens.HOST_RING = ring
                    row.setdefault("ring" if ring else "copy", []).append(reply_us_per_token(engine, prompt))
                print(
                    depth,
                    rnd,
                    " ".join(f"{k} {' '.join(f'{v:.1f}' for v in vs)} us/token" for k, vs in row.items()),
                    flush=True,
                )
        forced_tokens.HOST_RING = True
        return
    clocks = ClockSampler(engine, args.clocks)
    for depth in depths:
        prompt = bench_prompt(engine, depth)
        for rnd in range(args.rounds):
            with clocks.span("reply"):
                stats = reply_stats(engine, prompt)
            reply = 1e6 / stats.decode_tok_s
            gaps = stats.token_latencies_ms
            print(
                depth,
                rnd,
                f"reply {reply:.1f} us/token{clocks.report('reply')}; first 32 gaps"
                f" {statistics.mean(gaps[:32]) * 1000:.1f} us, last 128 {statistics.mean(gaps[-128:]) * 1000:.1f}",
                flush=True,
            )
            if args.long:
                with clocks.span("long"):
                    long_stats = reply_stats(engine, prompt, args.long)
                extra = (sum(long_stats.token_latencies_ms) - sum(gaps)) * 1000 / (args.long - len(gaps) - 1)
                print(
                    depth,
                    rnd,
                    f"reply of {args.long}: {1e6 / long_stats.decode_tok_s:.1f} us/token,"
                    f" the tokens past {len(gaps) + 1}: {extra:.1f} us each{clocks.report('long')}",
                    flush=True,
                )
            with clocks.span("replay"):
                alone = replay_us(engine, depth, False, False)
            print(depth, rnd, f"graph alone {alone:.1f} us{clocks.report('replay')}", flush=True)
            row = dict(
                replay=alone,
                copy=replay_us(engine, depth, True, False),
                copy_record=replay_us(engine, depth, True, True),
                copy_record_wait3=replay_us(engine, depth, True, True, 3),
            )
            reply_us_per_token(engine, prompt, new_tokens=2)  # a fresh prefill, then the graph alone
            row["replay_after_prefill"] = replay_us(engine, depth, False, False)
            print(
                depth, rnd, f"reply {reply:.1f} us/token;", " ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True
            )
    default = loop_module.QUEUED_STEPS
    for queued in [int(q) for q in args.queued.split(",") if q]:
        loop_module.QUEUED_STEPS = queued
        print(
            f"queued {queued}:",
            " ".join(f"{d} {reply_us_per_token(engine, bench_prompt(engine, d)):.1f}" for d in depths),
            flush=True,
        )
    loop_module.QUEUED_STEPS = default


if __name__ == "__main__":
    main()
