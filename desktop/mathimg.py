"""LaTeX math -> PNG images with matplotlib's mathtext (no TeX install, no web engine).

mathtext covers what R1 writes most (fractions, roots, sums, Greek, sub/superscripts). What it cannot parse
comes back as None and the caller shows the source in a code span instead: never a crash, never a blank.
Results are cached by (tex, color, size, dpr) because a streaming reply re-renders the same formulas every frame.

Drawing a formula with mathtext (pyparsing + Agg) takes far more than a frame, so the window never draws
one on the GUI thread: `render_image(..., wait=False)` returns PENDING for a formula not drawn yet and queues
it for the one math thread (matplotlib is not thread-safe: only that thread ever uses it). When formulas are
ready, `math_ready` (a Qt signal, delivered on the GUI thread) fires and the text is rendered again.
"""

from __future__ import annotations

import io
import queue
import re
import threading
from collections import OrderedDict
from functools import lru_cache

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QImage

PENDING = object()  # render_image(wait=False): the formula is being drawn on the math thread

# Commands R1 uses that mathtext does not know, mapped to ones it does.
_REPLACEMENTS = [
    (r"\dfrac", r"\frac"),
    (r"\tfrac", r"\frac"),
    (r"\displaystyle", ""),
    (r"\textstyle", ""),
    (r"\limits", ""),
    (r"\nolimits", ""),
    (r"\left.", ""),
    (r"\right.", ""),
    (r"\textbf", r"\mathbf"),
    (r"\mathrm{d}", r"d"),
    (r"\lvert", "|"),
    (r"\rvert", "|"),
    (r"\lVert", r"\Vert"),
    (r"\rVert", r"\Vert"),
    (r"\le ", r"\leq "),
    (r"\ge ", r"\geq "),
    (r"\dots", r"\ldots"),
    (r"\cdotp", r"\cdot"),
    (r"\tag", r"\quad"),
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
def render_png(tex: str, color: str, font_px: float, dpr: float) -> tuple[bytes, bool, float, float] | None:
    """(PNG bytes drawn at dpr x scale, boxed, height, depth in logical px); None if mathtext fails."""
    source, boxed = normalize(tex)
    if not source:
        return None
    import matplotlib  # lazy: a few hundred ms, only paid when a reply contains math
    from matplotlib import mathtext
    from matplotlib.font_manager import FontProperties

    buf = io.BytesIO()
    try:
        # font size in points at dpi 72 * dpr == font_px logical pixels at the screen's pixel ratio
        prop = FontProperties(size=font_px, math_fontfamily="dejavusans")
        with matplotlib.rc_context({"savefig.transparent": True}):  # themes differ: never paint a background
            mathtext.math_to_image(f"${source}$", buf, prop=prop, dpi=72 * dpr, format="png", color=color)
        # The same layout math_to_image uses, for the baseline: depth = how far the formula hangs below it.
        parsed = mathtext.MathTextParser("path").parse(f"${source}$", dpi=72, prop=prop)
    except Exception:  # ValueError for a parse error; anything else is also "show the source instead"
        return None
    return buf.getvalue(), boxed, float(parsed.height), float(parsed.depth)


def render_image(tex: str, color: str, font_px: float, dpr: float, x_height: float | None = None, wait: bool = True):
    """The formula as an image padded so that, placed with QTextDocument's "vertical-align: middle", its
    baseline sits on the text's baseline (Qt centres such images x_height/4 above the baseline).
    None if mathtext can't draw it; with wait=False, PENDING while the math thread draws it."""
    key = (tex, color, font_px, dpr)
    if wait:
        got = render_png(*key)
    else:
        got = _math_thread().result(key)
        if got is PENDING:
            return PENDING
    if got is None:
        return None
    png, boxed, height, depth = got
    img = QImage.fromData(png, "PNG")
    if img.isNull():
        return None
    pad = 0
    if boxed:
        img = _draw_box(img, color, dpr)
        pad = 5
    h = img.height() / dpr
    # mathtext's reported height overshoots where it draws the baseline by about a pixel (measured against
    # body text in a QTextDocument: this lands letters on the text baseline within a pixel).
    baseline_from_top = pad + height - depth - 1
    xh = x_height if x_height is not None else 0.53 * font_px
    # Qt: ascent = (H + xh/2) / 2 for an image of height H. Pad bottom (b) or top (t) so that
    # ascent == baseline_from_top + t, i.e. b - t = 2 * baseline_from_top - h - xh/2.
    diff = 2 * baseline_from_top - h - xh / 2
    img = _pad(img, top=max(0.0, -diff) * dpr, bottom=max(0.0, diff) * dpr)
    img.setDevicePixelRatio(dpr)
    return img


class MathSignals(QObject):
    ready = Signal()  # some queued formulas are drawn: render again whatever showed them as pending


class MathThread:
    """One daemon thread drawing queued formulas, newest first (the one the reader is looking at), each once.
    Results are kept (bounded) for result() to hand out; `signals.ready` is emitted after each batch. It also
    runs other slow first-use work handed to run_soon() (the warm-up of code highlighting)."""

    KEEP = 2048

    def __init__(self):
        self.signals = MathSignals()  # created on the GUI thread: its signal is delivered there
        self._lock = threading.Lock()
        self._done: OrderedDict = OrderedDict()
        self._queued: set = set()
        self._jobs: queue.LifoQueue = queue.LifoQueue()
        self._idle = threading.Event()
        self._idle.set()
        threading.Thread(target=self._run, name="r1desk-math", daemon=True).start()

    def result(self, key):
        with self._lock:
            if key in self._done:
                self._done.move_to_end(key)
                return self._done[key]
            if key not in self._queued:
                self._queued.add(key)
                self._idle.clear()
                self._jobs.put(key)
        return PENDING

    def run_soon(self, fn) -> None:
        with self._lock:
            self._idle.clear()
            self._jobs.put(fn)

    def wait_idle(self, timeout: float) -> bool:
        """True once nothing is queued or running (tests; the app never waits for this thread)."""
        return self._idle.wait(timeout)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if callable(job):
                try:
                    job()
                except Exception:  # a warm-up that fails only means the first use is slower
                    pass
                got = None
            else:
                got = render_png(*job)
            with self._lock:
                if not callable(job):
                    self._queued.discard(job)
                    self._done[job] = got
                    while len(self._done) > self.KEEP:
                        self._done.popitem(last=False)
                idle = self._jobs.empty()
                if idle:
                    self._idle.set()
            if idle and not callable(job):
                self.signals.ready.emit()


_math: MathThread | None = None


def _math_thread() -> MathThread:
    global _math
    if _math is None:
        _math = MathThread()
    return _math


def math_ready_signal():
    """The signal fired (on the GUI thread) when formulas queued by render_image(wait=False) are drawn."""
    return _math_thread().signals.ready


def _pad(img: QImage, top: float, bottom: float) -> QImage:
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QPainter

    t, b = round(top), round(bottom)
    if t == 0 and b == 0:
        return img
    out = QImage(img.width(), img.height() + t + b, QImage.Format_ARGB32_Premultiplied)
    out.fill(Qt.transparent)
    p = QPainter(out)
    p.drawImage(0, t, img)
    p.end()
    return out


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


def run_on_math_thread(fn) -> None:
    """Run fn() on the math thread, after what is queued now (slow first-use work: keep it off the GUI)."""
    _math_thread().run_soon(fn)


def wait_math_idle(timeout: float = 60.0) -> bool:
    return _math_thread().wait_idle(timeout)


def prewarm_in_background() -> None:
    """Import matplotlib and load its math fonts on the math thread (about a second, once), so the first
    formula of the first reply doesn't wait for them."""
    _math_thread().result(("x^2", "#000000", 14.0, 1.0))
