"""Reply text -> HTML for QTextDocument: markdown-it-py for structure, pygments for code, mathtext for math.

Math is cut out *before* markdown parsing (markdown would eat the backslashes and underscores of LaTeX) and
replaced by inert placeholders; code spans and fences are left alone so `$x$` inside code stays code.
Raw HTML in model output is not interpreted (html=False): a reply is text, never markup we trust.
QTextDocument understands a subset of HTML/CSS, so code blocks and tables are emitted as attribute-styled
tables, which it renders reliably.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from functools import lru_cache

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name, guess_lexer
from pygments.util import ClassNotFound

from desktop.mathimg import PENDING, _balanced, render_image
from desktop.theme import Theme

# Code (fenced or inline) is protected from math extraction. An unclosed fence runs to the end of the text,
# which is what a streaming reply looks like mid-block.
_CODE = re.compile(r"(^[ \t]*(`{3,}|~{3,})[^\n]*\n.*?(?:^[ \t]*\2[ \t]*$|\Z)|`[^`\n]+`)", re.M | re.S)
_MATH = re.compile(
    r"\$\$(?P<d1>.+?)\$\$"
    r"|\\\[(?P<d2>.+?)\\\]"
    r"|\\\((?P<i1>.+?)\\\)"
    # $...$: not a price. No space just inside the dollars, no digit right after the closing one.
    r"|(?<![\\$\w])\$(?P<i2>[^\s$](?:[^$\n]*?[^\s$\\])?)\$(?!\d)",
    re.S,
)
_BOXED = re.compile(r"\\boxed\s*\{")
_PLACEHOLDER = re.compile(r"R1MATH(\d+)Z")


# Languages whose pygments lexers are loaded and compiled before the first reply (prewarm_rendering).
WARM_LANGUAGES = (
    "python",
    "bash",
    "javascript",
    "typescript",
    "c",
    "cpp",
    "java",
    "rust",
    "go",
    "json",
    "sql",
    "html",
    "latex",
    "text",
)


# guess_lexer runs every lexer's analyse_text over what it is given, on the GUI thread with the GIL held: the
# longer the text the longer it takes, and mixed-script text can take more than a frame. A code block without a
# language that is still streaming is rendered again every frame, so the guess reads only the block's first
# GUESS_CHARS characters, cut to a multiple of GUESS_STEP, and is remembered: a growing block is guessed a few
# times, not once per frame (the decode thread waits for the GIL meanwhile).
GUESS_CHARS = 400
GUESS_STEP = 100
PLAIN_UNDER = 41  # characters: a shorter block without a language is left plain (too little to guess from)


@lru_cache(maxsize=256)
def _guessed_lexer(head: str):
    try:
        return guess_lexer(head)
    except ClassNotFound:
        return None


@lru_cache(maxsize=64)
def _named_lexer(lang: str):
    try:
        return get_lexer_by_name(lang)
    except ClassNotFound:
        return None


def code_lexer(code: str, lang: str):
    """The pygments lexer for a fenced block: by its language, else guessed from its beginning; None: plain."""
    if lang:
        return _named_lexer(lang)
    if len(code) < PLAIN_UNDER:
        return None
    return _guessed_lexer(code[: max(GUESS_STEP, min(GUESS_CHARS, len(code)) // GUESS_STEP * GUESS_STEP)])


def warm_up_highlighting() -> None:
    """Import all of pygments' lexers (guess_lexer does, slowly the first time) and compile the common ones
    (each slow the first time), so the first code block of a reply doesn't freeze a frame."""
    formatter = HtmlFormatter(nowrap=True, noclasses=True)
    guess_lexer("def f(x):\n    return x\n")
    for lang in WARM_LANGUAGES:
        try:
            highlight("x = 1\n", get_lexer_by_name(lang), formatter)
        except ClassNotFound:
            pass


def prewarm_rendering() -> None:
    """Off the GUI thread, at start: matplotlib's math fonts and pygments' lexers (desktop.mathimg's thread)."""
    from desktop.mathimg import prewarm_in_background, run_on_math_thread

    prewarm_in_background()
    run_on_math_thread(warm_up_highlighting)


@dataclass
class Rendered:
    html: str
    code_blocks: list[str] = field(default_factory=list)  # for the Copy links: href "copy:<index>"
    images: dict[str, object] = field(default_factory=dict)  # "math:<n>" -> QImage, for loadResource
    pending_math: bool = False  # some formulas show as source until the math thread has drawn them


def split_math(text: str) -> tuple[str, list[tuple[str, bool]]]:
    """Replace math with R1MATH<n>Z placeholders; returns (text, [(tex, display)])."""
    formulas: list[tuple[str, bool]] = []

    def take(tex: str, display: bool) -> str:
        formulas.append((tex, display))
        return f"R1MATH{len(formulas) - 1}Z"

    def in_prose(seg: str) -> str:
        def on_math(m: re.Match) -> str:
            if m.group("d1") is not None or m.group("d2") is not None:
                return take(m.group("d1") if m.group("d1") is not None else m.group("d2"), True)
            return take(m.group("i1") if m.group("i1") is not None else m.group("i2"), False)

        seg = _MATH.sub(on_math, seg)
        out, pos = [], 0  # a bare \boxed{...} outside any delimiters is still math
        for m in _BOXED.finditer(seg):
            if m.start() < pos:
                continue
            inner, end = _balanced(seg, m.end())
            if inner is None:
                continue
            out.append(seg[pos : m.start()])
            out.append(take(seg[m.start() : end], False))
            pos = end
        out.append(seg[pos:])
        return "".join(out)

    parts, pos = [], 0
    for m in _CODE.finditer(text):
        parts.append(in_prose(text[pos : m.start()]))
        parts.append(m.group(0))
        pos = m.end()
    parts.append(in_prose(text[pos:]))
    return "".join(parts), formulas


class MarkdownRenderer:
    """One per theme and font size; render() is pure apart from the math image cache."""

    def __init__(self, theme: Theme, font_px: float, dpr: float = 1.0, mono: str = "monospace", math_wait: bool = True):
        """math_wait=False (the window): formulas not drawn yet come out as their source and the Rendered says
        pending_math; render again after desktop.mathimg.math_ready_signal() fires."""
        self.theme, self.font_px, self.dpr, self.mono = theme, font_px, dpr, mono
        self.math_wait = math_wait
        self._formatter = HtmlFormatter(nowrap=True, noclasses=True, style=theme.pygments)
        from PySide6.QtGui import QFont, QFontMetricsF
        from PySide6.QtWidgets import QApplication

        font = QFont(QApplication.font())
        font.setPixelSize(max(1, round(font_px)))
        self.x_height = QFontMetricsF(font).xHeight()  # for putting math baselines on the text baseline
        self.md = MarkdownIt("commonmark", {"html": False, "breaks": False}).enable(["table", "strikethrough"])
        # markdown-it binds render rules to its renderer, so route through a closure to reach self.
        rule = lambda _renderer, tokens, idx, options, env: self._fence(tokens, idx, options, env)  # noqa: E731
        self.md.add_render_rule("fence", rule)
        self.md.add_render_rule("code_block", rule)

    def stylesheet(self, quiet: bool = False) -> str:
        t = self.theme
        color = t.faint if quiet else t.text
        return (
            f"body {{ color: {color}; }}"
            f"a {{ color: {t.accent}; text-decoration: none; }}"
            f"code {{ font-family: {self.mono}; background-color: {t.code_bg}; }}"
            f"pre {{ font-family: {self.mono}; }}"
            f"th {{ background-color: {t.code_header}; font-weight: 600; }}"
            f"h1, h2, h3, h4 {{ margin-top: 10px; margin-bottom: 4px; }}"
            f"blockquote {{ color: {t.muted}; }}"
            f"p, li {{ margin-top: 3px; margin-bottom: 3px; }}"
        )

    def render(self, text: str, quiet: bool = False) -> Rendered:
        body, formulas = split_math(text)
        env = {"code": []}
        out = self.md.render(body, env)
        out = out.replace(
            "<table>",
            f'<table border="1" cellspacing="0" cellpadding="6" width="100%" '
            f'style="border-collapse: collapse; border-color: {self.theme.border};">',
        )
        result = Rendered("", env["code"])
        color = self.theme.faint if quiet else self.theme.text
        # mathtext's italic letters come out a little smaller than the body font's: scale up to match.
        size = self.font_px * (0.91 if quiet else 1.0) * 1.08

        def image_html(n: int) -> str:
            tex, display = formulas[n]
            img = render_image(
                tex,
                color,
                size * (1.1 if display else 1.0),
                self.dpr,
                self.x_height * (0.91 if quiet else 1.0),
                wait=self.math_wait,
            )
            if img is PENDING:
                result.pending_math = True
                img = None
            if img is None:  # mathtext can't parse it (or hasn't yet): show the source rather than nothing
                src = f"$${tex}$$" if display else f"${tex}$"
                return f"<code>{html.escape(src)}</code>"
            # The URL names the image's content: QTextDocument caches resources by URL across setHtml calls.
            url = f"math:{abs(hash((tex, display, color, size, self.dpr))):x}"
            result.images[url] = img
            w, h = round(img.width() / self.dpr), round(img.height() / self.dpr)
            return f'<img src="{url}" width="{w}" height="{h}" align="middle" />'

        # A display formula alone in its paragraph is centred like LaTeX would.
        out = re.sub(
            r"<p>\s*R1MATH(\d+)Z\s*</p>",
            lambda m: (
                f'<p align="center">{image_html(int(m.group(1)))}</p>' if formulas[int(m.group(1))][1] else m.group(0)
            ),
            out,
        )
        out = _PLACEHOLDER.sub(lambda m: image_html(int(m.group(1))), out)
        result.html = out
        return result

    def _fence(self, tokens, idx, options, env):
        tok = tokens[idx]
        code = tok.content.rstrip("\n")
        lang = (tok.info or "").strip().split(" ")[0] if tok.type == "fence" else ""
        env["code"].append(code)
        n = len(env["code"]) - 1
        lexer = code_lexer(code, lang)
        if lexer is not None:
            body = highlight(code, lexer, self._formatter).rstrip("\n")
        else:
            body = html.escape(code)
        t = self.theme
        label = html.escape(lang or "code")
        return (
            f'<table width="100%" cellspacing="0" cellpadding="0" border="0" bgcolor="{t.code_bg}" '
            f'style="margin-top: 6px; margin-bottom: 8px;">'
            f'<tr><td bgcolor="{t.code_header}" style="padding: 4px 10px; color: {t.muted};">'
            f'<span style="font-size: small;">{label}</span></td>'
            f'<td bgcolor="{t.code_header}" align="right" style="padding: 4px 10px;">'
            f'<a href="copy:{n}" style="font-size: small;">Copy</a></td></tr>'
            f'<tr><td colspan="2" style="padding: 8px 12px;">'
            f'<pre style="margin: 0; white-space: pre-wrap; font-family: {self.mono};">{body}</pre></td></tr></table>\n'
        )
