"""The majority vote's answer extraction and grouping (model_loader.vote) on scripted chains."""

import pytest

from model_loader.vote import extract_answer, last_boxed, normalize, vote


def test_the_last_boxed_answer_is_taken_with_nested_braces():
    assert last_boxed(r"first \boxed{1}, then \boxed{\frac{a}{b}} done") == r"\frac{a}{b}"
    assert last_boxed(r"cut off \boxed{\frac{1}{2") is None
    assert extract_answer("So the answer is\n\n**42**\n") == "**42**"
    assert extract_answer("Thus \\boxed{7}.\n\nI hope this helps!") == "7"
    assert extract_answer("") is None


@pytest.mark.parametrize(
    "forms, key",
    [
        ([r"\frac{3}{4}", "3/4", "0.75", r"$\dfrac{6}{8}$.", r"\tfrac34"], "3/4"),
        (["1,000", "1000.0", "1000", r"\text{1000}", "$1000$"], "1000"),
        (["x = 5", "5", "The answer is 5.", r"5^\circ", "5%"], "5"),
        ([r"-\frac{1}{2}", "-0.5", "-1/2"], "-1/2"),
        ([r"2\sqrt{3}", r"2 \sqrt{3}", r"2\sqrt{3}."], "2sqrt3"),
    ],
)
def test_equal_answers_written_differently_normalise_alike(forms, key):
    assert {normalize(f) for f in forms} == {key}


def test_different_answers_stay_apart():
    assert len({normalize(x) for x in ["3/4", "4/3", "0.7", r"\frac{3}{5}", "34"]}) == 5


def test_the_majority_wins_with_its_support_and_every_chain_kept():
    answers = [
        r"So \boxed{42}.",
        "Final answer: 41",
        r"\boxed{42.0}",
        r"\boxed{\frac{84}{2}}",
        "",
        r"hence \boxed{41}",
        r"\boxed{42}",
        "Therefore the result is 42.",
    ]
    result = vote(answers)
    assert result.winner.key == "42"
    assert result.winner.display == "42"
    assert result.winner.chains == [0, 2, 3, 6, 7]
    assert result.answers[4] is None
    assert [g.key for g in result.groups] == ["42", "41"]
    assert result.summary() == "5 of 8 chains agree: 42"


def test_a_tie_goes_to_the_answer_reached_first_and_no_answer_is_said():
    assert vote([r"\boxed{2}", r"\boxed{1}", r"\boxed{1}", r"\boxed{2}"]).winner.key == "2"
    empty = vote(["", "   "])
    assert empty.winner is None and empty.summary() == "none of the 2 chains gave an answer"
    assert vote([r"\boxed{9}"]).summary() == "1 of 1 chain agrees: 9"
