"""The markdown/math renderer under random and pathological input: it never raises and never hangs.

Each render has a time bound far above what it needs (the slowest case here takes ~1.3 s on a 2-core CI
machine) and far below a hang: a regression to exponential parsing fails the bound instead of stalling CI."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from desktop.mathimg import render_png

BOUND_S = 15.0
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _render_bounded(renderer, text: str, quiet: bool = False):
    t0 = time.perf_counter()
    out = renderer.render(text, quiet=quiet)
    took = time.perf_counter() - t0
    assert took < BOUND_S, f"{took:.1f} s for {len(text)} characters"
    assert isinstance(out.html, str)
    return out


# Pieces that mean something to markdown, to the math extractor or to mathtext, and some that mean nothing.
markdownish = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "```",
                "```python\n",
                "~~~",
                "`",
                "$",
                "$$",
                "\\(",
                "\\)",
                "\\[",
                "\\]",
                "\\frac{",
                "\\boxed{",
                "{",
                "}",
                "[",
                "](",
                ")",
                "*",
                "_",
                "**",
                "#",
                "> ",
                "- ",
                "1. ",
                "|",
                "|---|",
                "\n",
                "\n\n",
                "    ",
                "<b>",
                "&amp;",
                "\\",
                "^",
                "_{",
                "\\sqrt{",
                "\\left(",
                "\\right)",
                "🙂",
                "漢字",
                "\u200b",
                "\x00",
                "\ufffd",
            ]
        ),
        st.text(max_size=8),
    ),
    max_size=80,
).map("".join)


@FUZZ
@given(text=markdownish, quiet=st.booleans())
def test_random_markdown_renders_without_raising(renderer, text, quiet):
    _render_bounded(renderer, text, quiet)


@FUZZ
@given(
    tex=st.lists(
        st.sampled_from(
            [
                "\\frac{",
                "}",
                "{",
                "x",
                "^",
                "_",
                "\\sqrt",
                "\\left(",
                "\\right)",
                "\\boxed{",
                "\\text{",
                "\\dfrac",
                "\\",
                "&",
                "\\\\",
                "\\begin{cases}",
                "2",
                " ",
                "\\alpha",
            ]
        ),
        max_size=40,
    ).map("".join)
)
def test_random_tex_renders_or_falls_back_to_source(tex):
    t0 = time.perf_counter()
    out = render_png(tex, "#000000", 14.0, 1.0)
    assert time.perf_counter() - t0 < BOUND_S
    assert out is None or (isinstance(out[0], bytes) and out[0][:4] == b"\x89PNG")


PATHOLOGICAL = {
    "unclosed fence": "text\n```python\n" + "x = 1\n" * 2000,
    "10,000 nested brackets": "[" * 10000 + "x" + "]" * 10000,
    "10,000 open parentheses": "(" * 10000,
    "10,000 nested braces in math": "$" + "{" * 10000 + "x" + "}" * 10000 + "$",
    "unbalanced braces in math": "$" + "{" * 10000 + "$",
    "200 KB reply": ("Some words here and there, with *emphasis* and `code`. " * 4000)[:200_000],
    "huge \\frac chain": "$$" + "\\frac{1}{" * 300 + "x" + "}" * 300 + "$$",
    "a \\frac chain mathtext can draw": "$" + "\\frac{1}{" * 12 + "x" + "}" * 12 + "$",
    "50,000 dollar signs": "$ " * 50000,
    "one 60,000-character line of $a": "$a" * 30000,
    "2,000 nested list levels": "".join("  " * i + "- item\n" for i in range(2000)),
    "5,000 nested quotes": ">" * 5000 + " x",
    "emphasis soup": "*_" * 20000,
    "3,000 nested \\boxed": "\\boxed{" * 3000 + "x" + "}" * 3000,
    "raw HTML": "<script>alert(1)</script>" * 2000,
    "5,000-row table": "|a|b|\n|---|---|\n" + "|1|2|\n" * 5000,
}


@pytest.mark.parametrize("name", PATHOLOGICAL)
def test_pathological_replies_render_in_bounded_time(renderer, name):
    out = _render_bounded(renderer, PATHOLOGICAL[name])
    assert "<script>" not in out.html  # model output is text, never markup


def test_a_200_kb_reply_streams_and_finishes_in_the_window(qtbot, make_window):
    """The whole GUI path, not only the renderer: a 200 KB reply streamed into the window then rendered whole."""
    from fakes import FakeEngine

    big = PATHOLOGICAL["200 KB reply"]
    engine = FakeEngine(reasoning="Thinking. " * 100, answer=big, token_s=0.0, tokens_per_delta=1)
    win = make_window(engine=engine, max_new_tokens=1_000_000)
    with qtbot.waitSignal(win.reply_finished, timeout=120000) as blocker:
        assert win.send("a long one")
    assert blocker.args[0]["answer"] == big
    assert win.chat.widget_for(blocker.args[0]["id"]).answer == big
