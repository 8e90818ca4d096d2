"""The one result/event API every consumer (CLI, bench, the desktop worker) reads.

Engine.generate() yields one Started event once the prompt is prefilled, Delta events while it decodes, then
exactly one Finished event.
All plain dataclasses of Python values: safe to pass through Qt queued signals or json.dumps(asdict(...)).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["reasoning", "answer"]
FinishReason = Literal["eos", "max_new_tokens", "context_full", "cancelled"]


@dataclass
class SamplingSettings:
    temperature: float = 0.6  # 0 = greedy
    top_p: float = 0.95
    top_k: int = 0  # 0 = off
    max_new_tokens: int | None = None  # None: until the context is full (a long chain of thought is never cut)
    seed: int | None = None
    ignore_eos: bool = False  # benchmarks only: always decode max_new_tokens
    # max_new_tokens was asked for (an API client's max_tokens): a prompt that leaves less room than that in the
    # context is refused (ContextFullError) rather than cut short at the context's end
    length_strict: bool = False
    verbatim: bool = False  # a raw completion: the text exactly as decoded (no leading newlines trimmed)
    # Options for API clients (model_loader.logits_processing applies them); at their defaults a reply takes the
    # fused sampler inside the decode graph, otherwise the step stops at the logits and they are applied after it.
    min_p: float = 0.0  # drop tokens less likely than min_p times the likeliest (after the temperature)
    frequency_penalty: float = 0.0  # OpenAI's: minus penalty x times the token was generated so far
    presence_penalty: float = 0.0  # OpenAI's: minus penalty once the token was generated at all
    repetition_penalty: float = 1.0  # CTRL's (HF, vLLM): logits of tokens in the prompt or output divided by it
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit (OpenAI: -100..100)
    logprobs: int | None = None  # None: none; k >= 0: each token's log-probability and the k likeliest
    constraint: object | None = None  # a grammar (model_loader.grammar) the reply must follow after its reasoning

    def new_tokens_within(self, room: int) -> int:
        """The most tokens this reply may add where `room` more fit in the context."""
        return room if self.max_new_tokens is None else min(self.max_new_tokens, room)

    @property
    def plain(self) -> bool:
        """Nothing beyond temperature, top-p and top-k: the in-graph sampler does all of it."""
        return (
            self.min_p <= 0
            and not self.frequency_penalty
            and not self.presence_penalty
            and self.repetition_penalty == 1.0
            and not self.logit_bias
            and self.logprobs is None
            and self.constraint is None
        )


class GenerationControl:
    """Thread-safe requests from another thread (the GUI): checked by the decode loop before every token. While
    a reply is in its reasoning the engine may also register an action that closes it at once (`act_on_stop_
    thinking`): then stop_thinking() runs it on the caller's thread instead of waiting for the loop's next check
    (which comes only after the next token)."""

    def __init__(self):
        self._cancel = threading.Event()
        self._stop_thinking = threading.Event()
        self._lock = threading.Lock()
        self._act_now = None

    def cancel(self) -> None:
        self._cancel.set()

    def stop_thinking(self) -> None:
        """Close the reasoning now and make the model answer."""
        with self._lock:
            act = self._act_now
            if act is None:
                self._stop_thinking.set()
        if act is not None:
            act()

    def act_on_stop_thinking(self, act) -> None:
        """The engine's: `act` (thread-safe, idempotent) runs on the thread that asks to stop thinking; None
        goes back to leaving the request for the decode loop."""
        with self._lock:
            self._act_now = act

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def stop_thinking_asked(self) -> bool:
        """A stop-thinking request is waiting (without taking it)."""
        return self._stop_thinking.is_set()

    def take_stop_thinking(self) -> bool:
        if self._stop_thinking.is_set():
            self._stop_thinking.clear()
            return True
        return False


@dataclass
class Started:
    """The prompt is in the KV cache; the first token follows. Lets a UI show context use during the reply."""

    prompt_tokens: int
    prefix_reused_tokens: int
    context_length: int


@dataclass
class Delta:
    text: str
    kind: Kind
    token_count: int = 0  # tokens generated so far in this reply, including the ones behind this text


@dataclass
class TokenLogprobs:
    """One generated token's log-probability under the model (log-softmax of its logits at temperature 1, before
    any penalty, bias or constraint: what vLLM reports by default) and the `top` likeliest alternatives, sent
    before the text the token belongs to. token: its text (a piece of a character shows as U+FFFD);
    bytes: its UTF-8 bytes exactly."""

    token_id: int
    token: str
    bytes: list[int]
    logprob: float
    top: list[dict]  # [{"token_id", "token", "bytes", "logprob"}], likeliest first
    kind: Kind  # the part of the reply it belongs to (the closing </think> counts as reasoning)


@dataclass
class MemoryStats:
    device: str
    weights_bytes: int = 0
    kv_cache_bytes: int = 0
    torch_allocated_bytes: int = 0
    torch_reserved_bytes: int = 0
    peak_allocated_bytes: int = 0
    device_total_bytes: int = 0
    device_free_bytes: int = 0
    gpu_utilization_pct: int | None = None  # NVML, where present


@dataclass
class GenerationStats:
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    prefix_reused_tokens: int
    context_length: int
    ttft_ms: float  # from the request (the prompt's rendering included) to the first token
    first_answer_ms: float | None  # time to the first answer token; None if the answer never started
    decode_tok_s: float
    total_s: float
    token_latencies_ms: list[float] = field(default_factory=list)  # gap before each token after the first
    memory: MemoryStats | None = None
    stopped_thinking: bool = False
    seed: int | None = None  # the sampling seed used (None for greedy): replay a reply with SamplingSettings(seed=)
    prompt_ms: float = 0.0  # of ttft_ms: rendering the chat template and tokenizing (0 for a prompt given as ids)
    # What a decode step of this reply read on average (0: no decode step): every weight but the embedding table,
    # and of it the K/V of the tokens in context (stats.decode_context). Times decode_tok_s: the rate the
    # GPU's memory delivered them at, what decode speed is bound by.
    decode_read_bytes: float = 0.0
    decode_cache_read_bytes: float = 0.0


@dataclass
class Finished:
    text: str  # reasoning + "</think>" + answer, as the model wrote it (minus stop tokens)
    reasoning: str
    answer: str
    token_ids: list[int]
    stats: GenerationStats


@dataclass
class Failed:
    """The request ended with an error inside the engine (its own: the scheduler goes on serving the others)."""

    message: str
    kind: str = "error"
