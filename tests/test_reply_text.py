"""One reply's token ids -> its text events and its stored text (model_loader.reply_text.ReplyText), with the
tiny model's real tokenizer: split into reasoning and answer at </think>, the answer's leading blank line dropped
(kept for a raw completion), stop tokens counted but never text, and a character cut across tokens held back
until it is whole."""

import pytest

from model_loader.events import Delta
from model_loader.reply_text import ReplyText
from model_loader.tokenizer import load_tokenizer

STOP = 151643  # <｜end▁of▁sentence｜>


@pytest.fixture(scope="module")
def tok(tiny_model):
    return load_tokenizer(tiny_model)


def _run(reply: ReplyText, ids: list[int]) -> list[Delta]:
    deltas = []
    for token_id in ids:
        deltas += reply.add(token_id)
    return deltas + reply.flush()


def test_a_reply_that_reasons_then_answers(tok):
    user = tok.encode("<｜User｜>")[0]  # a stop token that decodes as text (not "special")
    ids = tok.encode("Two and two.</think>\n\nIt is 4.") + [user]
    reply = ReplyText(tok, {STOP, user}, in_reasoning=True)
    deltas = _run(reply, ids)
    assert "".join(d.text for d in deltas if d.kind == "reasoning") == reply.reasoning == "Two and two."
    assert "".join(d.text for d in deltas if d.kind == "answer") == reply.answer == "It is 4."
    assert reply.text == "Two and two.</think>\n\nIt is 4."
    assert reply.tokens == len(ids)  # the stop token counts, but is no text
    think_close = ids.index(tok.encode("</think>")[0])
    assert reply.reasoning_tokens == think_close + 1  # the closing tag belongs to the reasoning
    assert not reply.in_reasoning
    counts = [d.token_count for d in deltas]
    assert counts == sorted(counts) and counts[-1] <= len(ids) - 1  # tokens behind each text so far


def test_a_reply_cut_off_in_its_reasoning_is_stored_without_the_tag(tok):
    reply = ReplyText(tok, {STOP}, in_reasoning=True)
    _run(reply, tok.encode("Still thinking"))
    assert reply.in_reasoning and reply.answer == ""
    assert reply.text == reply.reasoning == "Still thinking"
    closed = ReplyText(tok, {STOP}, in_reasoning=True)
    _run(closed, tok.encode("Done.</think>"))  # closed, no answer yet: the tag is kept
    assert closed.text == "Done.</think>\n\n"


def test_text_held_back_as_a_possible_tag_comes_out_at_the_end(tok):
    reply = ReplyText(tok, {STOP}, in_reasoning=True)
    held = [d.text for token_id in tok.encode("Almost </") for d in reply.add(token_id)]
    assert "".join(held) == "Almost "  # "</" may begin </think>
    assert [(d.kind, d.text) for d in reply.flush()] == [("reasoning", "</")]
    assert reply.reasoning == reply.text == "Almost </"


def test_a_reply_without_reasoning_is_all_answer(tok):
    reply = ReplyText(tok, {STOP}, in_reasoning=False)
    deltas = _run(reply, tok.encode("\n\nHello there") + [STOP])
    assert {d.kind for d in deltas} == {"answer"}
    assert reply.text == reply.answer == "Hello there" and reply.reasoning_tokens == 0


def test_a_raw_completion_keeps_its_leading_newlines(tok):
    reply = ReplyText(tok, {STOP}, in_reasoning=False, verbatim=True)
    _run(reply, tok.encode("\n\nHello"))
    assert reply.text == "\n\nHello"


def test_a_character_cut_across_tokens_comes_whole(tok):
    ids = tok.encode("a🫠b")
    assert len(ids) == 5  # the emoji is three byte-level tokens, none of them a character by itself
    reply = ReplyText(tok, {STOP}, in_reasoning=False)
    texts = [[d.text for d in reply.add(token_id)] for token_id in ids] + [[d.text for d in reply.flush()]]
    assert "".join(sum(texts, [])) == "a🫠b" and "\ufffd" not in "".join(sum(texts, []))
    assert texts[1] == texts[2] == []  # held back until the third piece completes it
