"""The live panel's figures, without widgets: a reply's timings as the GUI receives them (LiveReply), what a
decode step read from memory and at what rate, where the time to first token went, the kernels the warm-up chose,
and sizes in GiB/MiB. desktop.livepanel draws them."""

from __future__ import annotations

import time
from collections import deque

from model_loader.events import GenerationStats, Started  # plain dataclasses: no torch


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.0f} MiB"


def kernel_choices_text(info: dict) -> str:
    """What the warm-up measured and chose on this GPU, for the device line's tooltip: the decode attention per
    context depth (decode_graphs.DecodeStep.tune: the whole step timed with each shape; a shape the GPU had no room for
    shows as the fallback that runs) and, per weight shape, cuBLAS or our single-token kernel."""
    if info.get("kernels") != "triton":
        return "Plain PyTorch operations (no usable Triton here): nothing is tuned."
    lines = []
    attention = info.get("decode_attention") or {}
    if attention:
        lines.append("Decode attention by context depth (the fastest whole decode step at warm-up):")
        lines += [f"  up to {int(upper.lstrip('<=')):,} tokens: {shape}" for upper, shape in attention.items()]
    products = info.get("gemv") or {}
    if products:
        lines.append("One-token matrix products by weight shape (the fastest measured):")
        lines += [f"  {shape}: {choice}" for shape, choice in products.items()]
    return "\n".join(lines) or "Fused Triton kernels (tuned only where CUDA graphs run)."


def slow_kernels_notice(info: dict) -> str | None:
    """What a GPU running without r1desk's Triton kernels loses and how to get them back (the engine's
    kernels_note says why and what to do), or None where they run, or on the CPU or a server."""
    if info.get("kernels") == "triton" or not str(info.get("device", "")).startswith("cuda"):
        return None
    why = info.get("kernels_note") or "they could not be used on this GPU."
    graphs = " (in CUDA graphs)" if info.get("cuda_graphs") else ""
    return (
        f"Fast kernels off: replies run on plain PyTorch operations{graphs}, several times slower to decode than "
        f"with r1desk's kernels. Why: {why}"
    )


class LiveReply:
    """Timings of the reply in flight, from what the GUI receives."""

    def __init__(self):
        self.start = time.monotonic()
        self.first_t: float | None = None
        self.first_answer_t: float | None = None
        self.reasoning_n = 0
        self.answer_n = 0
        self.count = 0  # tokens generated so far (the engine's count)
        self.started: Started | None = None  # prompt size, prefix reused, context length
        self.recent: deque[tuple[float, int]] = deque()  # (arrival time, token count) over the last second
        self.base = 0  # token count just before the oldest entry of `recent`
        self.rate_series: list[float] = []
        self.done_stats: GenerationStats | None = None
        self.failed = False  # ended without stats (an error): nothing is live any more

    def on_started(self, started: Started) -> None:
        self.started = started

    def on_delta(self, kind: str, token_count: int = 0) -> None:
        now = time.monotonic()
        if self.first_t is None:
            self.first_t = now
        # token_count 0: an engine that doesn't count; then a delta is the best guess for a token
        count = token_count if token_count > 0 else self.count + 1
        new = max(0, count - self.count)
        self.count = max(self.count, count)
        if kind == "answer":
            self.answer_n += new
            if self.first_answer_t is None:
                self.first_answer_t = now
        else:
            self.reasoning_n += new
        self.recent.append((now, self.count))

    def rate_now(self) -> float:
        now = time.monotonic()
        while self.recent and now - self.recent[0][0] > 1.0:
            self.base = self.recent.popleft()[1]
        span = min(1.0, now - (self.first_t or now))
        return (self.count - self.base) / span if span > 0.05 else 0.0


def memory_read(total: float, cache: float, tok_s: float) -> tuple[str, str, str]:
    """(bytes, rate, tooltip) of a reply's memory read: what its average decode step read (total bytes, cache of
    them) and the rate the GPU's memory delivered that at (bytes × tok/s). Decode reads every weight and the
    context's K/V for each token, so this is what its speed is bound by, and how much the context adds. Dashes
    where not known: no decode step yet, or a reply saved before these were recorded."""
    if not total or total <= 0 or not tok_s:
        return "—", "—", ""
    rate = total * tok_s / 1e9  # GB/s
    rate_text = f"{rate / 1000:.2f} TB/s" if rate >= 1000 else f"{rate:.0f} GB/s"
    return (
        f"{total / 1e9:.2f} GB",
        rate_text,
        f"Each decode step read {(total - cache) / 1e9:.2f} GB of weights and {cache / 1e9:.2f} GB of KV cache "
        f"(the context it attends to).\nDecode speed is bound by memory: {tok_s:.0f} tok/s × "
        f"{total / 1e9:.2f} GB is {rate_text} read.",
    )


def ttft_breakdown(stats: GenerationStats) -> str:
    """Where a reply's time to first token went: the prompt's rendering, then the prefill and first sample."""
    prompt_ms = stats.prompt_ms
    new = stats.prompt_tokens - stats.prefix_reused_tokens
    return (
        f"Chat template and tokenizer: {prompt_ms:.1f} ms\n"
        f"Prefill of {new:,} new tokens ({stats.prefix_reused_tokens:,} cached) and the first token: "
        f"{stats.ttft_ms - prompt_ms:.1f} ms"
    )
