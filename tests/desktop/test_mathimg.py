"""Math as images (desktop.mathimg, through the renderer as a reply meets it): \\boxed gets its frame, and
the dark theme's math is light ink on a transparent background. Random TeX: test_markdown_fuzz.py."""

from __future__ import annotations

from desktop.markdown import MarkdownRenderer
from desktop.theme import DARK


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
