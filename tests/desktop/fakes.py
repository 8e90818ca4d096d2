"""A scripted stand-in for model_loader's Engine, for tests and screenshots where the model is beside the point.

It speaks the real event API (model_loader.events: Started, Delta, Finished, GenerationStats, MemoryStats), honours
GenerationControl (cancel, stop_thinking) before every "token", and paces tokens like a GPU would, so the
GUI sees the same stream shape as with a real model: reasoning, then the answer.

Also the desktop tests' other stand-ins and steps: reply() (send a message in a window and wait for its reply)
and MemoryKeyring (the system keyring, in memory).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from keyring.backend import KeyringBackend
from keyring.errors import PasswordDeleteError

from model_loader.errors import ContextFullError, OutOfMemoryError
from model_loader.events import Delta, Finished, GenerationStats, MemoryStats, Started

# What DeepSeek-R1-Distill-Qwen-1.5B's bf16 decode steps read: weights but the embedding table, and each cached
# token's K/V (28 layers x K and V x 2 KV heads x 128 x 2 bytes)
FAKE_WEIGHT_READ = 3.087e9
FAKE_KV_TOKEN = 28_672

REASONING = (
    "Okay, the user wants the sum of the first $n$ odd numbers, and code to check it. "
    "Let me think. 1 = 1, 1 + 3 = 4, 1 + 3 + 5 = 9. Those are perfect squares, so the sum looks like $n^2$.\n\n"
    "Why? Pair the terms: the $k$-th odd number is $2k - 1$, so the sum is "
    "\\(\\sum_{k=1}^{n} (2k-1) = 2 \\cdot \\frac{n(n+1)}{2} - n = n^2\\). That checks out.\n\n"
    "I should show a short proof, a Python check, and a small table. For $n = 100$ it is 10000."
)
ANSWER = (
    "The sum of the first $n$ odd numbers is a perfect square:\n\n"
    "$$\\sum_{k=1}^{n} (2k - 1) = n^2$$\n\n"
    "**Why:** each odd number is $2k-1$, and $\\sum_{k=1}^{n} k = \\frac{n(n+1)}{2}$, so the total is "
    "$n(n+1) - n = n^2$.\n\n"
    "```python\n"
    "def sum_of_odds(n: int) -> int:\n"
    '    """Sum of the first n odd numbers."""\n'
    "    return sum(2 * k - 1 for k in range(1, n + 1))\n"
    "\n"
    "assert all(sum_of_odds(n) == n * n for n in range(1, 1000))\n"
    "```\n\n"
    "| $n$ | odd numbers | sum |\n"
    "|---|---|---|\n"
    "| 1 | 1 | 1 |\n"
    "| 3 | 1, 3, 5 | 9 |\n"
    "| 5 | 1, 3, 5, 7, 9 | 25 |\n\n"
    "- It works for every positive integer $n$.\n"
    "- See [square numbers](https://en.wikipedia.org/wiki/Square_number) for the picture proof.\n\n"
    "So for $n = 100$ the answer is \\boxed{10000}."
)


def tokens(text: str) -> list[str]:
    """Word-ish pieces, about the size of BPE tokens."""
    return re.findall(r"\s*\S{1,6}|\s+", text)


@dataclass
class FakeInfo:
    model_path: str = "/models/DeepSeek-R1-Distill-Qwen-1.5B"
    model_name: str = "DeepSeek-R1-Distill-Qwen-1.5B"
    device: str = "cuda:0"
    device_name: str = "NVIDIA GeForce RTX 4070 Laptop GPU"
    dtype: str = "bfloat16"
    context_length: int = 4096
    context_auto: bool = False
    kernels: str = "triton"
    cuda_graphs: bool = True
    reasons: bool = True
    load_s: float = 1.2
    warmup_s: float = 0.4
    weights_bytes: int = 3_554_176_512
    kv_cache_bytes: int = 117_440_512
    decode_weight_bytes: int = int(FAKE_WEIGHT_READ)
    kv_bytes_per_token: int = FAKE_KV_TOKEN
    gpu_uuid: str | None = None  # NVML's name for the GPU; None: the live panel reads no NVML
    kernels_note: str | None = None  # kernels "pytorch": why (model_loader.loading.EngineInfo)


@dataclass
class FakeEngine:
    reasoning: str = REASONING
    answer: str = ANSWER
    token_s: float = 0.004  # ~250 tok/s, a laptop GPU
    fail_generate: Exception | None = None
    info: FakeInfo = field(default_factory=FakeInfo)
    prompts: list = field(default_factory=list)
    settings_seen: list = field(default_factory=list)
    max_reasoning_tokens: int | None = None  # stop after this many reasoning tokens (cut-off reply)
    tokens_per_delta: int = 1  # >1: each piece of text stands for several tokens, as a real multi-byte delta can
    prefill_s: float = 0.0  # time between Started and the first token

    def memory(self) -> MemoryStats:
        gib = 2**30
        return MemoryStats(
            device=self.info.device,
            weights_bytes=self.info.weights_bytes,
            kv_cache_bytes=self.info.kv_cache_bytes,
            torch_allocated_bytes=int(3.75 * gib),
            torch_reserved_bytes=int(3.95 * gib),
            peak_allocated_bytes=int(3.9 * gib),
            device_total_bytes=8 * gib,
            device_free_bytes=int(3.4 * gib),
            gpu_utilization_pct=93,
        )

    def warm_up(self, progress=None) -> None:
        pass

    def generate(self, messages, settings=None, control=None, tools=None, continue_final=False):
        self.prompts.append(messages)
        self.settings_seen.append(settings)
        if self.fail_generate is not None:
            raise self.fail_generate
        t0 = time.perf_counter()
        times: list[float] = []
        parts = {"reasoning": [], "answer": []}
        n_kind = {"reasoning": 0, "answer": 0}
        finish, stopped, first_answer = "eos", False, None
        limit = settings.max_new_tokens if settings and settings.max_new_tokens is not None else 4096
        plan = [("reasoning", t) for t in tokens(self.reasoning)]
        if self.max_reasoning_tokens is not None:
            plan = plan[: self.max_reasoning_tokens]
            finish = "max_new_tokens"
        else:
            plan += [("answer", t) for t in tokens(self.answer)]
        prompt_tokens, reused = 40 + 30 * len(messages), max(0, 30 * len(messages) - 10)
        yield Started(prompt_tokens=prompt_tokens, prefix_reused_tokens=reused, context_length=self.info.context_length)
        time.sleep(self.prefill_s)
        i = 0
        while i < len(plan):
            kind, text = plan[i]
            if control is not None and control.cancelled:
                finish = "cancelled"
                break
            if kind == "reasoning" and control is not None and control.take_stop_thinking():
                stopped = True
                plan = plan[:i] + [("answer", t) for t in tokens("Stopping here: the answer is $n^2$.")]
                continue
            if len(times) >= limit:
                finish = "max_new_tokens"
                break
            for _ in range(self.tokens_per_delta):
                time.sleep(self.token_s)  # the simulated GPU's decode time, on the worker thread
                times.append(time.perf_counter())
                n_kind[kind] += 1
            if kind == "answer" and first_answer is None:
                first_answer = times[-1]
            parts[kind].append(text)
            yield Delta(text, kind, token_count=len(times))
            i += 1
        reasoning, answer = "".join(parts["reasoning"]), "".join(parts["answer"])
        n = len(times)
        total = time.perf_counter() - t0
        stats = GenerationStats(
            finish_reason=finish,
            prompt_tokens=prompt_tokens,
            completion_tokens=n,
            reasoning_tokens=n_kind["reasoning"],
            prefix_reused_tokens=reused,
            context_length=self.info.context_length,
            ttft_ms=(times[0] - t0) * 1000 if times else 0.0,
            first_answer_ms=(first_answer - t0) * 1000 if first_answer else None,
            decode_tok_s=(n - 1) / (times[-1] - times[0]) if n > 1 and times[-1] > times[0] else 0.0,
            total_s=total,
            token_latencies_ms=[(b - a) * 1000 for a, b in zip(times, times[1:])],
            memory=self.memory(),
            stopped_thinking=stopped,
            prompt_ms=0.5,  # as if the template took that long
            # what the 1.5B's decode steps would read (bf16 weights, a 16-bit cache): Qwen2Model.decode_read_bytes
            decode_read_bytes=FAKE_WEIGHT_READ + FAKE_KV_TOKEN * (prompt_tokens + n / 2) if n > 1 else 0.0,
            decode_cache_read_bytes=FAKE_KV_TOKEN * (prompt_tokens + n / 2) if n > 1 else 0.0,
        )
        text = reasoning + ("</think>\n\n" + answer if answer else "")
        yield Finished(text=text, reasoning=reasoning, answer=answer, token_ids=list(range(n)), stats=stats)


def reply(qtbot, win, text) -> dict:
    """Send `text` in the window and wait for its reply: the reply_finished signal's message."""
    with qtbot.waitSignal(win.reply_finished, timeout=20000) as blocker:
        assert win.send(text)
    return blocker.args[0]


def factory(
    engine: FakeEngine,
    fail_load: Exception | None = None,
    chunk_s: float = 0.0,
    chunks: int = 4,
    compiling: bool = False,
):
    """An engine_factory for MainWindow/EngineWorker: reports load progress (a chunk every chunk_s, like
    reading shards from a slow disk), then returns `engine`. compiling: a first start that compiles the GPU
    kernels beside the load (Engine.load's on_compiling)."""

    def make(request, progress, on_compiling=None):
        if compiling and on_compiling is not None:
            on_compiling()
        total = engine.info.weights_bytes
        for k in range(1, chunks + 1):
            time.sleep(chunk_s)
            progress(total * k // chunks, total)
        if fail_load is not None:
            raise fail_load
        return engine

    return make


__all__ = ["FakeEngine", "factory", "ContextFullError", "OutOfMemoryError"]


class MemoryKeyring(KeyringBackend):
    """A keyring backend in memory (the tests' stand-in for Secret Service / Keychain / Credential Locker)."""

    priority = 1

    def __init__(self):
        super().__init__()
        self.items = {}

    def set_password(self, service, username, password):
        self.items[(service, username)] = password

    def get_password(self, service, username):
        return self.items.get((service, username))

    def delete_password(self, service, username):
        if self.items.pop((service, username), None) is None:
            raise PasswordDeleteError("no such key")
