"""desktop.api.schema.StopMatcher: the API's stop strings in streamed answer text, without a server. Text that
could still become a stop string is held back, nothing past a stop string is ever sent, and a stream without one
loses nothing."""

from __future__ import annotations

import pytest

from desktop.api.schema import StopMatcher


def stream(matcher: StopMatcher, pieces: list[str]) -> list[str]:
    """What goes out for each piece fed, and the flush at the end."""
    return [matcher.feed(p) for p in pieces] + [matcher.flush()]


def test_without_stop_strings_every_piece_goes_out_as_it_comes():
    m = StopMatcher([])
    assert stream(m, ["Hello", " world", ""]) == ["Hello", " world", "", ""]
    assert not m.hit


def test_empty_stop_strings_are_ignored():
    m = StopMatcher(["", ""])
    assert m.stops == []
    assert stream(m, ["a", "b"]) == ["a", "b", ""]


def test_the_text_before_a_stop_string_goes_out_and_nothing_after_it():
    m = StopMatcher(["STOP"])
    assert m.feed("one two STOP three") == "one two "
    assert m.hit
    assert m.feed(" four") == ""
    assert m.flush() == ""


def test_a_stop_string_that_appears_twice_ends_the_text_at_its_first_occurrence():
    m = StopMatcher(["STOP"])
    assert m.feed("one STOP two STOP three") == "one "


def test_a_stop_string_split_across_pieces_is_held_back_then_dropped():
    m = StopMatcher(["STOP"])
    assert m.feed("abc ST") == "abc "  # "ST" could be the start of "STOP"
    assert m.held == "ST"
    assert m.feed("O") == ""
    assert m.feed("P and more") == ""
    assert m.hit and m.flush() == ""


def test_held_text_that_turns_out_not_to_be_a_stop_string_goes_out():
    m = StopMatcher(["STOP"])
    assert m.feed("abc STO") == "abc "
    assert m.feed("RM") == "STORM"
    assert not m.hit and m.held == ""


def test_held_text_at_the_end_of_the_stream_is_flushed():
    m = StopMatcher(["STOP"])
    assert stream(m, ["the end S"]) == ["the end ", "S"]
    assert m.held == ""


def test_the_earliest_of_several_stop_strings_ends_the_text():
    m = StopMatcher(["world", "lo"])
    assert m.feed("hello world") == "hel"


@pytest.mark.parametrize(
    "stops, piece, sent, held",
    [
        (["abcd"], "xxabc", "xx", "abc"),  # the longest prefix that fits
        (["abcd", "cz"], "xxabc", "xx", "abc"),  # the longest over all the stop strings
        (["cz", "abcd"], "xxabc", "xx", "abc"),  # whatever their order
        (["ab"], "b", "b", ""),  # a stop string's end is not its start
        (["aab"], "xa", "x", "a"),
        (["aab"], "aa", "", "aa"),  # all of it may be held
        (["abc"], "ab", "", "ab"),
    ],
)
def test_only_a_possible_start_of_a_stop_string_is_held(stops, piece, sent, held):
    m = StopMatcher(stops)
    assert m.feed(piece) == sent
    assert m.held == held
    assert not m.hit
