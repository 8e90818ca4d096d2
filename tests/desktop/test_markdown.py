"""Reply text -> HTML (desktop.markdown): math cut out of prose but not code, markdown, code (pygments + copy),
tables, links, math as images or as its source where it can't be drawn, raw HTML left as text. The widgets that
show it: test_chatview; the math images themselves: test_mathimg; random input: test_markdown_fuzz."""

from __future__ import annotations

import re


from desktop.markdown import GUESS_CHARS, code_lexer, split_math


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
