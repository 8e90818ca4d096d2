"""The text path under random input (hypothesis): streaming detokenizer, reasoning splitter, answer trimmer.

Whatever the model emits (random ids, partial UTF-8, <think>/</think> split anywhere, repeated or stray tags)
they never raise, and how the stream is cut into deltas never changes what comes out."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from model_loader.chat import AnswerNewlineTrimmer, ReasoningSplitter, StreamingDetokenizer
from model_loader.tokenizer import load_tokenizer

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return load_tokenizer(tiny_model)


# Ids the model can emit: any of the byte-level BPE (partial UTF-8 included), the special tokens, and the
# padding rows past the tokenizer's end that a random or broken model can still sample.
token_ids = st.lists(
    st.one_of(
        st.integers(0, 151_935), st.sampled_from([151643, 151648, 151649, 151644, 151645]), st.integers(0, 300)
    ),  # low ids are single bytes: split characters are likely
    max_size=120,
)


@FUZZ
@given(ids=token_ids)
def test_detokenizer_never_raises_and_never_emits_a_broken_character_mid_stream(tokenizer, ids):
    detok = StreamingDetokenizer(tokenizer)
    pieces = [detok.add(i) for i in ids]
    for piece in pieces:
        assert isinstance(piece, str) and not piece.endswith("\ufffd")
    tail = detok.flush()
    assert isinstance(tail, str)
    assert detok.flush() == ""  # nothing is emitted twice


def _split(chunks: list[str], in_reasoning: bool = True) -> tuple[str, str, bool]:
    splitter, trim = ReasoningSplitter(in_reasoning), AnswerNewlineTrimmer()
    out = {"reasoning": [], "answer": []}
    for chunk in chunks:
        for kind, text in splitter.feed(chunk):
            assert kind in out and text  # never an empty delta
            out[kind].append(trim(kind, text))
    for kind, text in splitter.flush():
        out[kind].append(trim(kind, text))
    return "".join(out["reasoning"]), "".join(out["answer"]), splitter.in_reasoning


tag_soup = st.lists(
    st.one_of(
        st.sampled_from(
            ["<think>", "</think>", "<", "</", "</th", "think>", ">", "\n", "\n\n", " ", "</think", "<think", "/"]
        ),
        st.text(max_size=12),
    ),
    max_size=40,
).map("".join)


@FUZZ
@given(text=tag_soup, cuts=st.lists(st.integers(0, 400), max_size=30), in_reasoning=st.booleans())
def test_reasoning_split_does_not_depend_on_where_the_deltas_are_cut(text, cuts, in_reasoning):
    points = sorted({c for c in cuts if 0 < c < len(text)})
    chunks = [text[a:b] for a, b in zip([0] + points, points + [len(text)])]
    whole = _split([text], in_reasoning)
    assert _split(chunks, in_reasoning) == whole
    assert _split(list(text), in_reasoning) == whole  # one character per delta: every split point at once
    reasoning, answer, still_thinking = whole
    if in_reasoning and "</think>" in text:
        assert not still_thinking
        # everything after the first close tag is the answer (leading newlines trimmed), tags included
        assert answer == text.split("</think>", 1)[1].lstrip("\n") or answer == ""
    if not in_reasoning:
        assert reasoning == "" and answer == text.lstrip("\n")


@FUZZ
@given(ids=token_ids, cuts=st.lists(st.integers(0, 120), max_size=20))
def test_token_stream_to_reasoning_and_answer_never_raises(tokenizer, ids, cuts):
    """The whole per-token path the engine runs: ids -> detokenizer -> splitter -> trimmer."""
    detok, splitter, trim = StreamingDetokenizer(tokenizer), ReasoningSplitter(True), AnswerNewlineTrimmer()
    for i in ids:
        for kind, text in splitter.feed(detok.add(i)):
            assert isinstance(trim(kind, text), str)
    for kind, text in splitter.feed(detok.flush()) + splitter.flush():
        assert isinstance(trim(kind, text), str)
