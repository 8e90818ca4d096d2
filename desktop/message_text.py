"""The text rules of the chat view, without widgets: where a growing reply is cut into pieces that are rendered
once (block_cut, soft_cut), and the lines that sum a reply up (reasoning_label, meta_text)."""

from __future__ import annotations

import re
from typing import NamedTuple

# The growing piece is re-rendered every frame; past these sizes it is cut (see soft_cut), so that rendering it
# stays a small part of a frame, highlighted code costing more a character than text.
TAIL_MAX_CHARS = 1500
TAIL_MAX_CODE_CHARS = 600


def open_fence(text: str, end: int) -> str | None:
    """The opening line of a code fence still open at `end` ("```python"), or None."""
    if text.count("```", 0, end) % 2 == 0:
        return None
    start = text.rfind("```", 0, end)
    line_end = text.find("\n", start, end)
    return text[start:line_end] if line_end != -1 else None


def soft_cut(text: str, start: int) -> int:
    """Where to cut a long growing block after `start` (index into text; `start` if nowhere): the last line
    break that starts an unindented, non-table line (any line break inside a code fence), else the last space.
    Never inside display math, whose halves would not render. O(len(text)) string scans, no copies."""
    end = len(text) - 1
    if text.count("$$", 0, end) % 2 or text.count("\\[", 0, end) != text.count("\\]", 0, end):
        return start
    fences_before = text.count("```", 0, start)
    pos = text.rfind("\n", start + 1, end)
    for _ in range(50):
        if pos <= start:
            break
        in_fence = (fences_before + text.count("```", start, pos + 1)) % 2 == 1
        nxt = text[pos + 1 : pos + 2]
        if in_fence or (nxt and nxt not in " \t|\n"):
            return pos + 1
        pos = text.rfind("\n", start + 1, pos)
    if (fences_before + text.count("```", start)) % 2:
        return start  # one long code line: leave it whole
    space = text.rfind(" ", start + 1, end)
    return space + 1 if space > start else start


_LIST_OR_INDENT = re.compile(r"[ \t]|\d+[.)][ \t]|[-*+][ \t]")


def block_cut(text: str, start: int) -> int:
    """End of the last finished top-level markdown block after `start`: a blank line followed by an unindented
    line that doesn't continue a list, with no code fence or display formula left open before it. Text up to
    the cut can be rendered once and never again; `start` if there is no such boundary yet."""
    cut = text.rfind("\n\n", start)
    while cut > start:
        nxt = text[cut + 2 : cut + 6].lstrip("\n")
        chunk = text[:cut]
        if (
            nxt
            and not _LIST_OR_INDENT.match(nxt)
            and chunk.count("```") % 2 == 0
            and chunk.count("$$") % 2 == 0
            and chunk.count("\\[") == chunk.count("\\]")
        ):
            return cut + 2
        cut = text.rfind("\n\n", start, cut)
    return start


def format_seconds(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def reasoning_label(stats: dict, has_answer: bool, complete: bool) -> str:
    thinking = stats.get("thinking_s")
    if has_answer:
        return f"Thought for {format_seconds(thinking)}" if thinking is not None else "Thoughts"
    reason = stats.get("finish_reason")
    why = {
        "max_new_tokens": "hit the token limit",
        "context_full": "the context is full",
        "cancelled": "stopped",
        "eos": "ended",
        "error": "stopped by an error",
    }.get(reason, "interrupted" if not complete else "")
    head = f"Thought for {format_seconds(thinking)}" if thinking is not None else "Reasoning"
    return f"{head} · no answer ({why} while thinking)" if why else f"{head} · no answer"


def meta_text(stats: dict, complete: bool) -> str:
    if not stats:
        return "" if complete else "interrupted"
    parts = []
    if stats.get("total_s") is not None:
        parts.append(format_seconds(stats["total_s"]))
    if stats.get("completion_tokens"):
        parts.append(f"{stats['completion_tokens']} tokens")
    if stats.get("decode_tok_s"):
        parts.append(f"{stats['decode_tok_s']:.0f} tok/s")
    reason = stats.get("finish_reason")
    if reason == "cancelled":
        parts.append("stopped")
    elif reason == "max_new_tokens":
        parts.append("token limit reached")
    elif reason == "context_full":
        parts.append("context full")
    elif reason == "error":  # kept as far as it got; the banner that said why is gone after a restart
        parts.append("stopped by an error")
    if stats.get("stopped_thinking"):
        parts.append("thinking cut short")
    if not complete:
        parts.append("interrupted")
    return " · ".join(parts)


class Pieces(NamedTuple):
    finished: list[str]  # markdown to render once, in order, and never again
    done: int  # how far into the text the finished pieces reach
    reopen: str  # a code fence's opening line the next piece starts with (a fence cut in two), or ""
    tail: str  # the growing rest, rendered again each frame ("" when there is none)


def next_pieces(text: str, done: int, reopen: str) -> Pieces:
    """A growing reply's text split for streaming: the pieces finished since `done` (what earlier calls had
    finished; `reopen` their open fence) and the tail. A finished top-level block becomes a piece (block_cut);
    a tail longer than TAIL_MAX_CHARS (TAIL_MAX_CODE_CHARS inside a code fence) is cut at a line or word
    (soft_cut), a fence cut in two closed in the first piece and opened again in the next."""
    finished = []
    cut = block_cut(text, done)
    if cut > done:
        finished.append(reopen + text[done:cut].strip("\n"))
        done, reopen = cut, ""
    rest = text[done:].strip("\n")
    if len(rest) > (TAIL_MAX_CODE_CHARS if open_fence(text, len(text)) else TAIL_MAX_CHARS):
        cut = soft_cut(text, done)
        if cut > done:
            fence = open_fence(text, cut)
            finished.append(reopen + text[done:cut].strip("\n") + ("\n```" if fence else ""))
            done, reopen = cut, (fence + "\n" if fence else "")
            rest = text[done:].strip("\n")
    return Pieces(finished, done, reopen, reopen + rest if rest else "")
