"""The chat view's text rules without widgets (desktop.message_text): where a growing reply is cut into pieces
rendered once, and the lines that sum a reply up."""

from desktop.message_text import (
    TAIL_MAX_CHARS,
    TAIL_MAX_CODE_CHARS,
    block_cut,
    meta_text,
    next_pieces,
    reasoning_label,
    soft_cut,
)


def test_a_block_is_finished_at_a_blank_line_before_an_unindented_line():
    text = "First paragraph.\n\nSecond, still growing"
    assert block_cut(text, 0) == text.index("Second")
    assert block_cut("Only one paragraph so far", 0) == 0


def test_no_block_ends_inside_a_list_a_code_fence_or_display_math():
    assert block_cut("Items:\n\n- one\n\n- two", 0) == 0  # the list goes on past its blank lines
    listed = "Items:\n\n- one\n\n- two\n\nAfter the list"
    assert block_cut(listed, 0) == listed.index("After")
    assert block_cut("```python\nx = 1\n\ny = 2", 0) == 0  # the fence is still open
    assert block_cut("$$\na\n\nb", 0) == 0
    assert block_cut("\\[\na\n\nb", 0) == 0
    closed = "```\ncode\n```\n\nAfter"
    assert block_cut(closed, 0) == closed.index("After")


def test_a_long_block_is_cut_at_a_line_then_at_a_word_never_in_display_math():
    text = "line one\nline two\n  indented\ngrowing"
    assert soft_cut(text, 0) == text.index("growing")  # the last break before an unindented line
    assert soft_cut("no breaks here but spaces", 0) == len("no breaks here but ")
    assert soft_cut("$$ a formula\nthat is open", 0) == 0
    assert soft_cut("```\n" + "x" * 50, 4) == 4  # one long code line stays whole
    code = "```\na = 1\n    b = 2\nc"
    assert soft_cut(code, 0) == code.index("c")  # inside a fence any line break will do


def stream(text: str, step: int = 7) -> list[str]:
    """The finished pieces of `text` as streaming would make them, `step` characters a frame, and the tail."""
    done, reopen, pieces, tail = 0, "", [], ""
    for end in range(step, len(text) + step, step):
        cuts = next_pieces(text[:end], done, reopen)
        pieces += cuts.finished
        done, reopen, tail = cuts.done, cuts.reopen, cuts.tail
    return pieces + ([tail] if tail else [])


def test_streamed_pieces_each_render_alone_and_together_hold_the_whole_text():
    code = "\n".join(f"    value_{i} = compute({i})  # a line of a long listing" for i in range(40))
    words = " ".join(f"word{i}" for i in range(500))  # a paragraph with no line break
    text = f"Intro paragraph.\n\n```python\n{code}\n```\n\n{words}\n\nThe end."
    assert len(code) > TAIL_MAX_CODE_CHARS and len(words) > TAIL_MAX_CHARS
    pieces = stream(text)
    assert len(pieces) > 4  # the listing and the paragraph were both cut while they grew
    for piece in pieces:
        assert piece.count("```") % 2 == 0, piece  # a fence cut in two is closed and opened again
    joined = "\n".join(pieces)
    for line in code.split("\n"):
        assert joined.count(line) == 1  # every line once, nothing lost or repeated
    assert [w for w in joined.split() if w.startswith("word")] == words.split()
    assert pieces[-1] == "The end."


def test_the_lines_that_sum_a_reply_up():
    stats = {"total_s": 12.3, "completion_tokens": 40, "decode_tok_s": 123.4, "finish_reason": "max_new_tokens"}
    assert meta_text(stats, complete=True) == "12 s · 40 tokens · 123 tok/s · token limit reached"
    assert (
        meta_text({"total_s": 2.25, "stopped_thinking": True}, complete=False)
        == "2.2 s · thinking cut short · interrupted"
    )
    assert meta_text({}, complete=False) == "interrupted"
    assert reasoning_label({"thinking_s": 3.21}, has_answer=True, complete=True) == "Thought for 3.2 s"
    assert (
        reasoning_label({"thinking_s": 3.21, "finish_reason": "context_full"}, has_answer=False, complete=True)
        == "Thought for 3.2 s · no answer (the context is full while thinking)"
    )
    assert reasoning_label({}, has_answer=False, complete=False) == "Reasoning · no answer (interrupted while thinking)"
