"""One reply's token ids -> its streamed text events and its final text, split into reasoning and answer.

Feeds each generated id through the streaming detokenizer, the reasoning/answer splitter and the answer's leading
newline trimmer (model_loader.chat), collects the parts, and at the end builds the stored text: the reasoning, then
"</think>" and the answer when the reply started inside the reasoning. Knows nothing about tensors or scheduling:
the scheduler keeps one per sequence.
"""

from __future__ import annotations

from model_loader.chat import AnswerNewlineTrimmer, ReasoningSplitter, StreamingDetokenizer, stored_reply
from model_loader.events import Delta


class ReplyText:
    def __init__(self, tokenizer, stop_ids, in_reasoning: bool, verbatim: bool = False):
        self.stop_ids = stop_ids
        self.in_reasoning_at_start = in_reasoning
        self.detok = StreamingDetokenizer(tokenizer)
        self.splitter = ReasoningSplitter(in_reasoning)
        self.trim = AnswerNewlineTrimmer() if not verbatim else _as_is
        self.reasoning_parts: list[str] = []
        self.answer_parts: list[str] = []
        self.tokens = 0
        self.reasoning_tokens = 0

    @property
    def in_reasoning(self) -> bool:
        return self.splitter.in_reasoning

    def add(self, token_id: int) -> list[Delta]:
        """A generated token -> the text events it completes (none for a stop token or half a character)."""
        self.tokens += 1
        if self.splitter.in_reasoning:
            self.reasoning_tokens += 1
        if token_id in self.stop_ids:
            return []
        return self._deltas(self.splitter.feed(self.detok.add(token_id)))

    def flush(self) -> list[Delta]:
        """At the reply's end: the text still held back (an unfinished character, a possible tag)."""
        return self._deltas(self.splitter.feed(self.detok.flush()) + self.splitter.flush())

    def _deltas(self, parts) -> list[Delta]:
        out = []
        for kind, text in parts:
            text = self.trim(kind, text)
            if text:
                (self.answer_parts if kind == "answer" else self.reasoning_parts).append(text)
                out.append(Delta(text, kind, self.tokens))
        return out

    @property
    def reasoning(self) -> str:
        return "".join(self.reasoning_parts)

    @property
    def answer(self) -> str:
        return "".join(self.answer_parts)

    @property
    def text(self) -> str:
        """The stored form: reasoning + "</think>\\n\\n" + answer for a reply that started in its reasoning (the
        tag only once the reasoning has closed or an answer exists), else the answer."""
        return stored_reply(self.reasoning, self.answer, self.in_reasoning_at_start, not self.splitter.in_reasoning)


def _as_is(kind: str, text: str) -> str:
    return text
