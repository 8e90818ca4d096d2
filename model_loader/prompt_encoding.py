"""Tokenize a chat's prompt without tokenizing its whole history again on every turn.

Each turn renders the whole conversation through the chat template and tokenizes it; the engine then reuses the
KV cache for the ids it shares with the last prompt. Tokenizing the whole history takes time that grows with the
conversation, and a follow-up's first token waits for it on top of its prefill (docs/BENCHMARKS.md, 'Follow-ups,
prompt rendering and stop thinking').
A new prompt almost always starts with the last one's text, so the ids of that shared text are reused and only
the rest is tokenized.

Why that gives exactly the ids a full tokenization would: the tokenizer first cuts the text at its added tokens
(<｜User｜>, <｜Assistant｜>, ...), matched leftmost-longest, and tokenizes the pieces between them independently.
So the text is cut only right before an added token that lies whole inside the shared text, and only at tokens
whose match depends on nothing around them (not normalized, no whitespace stripping, not single-word). The
ids before the cut are then those of the shared text in both prompts, and tokenizing from the cut on gives
what the full text gives from there, unless an added token that the new text completes starts at or before
the cut and reaches past the shared text (it would take the cut token's place): that is checked, and an earlier
cut taken then. tests/test_prompt_encoding.py checks the equality on many random chats and on a tokenizer
whose added tokens overlap.
"""

from __future__ import annotations

import bisect
import threading

from model_loader.common_prefix import common_prefix


class IncrementalEncoder:
    """encode(text) of a `tokenizers.Tokenizer` (no special tokens added), reusing the previous call's ids for
    the text the two calls share. Thread-safe; remembers one prompt (the engine's cache holds one too)."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self._lock = threading.Lock()
        self._learn_added_tokens()
        self._forget()

    @staticmethod
    def usable(tokenizer) -> bool:
        """False for a tokenizer.json that truncates or pads (the rest of a text would be cut or padded on its
        own) or encodes special tokens as text: then every prompt is tokenized whole."""
        return (
            tokenizer.truncation is None
            and tokenizer.padding is None
            and not getattr(tokenizer, "encode_special_tokens", False)
        )

    def _learn_added_tokens(self) -> None:
        added = self._tok.get_added_tokens_decoder()  # id -> AddedToken
        base_vocab = self._tok.get_vocab(with_added_tokens=False)
        # Cut only at added tokens that nothing else can produce (an id of the base vocabulary can come out of
        # the model, e.g. text that a normalizer maps onto the token's content) and whose match depends on
        # nothing around them.
        self._cut_tokens = {
            i: t.content
            for i, t in added.items()
            if t.content and t.content not in base_vocab and not (t.normalized or t.lstrip or t.rstrip or t.single_word)
        }
        self._contents = sorted({t.content for t in added.values() if t.content}, key=len)
        self._vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def _forget(self) -> None:
        self._text = ""
        self._ids: list[int] = []
        self._cut_chars: list[int] = []  # where each cut token starts in _text, ascending ...
        self._cut_index: list[int] = []  # ... and its index in _ids
        self.reused_ids = 0  # of the last encode (for tests and logs)

    def _reaches_past(self, text: str, cut: int, shared: int) -> bool:
        """Does an added token start in `text` at or before `cut` and end after `shared`?"""
        for content in self._contents:
            low = max(0, shared - len(content) + 1)  # an occurrence from here on ends after `shared`
            if low <= cut and text.find(content, low, cut + len(content)) != -1:
                return True
        return False

    def _cut_for(self, text: str) -> int:
        """How many of the last prompt's cuts stay valid for `text`; the last of them is where to cut."""
        shared = common_prefix(self._text, text)
        n = bisect.bisect_right(self._cut_chars, shared)
        while n and (self._cut_end(n - 1) > shared or self._reaches_past(text, self._cut_chars[n - 1], shared)):
            n -= 1
        return n

    def _cut_end(self, k: int) -> int:
        """Where the k-th cut token ends in the last prompt's text."""
        return self._cut_chars[k] + len(self._cut_tokens[self._ids[self._cut_index[k]]])

    def encode(self, text: str) -> list[int]:
        with self._lock:
            if self._tok.get_vocab_size(with_added_tokens=True) != self._vocab_size:  # tokens added since
                self._learn_added_tokens()
                self._forget()
            n = self._cut_for(text)
            if n:  # the cut token itself is tokenized again, as the first id of the rest
                start, keep, kept_cuts = self._cut_chars[n - 1], self._cut_index[n - 1], n - 1
            else:
                start = keep = kept_cuts = 0
            enc = self._tok.encode(text[start:], add_special_tokens=False)
            new_ids = enc.ids
            cuts, chars = [], []
            for i, t in enumerate(new_ids):
                if t in self._cut_tokens:
                    c = start + enc.token_to_chars(i)[0]
                    # offsets a post-processor trimmed (ByteLevel's trim_offsets) may not point at the token
                    if text.startswith(self._cut_tokens[t], c):
                        cuts.append(i)
                        chars.append(c)
            self._cut_chars = self._cut_chars[:kept_cuts] + chars
            self._cut_index = self._cut_index[:kept_cuts] + [keep + i for i in cuts]
            self._ids = self._ids[:keep] + new_ids
            self._text = text
            self.reused_ids = keep
            return list(self._ids)
