"""LaTeX math -> PNG images with matplotlib's mathtext (no TeX install, no web engine).

mathtext covers what R1 writes most (fractions, roots, sums, Greek, sub/superscripts). What it cannot parse
comes back as None and the caller shows the source in a code span instead: never a crash, never a blank.
Results are cached by (tex, color, size, dpr) because a streaming reply re-renders the same formulas every frame.
"""

from __future__ import annotations

import io
import re
from functools import lru_cache

from PySide6.QtGui import QImage

# Commands R1 uses that mathtext does not know, mapped to ones it does.
_REPLACEMENTS = [
    (r"\dfrac", r"\frac"), (r"\tfrac", r"\frac"), (r"\displaystyle", ""), (r"\textstyle", ""),
    (r"\limits", ""), (r"\nolimits", ""), (r"\left.", ""), (r"\right.", ""), (r"\textbf", r"\mathbf"),
    (r"\mathrm{d}", r"d"), (r"\lvert", "|"), (r"\rvert", "|"), (r"\lVert", r"\Vert"), (r"\rVert", r"\Vert"),
    (r"\le ", r"\leq "), (r"\ge ", r"\geq "), (r"\dots", r"\ldots"), (r"\cdotp", r"\cdot"), (r"\tag", r"\quad"),
]
_BOXED = re.compile(r"\\boxed\s*\{")


def normalize(tex: str) -> tuple[str, bool]:
    """Returns (mathtext source, boxed). \\boxed{x} has no mathtext equivalent: we draw the box ourselves."""
    tex = tex.strip()
    boxed = False
    m = _BOXED.search(tex)
    if m:
        inner, end = _balanced(tex, m.end())
        if inner is not None:
            tex = tex[: m.start()] + inner + tex[end:]
            boxed = True
    for a, b in _REPLACEMENTS:
        tex = tex.replace(a, b)
    tex = re.sub(r"\\text\s*\{([^{}]*)\}", lambda mm: r"\mathrm{" + mm.group(1).replace(" ", r"\ ") + "}", tex)
    tex = re.sub(r"\\operatorname\s*\{([^{}]*)\}", r"\\mathrm{\1}", tex)
    return " ".join(tex.split()), boxed


def _balanced(text: str, start: int) -> tuple[str | None, int]:
    """Content of a {...} group whose opening brace is just before `start`; (None, start) if unbalanced."""
    depth = 1
    i = start
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start:i], i + 1
        i += 1
    return None, start


@lru_cache(maxsize=512)
def render_png(tex: str, color: str, font_px: float, dpr: float) -> tuple[bytes, bool] | None:
    """PNG bytes of the formula (drawn at dpr x scale), plus whether it is boxed; None if mathtext fails."""
    source, boxed = normalize(tex)
    if not source:
        return None
    from matplotlib import mathtext  # lazy: a few hundred ms, only paid when a reply contains math
    from matplotlib.font_manager import FontProperties

    buf = io.BytesIO()
    try:
        # font size in points at dpi 72 * dpr == font_px logical pixels at the screen's pixel ratio
        prop = FontProperties(size=font_px, math_fontfamily="dejavusans")
        mathtext.math_to_image(f"${source}$", buf, prop=prop, dpi=72 * dpr, format="png", color=color)
    except Exception:  # ValueError for a parse error; anything else is also "show the source instead"
        return None
    return buf.getvalue(), boxed


def render_image(tex: str, color: str, font_px: float, dpr: float) -> QImage | None:
    got = render_png(tex, color, font_px, dpr)
    if got is None:
        return None
    png, boxed = got
    img = QImage.fromData(png, "PNG")
    if img.isNull():
        return None
    if boxed:
        img = _draw_box(img, color, dpr)
    img.setDevicePixelRatio(dpr)
    return img


def _draw_box(img: QImage, color: str, dpr: float) -> QImage:
    from PySide6.QtCore import QRectF, Qt
    from PySide6.QtGui import QColor, QPainter, QPen

    pad = int(5 * dpr)
    out = QImage(img.width() + 2 * pad, img.height() + 2 * pad, QImage.Format_ARGB32_Premultiplied)
    out.fill(Qt.transparent)
    p = QPainter(out)
    p.setRenderHint(QPainter.Antialiasing)
    p.drawImage(pad, pad, img)
    pen = QPen(QColor(color))
    pen.setWidthF(1.2 * dpr)
    p.setPen(pen)
    p.drawRoundedRect(QRectF(1, 1, out.width() - 2, out.height() - 2), 3 * dpr, 3 * dpr)
    p.end()
    return out
