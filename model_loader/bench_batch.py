"""r1desk-cli bench --batch 1,4,8,...: aggregate decode speed with that many sequences decoding together.

Like llama.cpp's llama-batched-bench: B sequences, each a different prompt of `prompt_tokens` tokens, each
decoding `new_tokens` tokens greedily, through the scheduler (continuous batching). The decode rate counts only the
steps where all B sequences decode and none prefills (the steady state); the prompts' prefill is timed apart (the
time until the last sequence's first token). Every run starts with an empty prefix cache. Also reports, for each
sequence, how many leading tokens match the same prompt decoded alone: identical on the CPU, equal to rounding on
a GPU (paged_model).
"""

from __future__ import annotations

import time

import torch

from model_loader.bench import FILLER, bench_prompt
from model_loader.common_prefix import common_prefix
from model_loader.events import Finished, SamplingSettings
from model_loader.scheduler import Scheduler, SchedulerConfig
from model_loader.stats import percentile


def batch_prompts(engine, count: int, n_tokens: int) -> list[list[int]]:
    """`count` prompts of exactly n_tokens ids, each different from its first filler token on (no prefix is
    shared: every prefill is real work)."""
    base = bench_prompt(engine, n_tokens)
    head = len(engine.chat.render([{"role": "user", "content": ""}]).ids) - 2  # where the user's text starts
    words = engine.chat.encode_plain(FILLER)
    prompts = []
    for i in range(count):
        ids = list(base)
        ids[min(head, n_tokens - 3)] = words[i % len(words)] + i // len(words)  # a distinct token id each
        prompts.append(ids)
    return prompts


def run_batch(engine, sizes: list[int], prompt_tokens: int = 512, new_tokens: int = 256, block_size: int = 64) -> dict:
    largest = max(sizes)
    per_seq = -(-(prompt_tokens + new_tokens + 1) // block_size)
    config = SchedulerConfig(
        max_seqs=largest, chunk=max(block_size, 512 // block_size * block_size), block_size=block_size
    )
    scheduler = Scheduler(engine.model, engine.chat, num_blocks=largest * per_seq + 1, config=config)
    prompts = batch_prompts(engine, largest, prompt_tokens)
    rows = []
    for size in [sizes[0]] + sizes:  # the first size once more, untimed: the warm-up
        rows.append(_one_batch(scheduler, prompts[:size], new_tokens))
    alone = [_one_batch(scheduler, [p], new_tokens)["ids"][0] for p in prompts]
    for row in rows:
        row["matches_alone"] = [common_prefix(a, b, new_tokens) for a, b in zip(alone, row.pop("ids"))]
    return {
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "block_size": block_size,
        "kv_blocks": scheduler.pool.num_blocks,
        "kv_cache_bytes": scheduler.cache.nbytes,
        "batches": rows[1:],
        **({"int4pack_rows_us": scheduler.int4pack_rows} if scheduler.int4pack_rows else {}),
    }


def _one_batch(scheduler: Scheduler, prompts: list[list[int]], new_tokens: int) -> dict:
    scheduler.pool.forget_cached()  # every prompt is prefilled in full, as in the run it is compared with
    finals: dict[int, Finished] = {}
    settings = SamplingSettings(temperature=0, max_new_tokens=new_tokens, ignore_eos=True)
    size = len(prompts)
    for i, ids in enumerate(prompts):
        scheduler.submit(
            ids, settings, sink=lambda ev, i=i: finals.__setitem__(i, ev) if isinstance(ev, Finished) else None
        )
    sync = torch.cuda.synchronize if scheduler.model.device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    decode_s, decode_tokens, steps = 0.0, 0, 0
    first_tokens_at = None
    while scheduler.has_work():
        steady = (
            len(scheduler.running) == size
            and not scheduler.waiting
            and all(seq.pending == 1 for seq in scheduler.running)
        )
        t = time.perf_counter()
        # ends with one step's samples on the host (overlapped, the next step already runs): in the steady state
        # one call per step's worth of tokens
        scheduler.step()
        steps += 1
        if steady:
            decode_s += time.perf_counter() - t
            decode_tokens += size
        elif first_tokens_at is None and all(seq.times for seq in scheduler.running) and len(scheduler.running) == size:
            first_tokens_at = time.perf_counter()
    total = time.perf_counter() - t0
    ttft = [f.stats.ttft_ms for f in finals.values()]
    return {
        "sequences": size,
        "steps": steps,
        "decode_tok_s": decode_tokens / decode_s if decode_s else 0.0,
        "decode_step_ms": decode_s / max(1, decode_tokens // size) * 1000.0,
        "prefill_all_s": (first_tokens_at - t0) if first_tokens_at else None,
        "ttft_ms_p50": percentile(ttft, 50),
        "ttft_ms_max": max(ttft),
        "total_s": total,
        "tok_s_overall": sum(len(f.token_ids) for f in finals.values()) / total,
        "ids": [finals[i].token_ids for i in range(size)],
    }


def format_batch(r: dict, single_tok_s: float | None = None) -> str:
    lines = [
        f"batched decode, {r['prompt_tokens']}-token prompts, {r['new_tokens']} new tokens each, greedy "
        f"({r['kv_blocks']} KV blocks of {r['block_size']} tokens, {r['kv_cache_bytes'] / 2**20:,.0f} MiB)"
    ]
    for row in r["batches"]:
        match = row["matches_alone"]
        same = sum(m == r["new_tokens"] for m in match)
        lines.append(
            f"  {row['sequences']:>3} sequences: {row['decode_tok_s']:>9,.1f} tok/s decoding "
            f"({row['decode_step_ms']:.2f} ms a step), TTFT p50 {row['ttft_ms_p50']:,.1f} ms "
            f"max {row['ttft_ms_max']:,.1f} ms; {same} of {len(match)} texts = alone "
            f"(leading tokens equal: min {min(match)}, median {sorted(match)[len(match) // 2]})"
        )
    return "\n".join(lines)
