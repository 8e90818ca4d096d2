"""`r1desk-cli bench --depths` and `--scenario chat`: the speeds a reasoning model's real work sees, beyond the
512-token headline.

- Decode speed by context depth: a prompt of D tokens (a real chunked prefill fills the KV cache), then N new
  tokens; the decode attention reads D..D+N tokens of KV per step, so this shows what long chains of thought and
  long conversations cost.
- A scripted 4-turn chat as the window runs it: user turns of filler text, sampled replies, the history rendered
  through the chat template with each earlier reply reduced to what the window sends back (its answer, the
  reasoning dropped), on one engine whose KV cache carries over between turns. Per turn: TTFT, the prefix
  reused from the cache, the new prompt tokens prefilled, decode tok/s.
"""

from __future__ import annotations

import contextlib
import time

from model_loader.bench import FILLER, bench_prompt
from model_loader.chat import history_message
from model_loader.engine import Engine
from model_loader.events import Finished, SamplingSettings
from model_loader.gpu_clocks import ClockWatch, format_clock_summary
from model_loader.stats import decode_context, percentile

DEFAULT_DEPTHS = (512, 4096, 16384, 32768)
CHAT_TURNS = 4


def context_for_depths(depths, new_tokens: int) -> int:
    return max(depths) + new_tokens + 16


def context_for_chat(user_tokens: int, reply_tokens: int, turns: int = CHAT_TURNS) -> int:
    """Room for every turn's user text and reply (replies stay in the cache until the next turn's prefill)."""
    need = turns * (user_tokens + 64) + turns * reply_tokens
    ctx = 1024
    while ctx < need:
        ctx *= 2
    return ctx


def decode_read_bytes(engine: Engine, depth: int, new_tokens: int) -> float:
    """Bytes a decode step reads on average over a reply of new_tokens after a prompt of `depth` tokens: the
    weights (all but the embedding table) and the cache up to the current token (stats.decode_context)."""
    info = engine.info
    return info.decode_weight_bytes + info.kv_bytes_per_token * decode_context(depth, new_tokens)


def run_depths(engine: Engine, depths, new_tokens: int, runs: int) -> dict:
    """Decode tok/s after a prompt of each depth (greedy, ignore_eos), P50 over `runs` (after one warm-up). Each
    row also says what a step reads and at what rate (bytes x tok/s): decode is bound by memory, so a deeper
    step is slower by its extra cache bytes at best, and `vs_first_depth_at_bandwidth` is the share of the
    first depth's speed a step reading every byte at the same rate would keep (the bound a depth ratio is
    measured against: docs/BENCHMARKS.md, "Bounds")."""
    rows = []
    for depth in depths:
        if depth + new_tokens >= engine.info.context_length:
            raise ValueError(
                f"depth {depth} + {new_tokens} new tokens does not fit the {engine.info.context_length}-token context"
            )
        prompt = bench_prompt(engine, depth)
        rates, ttfts = [], []
        clocks = ClockWatch(engine.info.gpu_uuid)  # a long prefill can trip the GPU's power cap (BENCHMARKS)
        settings = SamplingSettings(temperature=0, max_new_tokens=new_tokens, ignore_eos=True)
        for i in range(runs + 1):
            engine.reset_cache()
            with clocks if i else contextlib.nullcontext():
                final = [ev for ev in engine.generate_ids(prompt, settings) if isinstance(ev, Finished)][0]
            if i:
                rates.append(final.stats.decode_tok_s)
                ttfts.append(final.stats.ttft_ms)
        tok_s = percentile(rates, 50)
        read = decode_read_bytes(engine, depth, new_tokens)
        rows.append(
            {
                "depth": depth,
                "new_tokens": new_tokens,
                "decode_tok_s_p50": tok_s,
                "decode_tok_s_min": min(rates),
                "prefill_ttft_ms_p50": percentile(ttfts, 50),
                "read_bytes_per_token": read,
                "read_gb_s": read * tok_s / 1e9,
                "sm_clock": clocks.summary(),
            }
        )
    base = rows[0]["decode_tok_s_p50"]
    for row in rows:
        row["vs_first_depth"] = row["decode_tok_s_p50"] / base if base else 0.0
        row["vs_first_depth_at_bandwidth"] = rows[0]["read_bytes_per_token"] / row["read_bytes_per_token"]
    return {"scenario": "depths", "context_length": engine.info.context_length, "runs": runs, "depths": rows}


def user_turn(engine: Engine, turn: int, tokens: int) -> str:
    """About `tokens` tokens of user text, different for every turn (so nothing but the history is shared)."""
    text = f"Turn {turn + 1}. Read this and answer the question at the end.\n"
    piece = FILLER
    while len(engine.chat.encode_plain(text)) < tokens:
        text += piece
    ids = engine.chat.encode_plain(text)[:tokens]
    return engine.chat.tokenizer.decode(ids) + f"\nQuestion {turn + 1}: what is the main idea?"


def run_chat(
    engine: Engine,
    user_tokens: int,
    reply_tokens: int,
    temperature: float = 0.6,
    seed: int = 0,
    turns: int = CHAT_TURNS,
) -> dict:
    messages: list[dict] = []
    rows = []
    engine.reset_cache()
    for turn in range(turns):
        messages.append({"role": "user", "content": user_turn(engine, turn, user_tokens)})
        settings = SamplingSettings(
            temperature=temperature, top_p=0.95, max_new_tokens=reply_tokens, ignore_eos=True, seed=seed + turn
        )
        t0 = time.perf_counter()
        final = [ev for ev in engine.generate(messages, settings) if isinstance(ev, Finished)][0]
        wall = time.perf_counter() - t0
        s = final.stats
        rows.append(
            {
                "turn": turn + 1,
                "prompt_tokens": s.prompt_tokens,
                "prefix_reused_tokens": s.prefix_reused_tokens,
                "new_prompt_tokens": s.prompt_tokens - s.prefix_reused_tokens,
                "ttft_ms": s.ttft_ms,
                "prompt_ms": s.prompt_ms,
                "completion_tokens": s.completion_tokens,
                "decode_tok_s": s.decode_tok_s,
                "wall_s": wall,
            }
        )
        # What the window sends back for this reply: the answer when the model reasoned, else the whole text.
        messages.append(history_message(final.text, final.reasoning, final.answer))
    return {
        "scenario": "chat",
        "turns": rows,
        "user_tokens": user_tokens,
        "reply_tokens": reply_tokens,
        "temperature": temperature,
        "context_length": engine.info.context_length,
    }


def format_depths(r: dict) -> str:
    lines = [f"decode speed by context depth (context {r['context_length']:,}, P50 of {r['runs']} runs)"]
    for row in r["depths"]:
        clock = row.get("sm_clock")
        lines.append(
            f"  depth {row['depth']:>6,}: {row['decode_tok_s_p50']:7.1f} tok/s "
            f"({row['vs_first_depth']:.0%} of depth {r['depths'][0]['depth']:,}; "
            f"{row['vs_first_depth_at_bandwidth']:.0%} by bytes read); "
            f"{row['read_bytes_per_token'] / 1e9:.2f} GB read a token, {row['read_gb_s']:,.0f} GB/s; "
            f"prefill to first token {row['prefill_ttft_ms_p50']:.1f} ms"
            + (f"; {format_clock_summary(clock)}" if clock else "")
        )
    return "\n".join(lines)


def format_chat(r: dict) -> str:
    lines = [
        f"4-turn chat: user turns of ~{r['user_tokens']} tokens, replies of {r['reply_tokens']} sampled tokens "
        f"(temperature {r['temperature']}), context {r['context_length']:,}"
    ]
    for t in r["turns"]:
        lines.append(
            f"  turn {t['turn']}: TTFT {t['ttft_ms']:7.1f} ms (template and tokenizer "
            f"{t['prompt_ms']:.1f}); prompt {t['prompt_tokens']:,} tokens, "
            f"{t['prefix_reused_tokens']:,} reused, {t['new_prompt_tokens']:,} prefilled; "
            f"decode {t['decode_tok_s']:.1f} tok/s"
        )
    return "\n".join(lines)
