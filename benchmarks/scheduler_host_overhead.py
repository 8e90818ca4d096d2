"""How much host work does a scheduler step cost beside the forward pass (a development tool, any machine)?

A step's host work (sampling set-up, detokenizing, the reply's text, events, block bookkeeping) is time the GPU
idles where the scheduler waits for a step's tokens before it builds the next (prefill steps, logits pipelines,
SchedulerConfig.overlap off); where it overlaps decode steps, the GPU idles only while that work outlasts a step's
device time. This runs a model's
scheduler with the forward pass replaced by a stub that returns fixed logits (the word " the" everywhere: a whole
character each token, as real text mostly is), B sequences
decoding N tokens each, and prints microseconds of host work per step: with the scheduler's sampler (on a CPU its
greedy argmax over the vocabulary and the stub's copies count too; on a GPU they are device work), then with the
sampler stubbed as well (the bookkeeping alone), then cProfile's top functions of a third run (the profiler's own
cost inflates small Python calls several times: read it for where, not how much).

    python -m benchmarks.scheduler_host_overhead --model DIR [--batch 1,8] [--tokens 400] [--device cpu]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

from model_loader.engine import Engine
from model_loader.events import SamplingSettings
from model_loader.scheduler import Scheduler, SchedulerConfig


def stubbed(scheduler: Scheduler, vocab: int, device, token: int) -> list:
    """Replace the scheduler's forward pass by fixed logits that pick `token`; returns the list each step's size is
    appended to."""
    steps: list[int] = []
    fixed = torch.zeros(1, vocab, device=device)
    fixed[0, token] = 1.0

    def step(tokens, positions, seqs):
        steps.append(len(seqs))
        return fixed.expand(sum(1 for s in seqs if s.logits), vocab).clone()

    scheduler.forward.step = step
    return steps


def run(scheduler: Scheduler, batch: int, tokens: int) -> None:
    settings = SamplingSettings(temperature=0, max_new_tokens=tokens, ignore_eos=True)
    for i in range(batch):
        scheduler.submit(list(range(10 + i, 60 + i)), settings, sink=lambda event: None)
    scheduler.run_until_idle()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--top", type=int, default=12, help="profile rows to print")
    args = parser.parse_args()
    engine = Engine.load(args.model, device=args.device, context_length=2048)
    batches = [int(b) for b in args.batch.split(",")]
    config = SchedulerConfig(max_seqs=max(batches), chunk=512, block_size=64)
    blocks = max(batches) * (-(-(60 + args.tokens) // 64)) + 1
    scheduler = Scheduler(engine.model, engine.chat, blocks, config)
    word = engine.tokenizer.encode(" the")[0]
    steps = stubbed(scheduler, engine.model.cfg.vocab_size, engine.model.device, word)
    for batch in batches:
        run(scheduler, batch, 8)  # the first replies' one-time costs out of the way
        first, t = len(steps), time.perf_counter()
        run(scheduler, batch, args.tokens)
        n = len(steps) - first
        print(f"batch {batch}: {n} steps, {(time.perf_counter() - t) / n * 1e6:.0f} us of host work a step")
        scheduler._sample = lambda seqs, logits: [(seq, word) for seq in seqs]
        scheduler._device_samples = lambda seqs, logits: torch.full((len(seqs),), word, device=logits.device)
        first, t = len(steps), time.perf_counter()
        run(scheduler, batch, args.tokens)
        del scheduler._sample, scheduler._device_samples  # the class's own again
        n = len(steps) - first
        print(f"batch {batch}: {(time.perf_counter() - t) / n * 1e6:.0f} us a step with the sampler stubbed too")
        profile = cProfile.Profile()  # a second run, profiled (the profiler's own cost inflates its times)
        profile.enable()
        run(scheduler, batch, args.tokens)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
