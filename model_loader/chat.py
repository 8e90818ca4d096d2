"""Chat format and streamed text: prompt rendering, the incremental detokenizer, the reasoning/answer split.

Knows nothing about tensors. The prompt is always built through a chat template (the folder's own, else
DeepSeek-R1's) and tokenized with add_special_tokens=False, so the BOS comes from the template exactly once
whether or not the tokenizer would add one itself.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass

from model_loader.chat_template import R1_CHAT_TEMPLATE
from model_loader.errors import ModelError
from model_loader.tokenizer import encode_text_only
from model_loader.tool_calls import template_messages, template_supports_tools

log = logging.getLogger(__name__)

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
# What "Stop thinking" makes the model write next: the close tag and the blank line its own answers start after.
STOP_THINKING_TEXT = "\n</think>\n\n"


# A message key: its content is the reply's answer already (history_content), not the raw text to cut.
ANSWER_ONLY = "answer_only"
TOOL_FIELDS = ("tool_calls", "tool_call_id", "name")  # a message's fields a tool-aware template reads
FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")  # fill-in-the-middle (Qwen2.5-Coder's order)


def stored_reply(reasoning: str, answer: str, started_in_reasoning: bool, reasoning_closed: bool = False) -> str:
    """A reply's text as it is stored and returned whole: reasoning + "</think>" + a blank line + answer for a
    reply that started in its reasoning (the tag once the reasoning has closed or an answer exists), else the
    answer alone. The engine, the scheduler's replies and the window's saving all write it here."""
    if not started_in_reasoning:
        return answer
    return reasoning + (f"{THINK_CLOSE}\n\n" + answer if answer or reasoning_closed else "")


def history_content(text: str, reasoning: str, answer: str) -> str:
    """What of a finished reply goes back into the conversation for the next turn: its answer when it reasoned
    (DeepSeek advises leaving earlier reasoning out), else all of its text. The window, the chat benchmark and
    the engine's tokenizing ahead all use this, so the next prompt's text is the one tokenized ahead."""
    return answer if reasoning else text


def history_message(text: str, reasoning: str, answer: str) -> dict:
    """A finished reply as the assistant message of the next turn's history (history_content, marked so that the
    prompt takes it as it is: an answer that itself mentions </think> is not cut again)."""
    return {"role": "assistant", "content": history_content(text, reasoning, answer), ANSWER_ONLY: True}


def answer_only(content: str) -> str:
    """The answer of a raw assistant message (reasoning, </think>, answer: a client of the API, the CLI's
    history): the text after the first </think>, where ReasoningSplitter ends the reasoning too."""
    if THINK_CLOSE in content:
        return content.partition(THINK_CLOSE)[2].lstrip("\n")
    return content


def _history_answer(content: str) -> str:
    """What a reasoning model's template keeps of an earlier reply: its answer, and of an answer that itself
    holds "</think>" only the text after the last one (R1's templates split there). Cut here already, the text
    the template inserts is the text given to it, so message text can be tokenized as text (_encode_guarded)."""
    answer = answer_only(content)
    if THINK_CLOSE in answer:
        answer = answer.rpartition(THINK_CLOSE)[2].lstrip("\n")
    return answer


def encode_text(tokenizer, text: str) -> list[int]:
    """Text as text, with no added token matched (see FolderTokenizer.encode_text); a transformers tokenizer
    through its fast backend, else its own switch for it."""
    if hasattr(tokenizer, "encode_text"):
        return tokenizer.encode_text(text)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return encode_text_only(backend, text)
    return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))


@dataclass
class RenderedPrompt:
    text: str
    ids: list[int]
    starts_in_reasoning: bool  # the prompt ends inside <think>: output is reasoning until </think>


class ChatFormat:
    """Messages -> prompt ids for one tokenizer; also knows the stop ids and whether the model reasons."""

    def __init__(self, tokenizer, eos_ids: list[int]):
        self.tokenizer = tokenizer
        self.template = tokenizer.chat_template or R1_CHAT_TEMPLATE
        vocab = tokenizer.get_vocab()
        self.think_close_id = vocab.get(THINK_CLOSE)
        self.reasons = THINK_OPEN in vocab and self.think_close_id is not None
        stops = set(eos_ids)
        if tokenizer.eos_token_id is not None:
            stops.add(tokenizer.eos_token_id)
        for name in ("<|im_end|>", "<|EOT|>", "<|endoftext|>", "<｜end▁of▁sentence｜>"):
            if name in vocab:
                stops.add(vocab[name])
        self.stop_ids = frozenset(stops)
        # Each turn's prompt holds the last one's text: tokenize only what is new (tokenizers that can; see
        # model_loader.prompt_encoding), not the whole history again before the follow-up's first token.
        make_encoder = getattr(tokenizer, "prompt_encoder", None)
        self.prompt_encoder = make_encoder() if make_encoder is not None else None
        self.tools_supported = template_supports_tools(self.template)  # its template renders `tools`
        self.fim = all(t in vocab for t in FIM_TOKENS)  # its tokenizer can frame a fill-in-the-middle prompt

    def _clean(self, messages: list[dict]) -> list[dict]:
        # Only a model that reasons has reasoning to cut from its earlier replies: a Qwen2.5's answer that
        # mentions </think> goes back whole, as its own template would send it.
        # A tool-calling turn (an assistant's calls, a tool's result) keeps the fields its template reads.
        out = []
        for m in messages:
            content = m.get("content")
            if content is None:
                if not m.get("tool_calls"):
                    continue
                content = ""
            elif m["role"] == "assistant" and self.reasons and not m.get(ANSWER_ONLY):
                content = _history_answer(content)
            out.append(
                {"role": m["role"], "content": content, **{k: m[k] for k in TOOL_FIELDS if m.get(k) is not None}}
            )
        return template_messages(out) if any("tool_calls" in m for m in out) else out

    def _template_text(
        self,
        messages: list[dict],
        add_generation_prompt: bool,
        clean: list[dict] | None = None,
        tools: list[dict] | None = None,
    ) -> str:
        clean = self._clean(messages) if clean is None else clean
        extra = {"tools": tools} if tools else {}  # only where asked: a template may test `tools is defined`
        try:
            return self.tokenizer.apply_chat_template(
                clean, chat_template=self.template, add_generation_prompt=add_generation_prompt, tokenize=False, **extra
            )
        except Exception as err:
            raise ModelError(f"chat template failed: {err}") from err

    def prepare(self, messages: list[dict]) -> None:
        """Tokenize a conversation's history ahead of its next prompt (after a reply, while the user reads and
        types), so that the next render tokenizes only the new message, not the reply too. Nothing to do for a
        tokenizer without the incremental encoder; a template that renders the history differently once a user
        message follows only makes the next render reuse less."""
        if self.prompt_encoder is not None:
            self.prompt_encoder.encode(self._template_text(messages, add_generation_prompt=False))

    def render(
        self, messages: list[dict], tools: list[dict] | None = None, continue_final: bool = False
    ) -> RenderedPrompt:
        """tools: OpenAI's tool definitions, for a template that renders them (tools_supported). continue_final:
        the last message is the start of the reply (an assistant message), which the model continues."""
        if continue_final:
            return self._continuation(messages, tools)
        text = self._template_text(messages, add_generation_prompt=True, tools=tools)
        in_reasoning = False
        if self.reasons:
            stripped = text.rstrip()
            if stripped.endswith(THINK_OPEN):
                in_reasoning = True
            elif THINK_OPEN not in self._generation_prompt(messages, text, tools):
                # Older R1 templates stop at <｜Assistant｜>; DeepSeek advises forcing the reasoning open.
                text += THINK_OPEN + "\n"
                in_reasoning = True
        ids = self._encode_guarded(messages, text, tools)
        if ids is None:  # the usual case: no message holds a control token's text
            if self.prompt_encoder is not None:
                ids = self.prompt_encoder.encode(text)
            else:
                ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        return RenderedPrompt(text=text, ids=ids, starts_in_reasoning=in_reasoning)

    def _continuation(self, messages: list[dict], tools: list[dict] | None) -> RenderedPrompt:
        """The prompt for the messages before the last, then the last (the reply so far) as the model wrote it:
        its reasoning kept and its tags as the model's own tokens (the template would cut an earlier reply's
        reasoning, and an assistant turn would end). How a client closes the reasoning of a reply it stopped
        ("stop thinking" over the API): the reasoning so far, then "</think>", continued as the answer."""
        last = messages[-1] if messages else {}
        if last.get("role") != "assistant" or not isinstance(last.get("content"), str) or len(messages) < 2:
            raise ModelError("continuing a reply needs an assistant message last, after the messages it answers")
        head = self.render(messages[:-1], tools)
        reply = last["content"]
        if head.starts_in_reasoning and reply.lstrip().startswith(THINK_OPEN):  # the prompt opened it already
            reply = reply.lstrip()[len(THINK_OPEN) :].lstrip("\n")
        ids = head.ids + list(self.tokenizer.encode(reply, add_special_tokens=False))
        in_reasoning = head.starts_in_reasoning and THINK_CLOSE not in reply
        return RenderedPrompt(text=head.text + reply, ids=ids, starts_in_reasoning=in_reasoning)

    def _encode_guarded(self, messages: list[dict], text: str, tools: list[dict] | None = None) -> list[int] | None:
        """The prompt's ids with each message's text tokenized as text, where a message holds a control token's
        text ("<｜Assistant｜>" typed or pasted would otherwise become the real token and forge a turn); None
        where none does. The template is rendered with a placeholder per message to find where each message's
        text lies; a template that changes the text it inserts (trims it, say) can't be split that way, and the
        prompt is then tokenized whole, as before, with a warning in the log."""
        clean = self._clean(messages)
        controls = self.control_strings
        if not any(c in m["content"] for m in clean if isinstance(m["content"], str) for c in controls):
            return None
        marked = [{**m, "content": f"\ue000{i}\ue001"} for i, m in enumerate(clean)]
        skeleton = self._template_text(messages, add_generation_prompt=True, clean=marked, tools=tools)
        parts = re.split(
            "\ue000(\\d+)\ue001",
            skeleton + text[len(self._template_text(messages, add_generation_prompt=True, clean=clean, tools=tools)) :],
        )  # + a reasoning tag render() added
        rebuilt = "".join(clean[int(p)]["content"] if i % 2 else p for i, p in enumerate(parts))
        if rebuilt != text:
            log.warning(
                "this chat template changes message text as it inserts it; control-token text typed in "
                "a message can't be kept as text"
            )
            return None
        ids: list[int] = []
        for i, part in enumerate(parts):
            if i % 2:
                ids += encode_text(self.tokenizer, clean[int(part)]["content"])
            elif part:
                ids += self.tokenizer.encode(part, add_special_tokens=False)
        return ids

    @functools.cached_property
    def control_strings(self) -> list[str]:
        """The text of the tokenizer's added tokens (control tokens)."""
        strings = getattr(self.tokenizer, "control_strings", None)
        if strings is not None:
            return strings()
        return [t.content for t in getattr(self.tokenizer, "added_tokens_decoder", {}).values() if t.content]

    def _generation_prompt(self, messages: list[dict], text: str, tools: list[dict] | None = None) -> str:
        """What the template adds for the reply (the text past the same messages rendered without it): where a
        template that opens or closes the reasoning itself says so. Not the prompt's last characters, which a
        message mentioning <think> can hold."""
        bare = self._template_text(messages, add_generation_prompt=False, tools=tools)
        if text.startswith(bare):  # the usual case: the generation prompt is appended
            return text[len(bare) :]
        n = len(os.path.commonprefix([bare, text]))
        return text[n:]

    def encode_plain(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))


class StreamingDetokenizer:
    """Token ids in, complete text out: never emits half a UTF-8 character (a CJK character or an emoji is
    often several byte-level tokens). Decodes a short window, not the whole reply, so each token costs O(1)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0  # window start: decoded only to learn how the window's text begins
        self.read_offset = 0  # tokens before this have been emitted

    def _decode(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset :])
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return full_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        """At the end of a reply: whatever is left, replacement characters included."""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full_text[len(prefix_text) :]


class ReasoningSplitter:
    """Tags streamed text as reasoning or answer. The reply starts inside <think> (the prompt opened it);
    the first </think> switches to the answer, even when it arrives split across deltas. A stray leading
    <think> (models whose template did not open it) is dropped."""

    def __init__(self, in_reasoning: bool):
        self.in_reasoning = in_reasoning
        self._held = ""  # text that may be the start of </think> (or of a leading <think>)
        self._seen_text = False

    def feed(self, text: str) -> list[tuple[str, str]]:
        if not self.in_reasoning:
            return [("answer", text)] if text else []
        buf = self._held + text
        self._held = ""
        if not self._seen_text:
            stripped = buf.lstrip()
            if THINK_OPEN.startswith(stripped) and len(stripped) < len(THINK_OPEN):
                self._held = buf
                return []
            if stripped.startswith(THINK_OPEN):
                buf = stripped[len(THINK_OPEN) :]
                self._seen_text = True  # only one leading tag is dropped, however the deltas are cut
            else:
                self._seen_text = bool(buf)
        out: list[tuple[str, str]] = []
        idx = buf.find(THINK_CLOSE)
        if idx >= 0:
            if idx:
                out.append(("reasoning", buf[:idx]))
            self.in_reasoning = False
            rest = buf[idx + len(THINK_CLOSE) :]
            if rest:
                out.append(("answer", rest))
            return out
        # Hold back the longest suffix that could still become </think>.
        keep = 0
        for n in range(min(len(THINK_CLOSE) - 1, len(buf)), 0, -1):
            if THINK_CLOSE.startswith(buf[-n:]):
                keep = n
                break
        emit, self._held = buf[: len(buf) - keep], buf[len(buf) - keep :]
        if emit:
            out.append(("reasoning", emit))
        return out

    def flush(self) -> list[tuple[str, str]]:
        held, self._held = self._held, ""
        if held and self.in_reasoning:
            return [("reasoning", held)]
        return []


class AnswerNewlineTrimmer:
    """The model writes "</think>\n\n" before its answer; drop those newlines even when they come as
    separate deltas after the split."""

    def __init__(self):
        self.started = False

    def __call__(self, kind: str, text: str) -> str:
        if kind != "answer" or self.started:
            return text
        text = text.lstrip("\n")
        self.started = bool(text)
        return text
