"""The chat view: a scrolling column of message widgets, and the streaming of one reply into it.

Streaming rules (why the code looks like this):
- deltas arrive hundreds of times a second; they are buffered and the view is updated by a single-shot
  timer at most once a frame (ReplyStream), never per token;
- reasoning and answer are rendered as markdown (with math) while they stream, piece by piece
  (StreamingText): finished blocks are rendered once, only the block being written is redone each frame;
  if a frame still gets slow the interval stretches so the UI keeps responding;
- the scroll stays pinned to the bottom while the user hasn't scrolled up (ChatView._stick);
- when the reply is finished it is rendered once more as a single document (exact spacing, selection).
"""

from __future__ import annotations

import math
import time
import weakref

from PySide6.QtCore import QSize, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)


from desktop.markdown import MarkdownRenderer, Rendered
from desktop.message_text import format_seconds, meta_text, next_pieces, reasoning_label

FRAME_MS = 16


class RichText(QTextBrowser):
    """A QTextBrowser that is exactly as tall as its text (the outer ChatView scrolls, not this)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setFrameShape(QFrame.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.setOpenLinks(False)
        self.setTextInteractionFlags(Qt.TextBrowserInteraction)
        self.viewport().setAutoFillBackground(False)
        self.setStyleSheet("QTextBrowser { background: transparent; }")
        self.document().setDocumentMargin(2)
        self.anchorClicked.connect(self._on_anchor)
        self.document().documentLayout().documentSizeChanged.connect(lambda _s: self._fit())
        self.code_blocks: list[str] = []
        self._images: dict[str, object] = {}

    def loadResource(self, kind, url: QUrl):
        if url.scheme() == "math":
            return self._images.get(url.toString())
        return super().loadResource(kind, url)

    def set_rendered(self, rendered: Rendered, css: str, again=None) -> None:
        """again: a callable that renders the same text anew, called when formulas this rendering still shows
        as source (drawn on the math thread) are ready."""
        self._images.update(rendered.images)
        self.code_blocks = rendered.code_blocks
        self.document().setDefaultStyleSheet(css)
        self.setHtml(rendered.html)
        self._fit()
        self._again, self._css = (again, css) if rendered.pending_math and again is not None else (None, css)
        if self._again is not None:
            _WAITING_FOR_MATH.add(self)
        else:
            _WAITING_FOR_MATH.discard(self)

    def _on_anchor(self, url: QUrl) -> None:
        if url.scheme() == "copy":
            index = int(url.path() or 0)
            if 0 <= index < len(self.code_blocks):
                QGuiApplication.clipboard().setText(self.code_blocks[index])
        elif url.scheme() in ("http", "https", "mailto"):
            QDesktopServices.openUrl(url)

    def resizeEvent(self, event):
        super().resizeEvent(event)
        self._fit()

    def wheelEvent(self, event):
        event.ignore()  # let the chat view scroll; this widget never has anything to scroll

    def _fit(self) -> None:
        doc = self.document()
        doc.setTextWidth(max(50, self.viewport().width()))
        h = math.ceil(doc.size().height()) + 2 * self.frameWidth()
        if h != self.height():
            self.setFixedHeight(h)

    def sizeHint(self) -> QSize:
        return QSize(400, self.height())


_WAITING_FOR_MATH: "weakref.WeakSet[RichText]" = weakref.WeakSet()


def refresh_waiting_math() -> None:
    """Render again every RichText that showed a formula as source while the math thread drew it."""
    import shiboken6

    for w in list(_WAITING_FOR_MATH):
        _WAITING_FOR_MATH.discard(w)
        again = getattr(w, "_again", None)
        if again is not None and shiboken6.isValid(w):
            w.set_rendered(again(), w._css, again)


def _discard(w: QWidget) -> None:
    # hide + deleteLater, never setParent(None): an orphaned widget is a top-level window, and one of
    # them shown even for a moment steals activation (window shortcuts stop working).
    w.hide()
    w.deleteLater()


class StreamingText(QWidget):
    """Markdown that grows while a reply streams, painted in O(new text) per frame.

    Re-setting the whole HTML of a long reply costs tens of ms in QTextDocument, every frame. Instead, each
    finished top-level block group (see block_cut) is rendered once into its own RichText and never touched
    again; only the last, still-growing piece is re-rendered. A block that keeps growing (a long code block, a
    paragraph with no blank line) is cut anyway at a line or word boundary once it passes TAIL_MAX_CHARS
    (soft_cut), closing and reopening a code fence across the cut: PySide holds the GIL for the whole of a
    setHtml call, so a long re-render per frame would stall the engine thread's decode loop with it. When the
    reply is finished the owner replaces this with one RichText of the whole text (one document: selection across
    blocks, exact spacing)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.lay = QVBoxLayout(self)
        self.lay.setContentsMargins(0, 0, 0, 0)
        self.lay.setSpacing(6)  # the paragraph gap QTextDocument would put between the blocks
        self.pieces: list[RichText] = []
        self._done = 0
        self._reopen = ""  # a code fence's opening line, when a soft cut split the block inside it
        self.tail: RichText | None = None
        self.piece_font = None  # the reasoning block's pieces use its smaller font

    def reset(self) -> None:
        for w in self.pieces:
            _discard(w)
        self.pieces.clear()
        self._done = 0
        self._reopen = ""
        self.tail = None

    def _piece(self, palette=None) -> RichText:
        w = RichText()
        if palette is not None:
            w.setPalette(palette)
        if self.piece_font is not None:
            w.setFont(self.piece_font)
        self.lay.addWidget(w)
        self.pieces.append(w)
        return w

    def stream_to(self, text: str, render, css: str, palette=None) -> None:
        cuts = next_pieces(text, self._done, self._reopen)
        for piece in cuts.finished:  # the tail widget becomes a finished piece; a new one takes the tail
            self._finish_piece(piece, render, css, palette)
        self._done, self._reopen = cuts.done, cuts.reopen
        if cuts.tail:
            if self.tail is None:
                self.tail = self._piece(palette)
            tail = cuts.tail
            self.tail.set_rendered(render(tail), css, lambda: render(tail))

    def _finish_piece(self, piece: str, render, css: str, palette) -> None:
        stable = self.tail or self._piece(palette)
        stable.set_rendered(render(piece), css, lambda: render(piece))
        self.tail = None


def _tool(text: str, accessible: str, tip: str | None = None) -> QToolButton:
    b = QToolButton()
    b.setText(text)
    b.setAccessibleName(accessible)
    b.setToolTip(tip or accessible)
    b.setCursor(Qt.PointingHandCursor)
    b.setFocusPolicy(Qt.TabFocus)
    b.setProperty("msgaction", True)
    return b


class ReasoningBlock(QWidget):
    """The model's thinking: live and expanded while it streams, folded to "Thought for N s" after."""

    def __init__(self, view: "ChatView", parent=None):
        super().__init__(parent)
        self.view = view
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(4)
        self.toggle = QToolButton()
        self.toggle.setObjectName("ReasoningToggle")
        self.toggle.setCheckable(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
        self.toggle.setCursor(Qt.PointingHandCursor)
        self.toggle.toggled.connect(self._set_expanded)
        lay.addWidget(self.toggle, 0, Qt.AlignLeft)
        self.body = QFrame()
        self.body.setObjectName("ReasoningBody")
        body_lay = QVBoxLayout(self.body)
        body_lay.setContentsMargins(12, 6, 10, 6)
        self.text = RichText()
        self.text.setObjectName("ReasoningText")
        f = self.text.font()
        f.setPointSizeF(max(8.0, f.pointSizeF() - 1))  # quieter: a size smaller, and the faint colour
        self.text.setFont(f)
        self.text.setAccessibleName("Reasoning")
        body_lay.addWidget(self.text)
        self.stream_text = StreamingText()
        self.stream_text.piece_font = f
        self.stream_text.hide()
        body_lay.addWidget(self.stream_text)
        lay.addWidget(self.body)
        self.reasoning = ""
        self.streaming = False
        self._rendered_for = None

    # the toggle's label doubles as the status line: "Thinking… 4 s" / "Thought for 12 s"
    def set_label(self, text: str) -> None:
        self.toggle.setText(text)

    def expanded(self) -> bool:
        return self.toggle.isChecked()

    def set_expanded(self, on: bool) -> None:
        self.toggle.setChecked(on)
        self._set_expanded(on)

    def _set_expanded(self, on: bool) -> None:
        self.toggle.setArrowType(Qt.DownArrow if on else Qt.RightArrow)
        self.toggle.setAccessibleName("Hide reasoning" if on else "Show reasoning")
        if on and not self.streaming and self._rendered_for != self.reasoning:
            self.render_final()
        self.body.setVisible(on)

    def start_stream(self) -> None:
        self.streaming = True
        self.reasoning = ""
        self._apply_quiet_format()
        self.stream_text.reset()
        self.stream_text.show()
        self.text.hide()
        self.set_expanded(True)

    def _quiet_palette(self):
        from PySide6.QtGui import QColor, QPalette

        pal = self.text.palette()
        pal.setColor(QPalette.Text, QColor(self.view.theme.faint))
        return pal

    def _apply_quiet_format(self) -> None:
        # Plain text takes its colour from the widget palette: make it the quiet colour.
        self.text.setPalette(self._quiet_palette())

    def append(self, text: str) -> None:
        if not self.reasoning:
            text = text.lstrip("\n")
        self.reasoning += text

    def sync(self) -> None:
        """Paint what streamed since the last frame (markdown + math, incrementally)."""
        r = self.view.renderer
        self.stream_text.stream_to(
            self.reasoning, lambda t: r.render(t, quiet=True), r.stylesheet(quiet=True), self._quiet_palette()
        )

    def visible_text(self) -> str:
        """What the reader sees in the block, as plain text (streamed pieces or the one final document)."""
        if self.stream_text.isVisibleTo(self.body):
            return "\n".join(w.toPlainText() for w in self.stream_text.pieces)
        return self.text.toPlainText()

    def finish_stream(self) -> None:
        self.streaming = False

    def set_text(self, reasoning: str) -> None:
        self.reasoning = reasoning
        self._rendered_for = None
        self.stream_text.reset()
        self.stream_text.hide()
        self.text.show()
        if self.expanded():
            self.render_final()

    def render_final(self) -> None:
        """The finished reasoning as one document (while it streams it is rendered piece by piece)."""
        self.stream_text.reset()
        self.stream_text.hide()
        self.text.show()
        self._apply_quiet_format()
        r, text = self.view.renderer, self.reasoning.strip()
        self.text.set_rendered(r.render(text, quiet=True), r.stylesheet(quiet=True), lambda: r.render(text, quiet=True))
        self._rendered_for = self.reasoning


class MessageWidget(QFrame):
    """One message. Assistant messages have a reasoning block, an answer, a stats line and actions."""

    action = Signal(str, int)  # "copy" | "edit" | "regenerate" | "delete", message id

    def __init__(self, view: "ChatView", msg: dict):
        super().__init__()
        self.view = view
        self.msg_id = msg.get("id") or 0
        self.role = msg["role"]
        self.answer = ""
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(4)
        if self.role == "user":
            row = QHBoxLayout()
            row.addStretch(1)
            self.bubble = QFrame()
            self.bubble.setObjectName("UserBubble")
            self.bubble.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Preferred)
            b_lay = QVBoxLayout(self.bubble)
            b_lay.setContentsMargins(14, 8, 14, 8)
            self.body = RichText()
            self.body.setAccessibleName("Your message")
            b_lay.addWidget(self.body)
            row.addWidget(self.bubble, 6)
            outer.addLayout(row)
            self.reasoning_block = None
        else:
            role = QLabel(view.assistant_name)
            role.setObjectName("Role")
            outer.addWidget(role)
            self.reasoning_block = ReasoningBlock(view)
            self.reasoning_block.hide()
            outer.addWidget(self.reasoning_block)
            self.body = RichText()
            self.body.setAccessibleName("Reply")
            outer.addWidget(self.body)
            self.stream_body = StreamingText()
            self.stream_body.hide()
            outer.addWidget(self.stream_body)
            vote_row = QHBoxLayout()
            vote_row.setSpacing(6)
            self.vote_label = QLabel()
            self.vote_label.setObjectName("Meta")
            self.vote_label.setAccessibleName("Vote")
            self.vote_btn = _tool("Chains…", "Show every chain of this answer")
            self.vote_btn.clicked.connect(self._show_chains)
            vote_row.addWidget(self.vote_label)
            vote_row.addWidget(self.vote_btn)
            vote_row.addStretch(1)
            outer.addLayout(vote_row)
            self.vote_stats: dict | None = None
        foot = QHBoxLayout()
        foot.setSpacing(2)
        if self.role == "user":
            foot.addStretch(1)
        self.meta = QLabel()
        self.meta.setObjectName("Meta")
        self.meta.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.buttons: dict[str, QToolButton] = {}
        specs = (
            [
                ("copy", "Copy", "Copy message"),
                ("edit", "Edit", "Edit and resend"),
                ("delete", "Delete", "Delete message"),
            ]
            if self.role == "user"
            else [
                ("copy", "Copy", "Copy reply"),
                ("regenerate", "Regenerate", "Regenerate reply"),
                ("delete", "Delete", "Delete message"),
            ]
        )
        for name, text, accessible in specs:
            b = _tool(text, accessible)
            b.clicked.connect(lambda _=False, n=name: self.action.emit(n, self.msg_id))
            self.buttons[name] = b
            foot.addWidget(b)
        if self.role != "user":
            foot.addSpacing(8)
            foot.addWidget(self.meta)
            foot.addStretch(1)
        outer.addLayout(foot)
        self.set_content(msg)

    def set_content(self, msg: dict) -> None:
        """Show a stored (finished or interrupted) message."""
        self.msg_id = msg.get("id") or self.msg_id
        if self.role == "user":
            self.answer = text = msg["content"]
            r = self.view.renderer
            self.body.set_rendered(r.render(text), r.stylesheet(), lambda: r.render(text))
            return
        reasoning, answer = msg.get("reasoning") or "", msg.get("answer") or ""
        if not reasoning and not answer:
            answer = msg.get("content") or ""  # a model that doesn't reason: all of it is the answer
        self.answer = answer
        stats = msg.get("stats") or {}
        if reasoning:
            self.reasoning_block.show()
            self.reasoning_block.set_text(reasoning)
            self.reasoning_block.set_label(reasoning_label(stats, bool(answer), msg.get("complete", True)))
            self.reasoning_block.set_expanded(not answer)  # no answer: the reasoning is all there is to read
        self.set_answer(answer)
        self.meta.setText(meta_text(stats, msg.get("complete", True)))
        self.vote_stats = stats.get("vote")  # Ask ×N: the majority of several chains (desktop.vote)
        self.vote_label.setText(self.vote_stats["summary"] if self.vote_stats else "")
        self.vote_label.setVisible(self.vote_stats is not None)
        self.vote_btn.setVisible(self.vote_stats is not None)

    def _show_chains(self) -> None:
        from desktop.vote import ChainsDialog

        if self.vote_stats:
            ChainsDialog(self.vote_stats, self.window()).exec()

    def set_answer(self, answer: str) -> None:
        self.answer = answer
        if self.role != "user":
            self.stream_body.reset()
            self.stream_body.hide()
        self.body.setVisible(bool(answer.strip()))
        if answer.strip():
            r = self.view.renderer
            self.body.set_rendered(r.render(answer), r.stylesheet(), lambda: r.render(answer))

    def stream_answer(self, answer: str) -> None:
        """The answer while it streams (incremental: see StreamingText); set_content() renders it whole once
        the reply is finished."""
        self.answer = answer
        self.body.hide()
        self.stream_body.show()
        r = self.view.renderer
        self.stream_body.stream_to(answer, r.render, r.stylesheet())

    def set_history_actions(self, enabled: bool) -> None:
        for name, b in self.buttons.items():
            if name != "copy":
                b.setEnabled(enabled)

    def set_busy(self, busy: bool) -> None:
        for b in self.buttons.values():
            b.setVisible(not busy)  # no actions on a reply that is still being written

    def text_for_copy(self) -> str:
        return self.answer if self.answer else (self.reasoning_block.reasoning if self.reasoning_block else "")


class ChatView(QScrollArea):
    """A column of MessageWidgets (centred, with a comfortable reading width) that sticks to the bottom."""

    message_action = Signal(str, int)

    def _on_math_ready(self) -> None:
        refresh_waiting_math()

    def __init__(self, renderer: MarkdownRenderer, theme, parent=None):
        super().__init__(parent)
        self.renderer, self.theme = renderer, theme
        self.assistant_name = "Assistant"
        from desktop.mathimg import math_ready_signal

        # Formulas are drawn on the math thread; when some are ready, texts that showed them as source are redone.
        math_ready_signal().connect(self._on_math_ready, Qt.QueuedConnection)
        self.setObjectName("ChatArea")
        self.setAccessibleName("Conversation")
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        inner = QWidget()
        row = QHBoxLayout(inner)
        row.setContentsMargins(24, 20, 24, 20)
        row.addStretch(1)
        self.column = QWidget()
        self.column.setMaximumWidth(860)
        self.column.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Preferred)
        self.col = QVBoxLayout(self.column)
        self.col.setContentsMargins(0, 0, 0, 0)
        self.col.setSpacing(18)
        self.empty = QLabel("Ask anything. The model's reasoning streams here live, then folds away.")
        self.empty.setObjectName("Meta")
        self.empty.setAlignment(Qt.AlignCenter)
        self.col.addWidget(self.empty)
        self.col.addStretch(1)
        row.addWidget(self.column, 100)
        row.addStretch(1)
        self.setWidget(inner)
        self.widgets: list[MessageWidget] = []
        self.history_actions = True  # Edit, Regenerate, Delete usable (off while a reply is written)
        self._stick = True
        bar = self.verticalScrollBar()
        bar.rangeChanged.connect(self._on_range)
        bar.valueChanged.connect(self._on_value)

    # ---- scroll pinning: follow new text unless the user scrolled up to read something
    def _on_range(self, _lo: int, hi: int) -> None:
        if self._stick:
            self.verticalScrollBar().setValue(hi)

    def _on_value(self, value: int) -> None:
        self._stick = value >= self.verticalScrollBar().maximum() - 4

    def scroll_to_bottom(self) -> None:
        self._stick = True
        self.verticalScrollBar().setValue(self.verticalScrollBar().maximum())

    def at_bottom(self) -> bool:
        return self._stick

    # ---- content
    def clear(self) -> None:
        for w in self.widgets:
            _discard(w)
        self.widgets.clear()
        self.empty.show()
        self._stick = True

    def set_history_actions(self, enabled: bool) -> None:
        """Edit, Regenerate and Delete on every message (off while a reply is written; Copy stays)."""
        self.history_actions = enabled
        for w in self.widgets:
            w.set_history_actions(enabled)

    def add_message(self, msg: dict) -> MessageWidget:
        w = MessageWidget(self, msg)
        w.set_history_actions(self.history_actions)
        w.action.connect(self.message_action)
        self.col.insertWidget(self.col.count() - 1, w)
        self.widgets.append(w)
        self.empty.hide()
        return w

    def remove_from(self, msg_id: int) -> None:
        keep = []
        for w in self.widgets:
            if w.msg_id >= msg_id:
                _discard(w)
            else:
                keep.append(w)
        self.widgets = keep
        self.empty.setVisible(not keep)

    def remove(self, msg_id: int) -> None:
        for w in list(self.widgets):
            if w.msg_id == msg_id:
                _discard(w)
                self.widgets.remove(w)
        self.empty.setVisible(not self.widgets)

    def widget_for(self, msg_id: int) -> MessageWidget | None:
        return next((w for w in self.widgets if w.msg_id == msg_id), None)

    def set_renderer(self, renderer: MarkdownRenderer, theme) -> None:
        self.renderer, self.theme = renderer, theme


class ReplyStream:
    """GUI side of one generation: buffers deltas and paints them into one MessageWidget once a frame."""

    def __init__(self, widget: MessageWidget, started: float | None = None):
        self.widget = widget
        self.started = started if started is not None else time.monotonic()
        self.reasoning = ""
        self.answer = ""
        self.first_delta_t: float | None = None
        self.first_answer_t: float | None = None
        self._pending_reasoning: list[str] = []
        self._answer_dirty = False
        self._interval = FRAME_MS
        self.frames = 0
        self.timer = QTimer()
        self.timer.setSingleShot(True)
        self.timer.setTimerType(Qt.PreciseTimer)
        self.timer.timeout.connect(self.flush)
        self.label_timer = QTimer()  # "Thinking… N s" ticks even when no tokens arrive
        self.label_timer.setInterval(500)
        self.label_timer.timeout.connect(self._update_label)
        widget.set_busy(True)
        widget.meta.setText("")

    def feed(self, text: str, kind: str) -> None:
        now = time.monotonic()
        if self.first_delta_t is None:
            self.first_delta_t = now
        if kind == "reasoning":
            self.reasoning += text
            self._pending_reasoning.append(text)
            if not self.widget.reasoning_block.streaming and not self.answer:
                self.widget.reasoning_block.show()
                self.widget.reasoning_block.start_stream()
                self.label_timer.start()
                self._update_label()
        else:
            if self.first_answer_t is None:
                self.first_answer_t = now
            self.answer += text
            self._answer_dirty = True
        if not self.timer.isActive():
            self.timer.start(self._interval)

    def thinking_s(self) -> float | None:
        if not self.reasoning:
            return None
        end = self.first_answer_t if self.first_answer_t is not None else time.monotonic()
        return max(0.0, end - (self.first_delta_t or self.started))

    def _update_label(self) -> None:
        block = self.widget.reasoning_block
        if self.first_answer_t is None and self.reasoning:
            block.set_label(f"Thinking… {format_seconds(self.thinking_s() or 0.0)}")

    def flush(self) -> None:
        t0 = time.perf_counter()
        block = self.widget.reasoning_block
        if self._pending_reasoning and block.streaming:
            block.append("".join(self._pending_reasoning))
            block.sync()
        self._pending_reasoning.clear()
        if self._answer_dirty:
            self._answer_dirty = False
            if block.streaming:  # the answer started: fold the reasoning away
                block.finish_stream()
                self.label_timer.stop()
                block.set_label(f"Thought for {format_seconds(self.thinking_s() or 0.0)}")
                block.set_expanded(False)
            self.widget.stream_answer(self.answer.lstrip("\n"))
        self.frames += 1
        # A long answer makes each re-render slower: stretch the interval so rendering stays under ~half
        # of the GUI thread's time and input stays responsive.
        spent_ms = (time.perf_counter() - t0) * 1000
        self._interval = max(FRAME_MS, min(250, int(spent_ms * 2)))

    def finish(self, msg: dict) -> None:
        """The final text and stats replace what streamed (they are authoritative)."""
        self.timer.stop()
        self.label_timer.stop()
        self.flush()
        block = self.widget.reasoning_block
        if block.streaming:
            block.finish_stream()
        self.widget.set_content(msg)
        self.widget.set_busy(False)
