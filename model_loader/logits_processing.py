"""One sequence's next-token choice when its settings go beyond temperature, top-p and top-k (API clients:
min-p, penalties, logit bias, log-probabilities, a grammar). The decode step then stops at the logits and this
runs after it, on the same device, with no host sync except where a grammar must see each token (its mask for
the next one depends on it).

The order is vLLM's: grammar mask, logit bias, then the penalties, then temperature, top-k, min-p and top-p
(sampling.sort_sample); greedy takes the argmax of the processed logits. Penalties count the reply's own tokens
(OpenAI's frequency and presence penalties) and, for the repetition penalty, the prompt's too (as vLLM and
transformers do). Log-probabilities are of the raw model (log-softmax at temperature 1, before any of this).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from model_loader.events import SamplingSettings, TokenLogprobs
from model_loader.sampling import sort_sample

MAX_TOP_LOGPROBS = 20  # OpenAI's limit


@dataclass
class HostSampler:
    """sort_sample's settings as plain numbers (one sequence's, applied outside the graph)."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float


class LogitsPipeline:
    """Per sequence: its penalty counts and bias on the device, its grammar matcher on the host, the log-
    probabilities of the tokens chosen but not yet read."""

    def __init__(
        self, settings: SamplingSettings, vocab_size: int, device, prompt_ids: list[int], in_reasoning: bool = False
    ):
        s = settings
        self.settings = s
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.greedy = s.temperature <= 0
        top_k = s.top_k if 0 < s.top_k < vocab_size else vocab_size
        self.sampler = HostSampler(max(s.temperature, 1e-5), min(max(s.top_p, 1e-6), 1.0), top_k, s.min_p)
        self.counts = None  # [V] int32: times each token was generated (frequency/presence penalties)
        if s.frequency_penalty or s.presence_penalty:
            self.counts = torch.zeros(vocab_size, dtype=torch.int32, device=self.device)
        self.seen = None  # [V] bool: in the prompt or the reply (repetition penalty)
        if s.repetition_penalty != 1.0:
            self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=self.device)
            if prompt_ids:
                self.seen[torch.tensor(sorted(set(prompt_ids)), dtype=torch.int64, device=self.device)] = True
        self.bias = None  # [V] float32
        if s.logit_bias:
            bias = torch.zeros(vocab_size, dtype=torch.float32)
            for token, value in s.logit_bias.items():
                bias[int(token)] = float(value)
            self.bias = bias.to(self.device)
        self.matcher = None  # a grammar's (model_loader.grammar): the allowed next tokens as a host bitmask
        if s.constraint is not None:
            self.matcher = s.constraint.matcher(in_reasoning)
            self.words = np.zeros(self.matcher.mask_words, dtype=np.int32)  # the bitmask, as the library writes it
            # the tokens it rules out, one byte each, where the device copies them from (pinned: asynchronously)
            self.blocked = torch.zeros(vocab_size, dtype=torch.bool, pin_memory=self.device.type == "cuda")
            self.blocked_np = self.blocked.numpy()
        self.top = min(int(s.logprobs), MAX_TOP_LOGPROBS) if s.logprobs is not None else None
        # per token chosen and not yet read: [token, its logprob, top values..., top ids...] on its way to the host
        self.pending: deque = deque()

    @property
    def needs_each_token(self) -> bool:
        """The host must read each token before the next step's choice (a grammar's mask depends on it)."""
        return self.matcher is not None

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """[1, V] logits -> [1, V] after the grammar mask, bias and penalties: in float32 where bias or penalties
        apply, else in the logits' own dtype (the mask alone changes no value: no copy to float32)."""
        x = logits
        if self.matcher is not None and self.matcher.active:  # inactive: still in the reasoning, anything goes
            # The host computes the mask while the GPU runs the step's forward pass and unpacks it to a byte per
            # token (cheap on the host; one copy and one kernel on the device). One host buffer is enough: a
            # grammar's reply reads each token (after which the last copy out of it has run) before the next.
            self.matcher.fill_mask(self.words.ctypes.data, self.words.nbytes)
            bits = np.unpackbits(self.words.view(np.uint8), bitorder="little")[: self.vocab_size]
            np.logical_not(bits, out=self.blocked_np)
            x = x.masked_fill(self.blocked.to(self.device, non_blocking=True), float("-inf"))
        if self.bias is not None or self.counts is not None or self.seen is not None:
            x = x.float()
        if self.bias is not None:
            x = x + self.bias
        if self.counts is not None:
            counts = self.counts.float()
            x = x - counts * self.settings.frequency_penalty - (counts > 0).float() * self.settings.presence_penalty
        if self.seen is not None:
            p = self.settings.repetition_penalty
            x = torch.where(self.seen, torch.where(x > 0, x / p, x * p), x)
        return x

    def choose(self, logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The next token [1] int64 (on the device, not read), from the step's raw logits [1, V]."""
        x = self.process(logits)
        token = torch.argmax(x, dim=-1) if self.greedy else sort_sample(x, self.sampler, generator)
        if self.top is not None:
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            chosen = logprobs.gather(-1, token.view(1, 1)).view(1)
            values, ids = torch.topk(logprobs[0], self.top) if self.top else (logprobs[0, :0], token[:0])
            # ids < 2**24 are exact in float32; the copy to the host is queued behind the step (pinned memory):
            # read after the step's event, it needs no sync of its own, which would wait for the steps queued since
            packed = torch.cat([token.float(), chosen, values, ids.float()])
            self.pending.append(packed.to("cpu", non_blocking=True) if packed.is_cuda else packed)
        return token

    def observe(self, token: torch.Tensor | int) -> None:
        """The token the sequence took ([1] on the device, or its id; a forced one too), for the penalties."""
        if isinstance(token, int) and (self.counts is not None or self.seen is not None):
            token = torch.tensor([token], dtype=torch.int64, device=self.device)
        if self.counts is not None:
            self.counts.index_add_(0, token.view(1), torch.ones(1, dtype=torch.int32, device=self.device))
        if self.seen is not None:
            self.seen.index_fill_(0, token.view(1), True)

    def accept(self, token_id: int, in_reasoning: bool) -> None:
        """The host has read the token (in_reasoning: whether the reply is still in its reasoning after it): the
        grammar moves on."""
        if self.matcher is not None:
            self.matcher.accept(token_id, in_reasoning)

    def take_logprobs(self, token_id: int, tokenizer, kind: str) -> TokenLogprobs | None:
        """The oldest chosen token's log-probabilities, read (its step has run). token_id: the token the
        sequence took, which differs from the one chosen where stop thinking forced its close tag."""
        if self.top is None or not self.pending:
            return None
        packed = self.pending.popleft().tolist()
        if int(packed[0]) != token_id:  # a forced token (stop thinking's close tag): not chosen here, not scored
            return None
        top_values, top_ids = packed[2 : 2 + self.top], [int(t) for t in packed[2 + self.top :]]
        text, raw = token_text(tokenizer, token_id)
        return TokenLogprobs(
            token_id=token_id,
            token=text,
            bytes=list(raw),
            logprob=packed[1],
            top=[_entry(tokenizer, t, v) for t, v in zip(top_ids, top_values)],
            kind=kind,
        )


def _entry(tokenizer, token_id: int, logprob: float) -> dict:
    text, raw = token_text(tokenizer, token_id)
    return {"token_id": token_id, "token": text, "bytes": list(raw), "logprob": logprob}


_BYTE_OF_CHAR: dict[str, int] = {}


def _byte_level_map() -> dict[str, int]:
    """GPT-2's byte-level alphabet (every byte as a printable character), inverted: what a byte-level BPE token's
    characters stand for."""
    if not _BYTE_OF_CHAR:
        printable = (
            list(range(ord("!"), ord("~") + 1))
            + list(range(ord("¡"), ord("¬") + 1))
            + list(range(ord("®"), ord("ÿ") + 1))
        )
        chars, extra = {}, 0
        for b in range(256):
            if b in printable:
                chars[b] = chr(b)
            else:
                chars[b] = chr(256 + extra)
                extra += 1
        _BYTE_OF_CHAR.update({c: b for b, c in chars.items()})
    return _BYTE_OF_CHAR


def token_text(tokenizer, token_id: int) -> tuple[str, bytes]:
    """A token's exact bytes and its text (U+FFFD where the bytes are a piece of a character)."""
    piece = (
        tokenizer.id_to_token(token_id)
        if hasattr(tokenizer, "id_to_token")
        else tokenizer.convert_ids_to_tokens(token_id)
    )
    special = getattr(tokenizer, "added_token_ids", None)
    if piece is None:
        raw = b""
    elif special is not None and token_id in special():
        raw = piece.encode("utf-8")
    else:
        table = _byte_level_map()
        if all(c in table for c in piece):
            raw = bytes(table[c] for c in piece)
        else:  # not a byte-level vocabulary: its decoder knows
            raw = tokenizer.decode([token_id]).encode("utf-8")
    return raw.decode("utf-8", errors="replace"), raw
