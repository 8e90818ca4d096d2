"""Rendering of replies: markdown, code (pygments + copy), tables, links, math as images, reasoning blocks."""

from __future__ import annotations

import re

import pytest
from PySide6.QtCore import QUrl
from PySide6.QtGui import QGuiApplication, QTextDocument

from desktop.chatview import RichText
from desktop.markdown import GUESS_CHARS, MarkdownRenderer, code_lexer, split_math
from desktop.theme import DARK, LIGHT


@pytest.fixture
def renderer(qapp):
    return MarkdownRenderer(LIGHT, 15.0)


def test_math_is_cut_out_of_prose_but_not_code_or_prices():
    text = (
        "Cost $5 and $10. Area $\\pi r^2$, \\(a+b\\), `$x$` and\n```\n$y$\n```\n$$\\int_0^1 x\\,dx$$ "
        "\\[e^x\\] \\boxed{42}"
    )
    body, formulas = split_math(text)
    assert [f for f, _ in formulas] == ["\\pi r^2", "a+b", "\\int_0^1 x\\,dx", "e^x", "\\boxed{42}"]
    assert [d for _, d in formulas] == [False, False, True, True, False]
    assert "Cost $5 and $10." in body and "`$x$`" in body and "\n$y$\n" in body


def test_markdown_code_table_list_link_and_math(renderer):
    text = (
        "# Title\n\n- one\n- two\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n[docs](https://example.com)\n\n"
        "```python\ndef f(x):\n    return x\n```\n\nSo $x^2$ and $$\\frac{1}{2}$$ give \\boxed{7}."
    )
    out = renderer.render(text)
    html = out.html
    assert "<h1>Title</h1>" in html and "<li>one</li>" in html
    assert "<table" in html and "<td>2</td>" in html
    assert '<a href="https://example.com">docs</a>' in html
    assert 'href="copy:0"' in html and out.code_blocks == ["def f(x):\n    return x"]
    assert re.search(r'<span style="[^"]*color[^"]*">def</span>', html)  # highlighted by pygments
    imgs = re.findall(r'<img src="(math:[0-9a-f]+)"', html)
    assert len(imgs) == 3 and all(out.images[u].width() > 0 for u in imgs)
    assert "\\frac" not in html and "x^2" not in html  # rendered, not shown as source


def test_a_code_block_without_a_language_is_guessed_from_its_beginning_once(renderer):
    python = "import os\n\n" + "".join(f"def step_{i}(line):\n    return line.rsplit(' ', {i})\n\n" for i in range(40))
    assert len(python) > 3 * GUESS_CHARS
    streamed = [python[:n] for n in range(GUESS_CHARS, len(python), 37)]  # frames of a block still streaming
    lexers = [code_lexer(code, "") for code in streamed]
    assert all(lexer is lexers[0] for lexer in lexers)  # one guess served every frame
    assert code_lexer(python, "").name == "Python"
    # what comes after the guessed beginning doesn't change it (nor cost a guess), and the block is highlighted
    out = renderer.render("```\n" + python + "<html><body>" * 50 + "\n```")
    assert re.search(r'<span style="[^"]*color[^"]*">def</span>', out.html)
    assert code_lexer("x = 1", "") is None  # too short to guess: plain
    assert code_lexer(python, "no-such-language") is None


def test_raw_html_from_the_model_is_not_interpreted(renderer):
    assert "<script>" not in renderer.render("<script>alert(1)</script> **hi**").html


def test_unparseable_math_falls_back_to_source(renderer):
    html = renderer.render("Bad: $\\begin{pmatrix} 1 \\end{pmatrix}$ ok").html
    assert "<code>$\\begin{pmatrix} 1 \\end{pmatrix}$</code>" in html


def test_boxed_math_gets_a_frame(renderer):
    plain = renderer.render("$42$").images
    boxed = renderer.render("\\boxed{42}").images
    (p,), (b,) = plain.values(), boxed.values()
    assert b.width() > p.width() and b.height() > p.height()


def test_dark_theme_math_is_light_on_transparent(qapp):
    out = MarkdownRenderer(DARK, 15.0).render("$x$")
    (img,) = out.images.values()
    assert img.pixelColor(0, 0).alpha() == 0
    inked = [
        img.pixelColor(x, y)
        for x in range(img.width())
        for y in range(img.height())
        if img.pixelColor(x, y).alpha() > 200
    ]
    assert inked and all(c.lightness() > 150 for c in inked)


def test_rich_text_loads_math_images_and_copies_code(qtbot, renderer):
    view = RichText()
    qtbot.addWidget(view)
    view.resize(500, 100)
    view.set_rendered(renderer.render("Here $a^2$\n\n```\ncopy me\n```"), renderer.stylesheet())
    url = re.search(r'src="(math:[0-9a-f]+)"', view.toHtml()).group(1)
    assert not view.document().resource(QTextDocument.ImageResource, QUrl(url)).isNull()
    assert view.height() > 60  # grew to fit its text: the chat view scrolls, not this
    view.anchorClicked.emit(QUrl("copy:0"))
    assert QGuiApplication.clipboard().text() == "copy me"


def test_stored_messages_render_reasoning_folded_or_open(qtbot, make_window):
    win = make_window(start=False)
    win.chat.assistant_name = "R1"
    done = win.chat.add_message(
        {
            "id": 1,
            "role": "assistant",
            "content": "r</think>\n\na",
            "reasoning": "hmm $x$",
            "answer": "The answer is **4**.",
            "complete": True,
            "stats": {
                "thinking_s": 12.0,
                "finish_reason": "eos",
                "total_s": 14.0,
                "completion_tokens": 99,
                "decode_tok_s": 88.0,
            },
        }
    )
    assert done.reasoning_block.toggle.text() == "Thought for 12 s" and not done.reasoning_block.expanded()
    assert "The answer is 4." in done.body.toPlainText()
    assert done.meta.text() == "14 s · 99 tokens · 88 tok/s"
    never_closed = win.chat.add_message(
        {
            "id": 2,
            "role": "assistant",
            "content": "still thinking",
            "reasoning": "still thinking",
            "answer": "",
            "complete": True,
            "stats": {"thinking_s": 30.0, "finish_reason": "max_new_tokens"},
        }
    )
    block = never_closed.reasoning_block
    assert block.expanded() and "no answer (hit the token limit while thinking)" in block.toggle.text()
    assert "still thinking" in block.visible_text() and not never_closed.body.isVisible()
    crashed = win.chat.add_message(
        {
            "id": 3,
            "role": "assistant",
            "content": "half",
            "reasoning": "half",
            "answer": "",
            "complete": False,
            "stats": None,
        }
    )
    assert "interrupted" in crashed.reasoning_block.toggle.text() and crashed.meta.text() == "interrupted"
