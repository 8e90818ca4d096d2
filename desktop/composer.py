"""The composer (input box, Stop thinking, Ask ×N, Send/Stop) and the banner that carries the window's messages."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QToolButton, QVBoxLayout


PLACEHOLDER = "Message the model — Enter to send, Shift+Enter for a new line"
PLACEHOLDER_SHORT = "Message the model"


class Composer(QFrame):
    """Input box + Stop thinking + Ask ×N (a majority of N chains: desktop.vote) + Send/Stop. Enter sends,
    Shift+Enter inserts a new line."""

    send_requested = Signal()

    def __init__(self):
        super().__init__()
        self.setObjectName("Composer")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 8, 8, 8)
        lay.setSpacing(6)
        self.editing_label = QLabel()
        self.editing_label.setObjectName("Meta")
        self.editing_label.hide()
        lay.addWidget(self.editing_label)
        row = QHBoxLayout()
        row.setSpacing(8)
        self.edit = QPlainTextEdit()
        self.edit.setAccessibleName("Message")
        self.edit.setPlaceholderText(PLACEHOLDER)
        self.edit.setTabChangesFocus(True)
        self.edit.installEventFilter(self)
        self.edit.viewport().installEventFilter(self)  # its width: which placeholder fits (_fit_placeholder)
        self.edit.textChanged.connect(self._grow)
        row.addWidget(self.edit, 1)
        self.stop_thinking_btn = QPushButton("Stop thinking")
        self.stop_thinking_btn.setAccessibleName("Stop thinking and answer now")
        self.stop_thinking_btn.setToolTip("Close the reasoning and make the model answer now")
        self.stop_thinking_btn.hide()
        row.addWidget(self.stop_thinking_btn, 0, Qt.AlignBottom)
        self.vote_btn = QPushButton("Ask ×8")
        self.vote_btn.setAccessibleName("Ask several chains and answer with their majority")
        row.addWidget(self.vote_btn, 0, Qt.AlignBottom)
        self.send_btn = QPushButton("Send")
        self.send_btn.setProperty("primary", True)
        self.send_btn.setAccessibleName("Send")
        self.send_btn.setMinimumWidth(76)
        row.addWidget(self.send_btn, 0, Qt.AlignBottom)
        lay.addLayout(row)
        self._grow()

    def eventFilter(self, obj, event):
        if obj is self.edit.viewport() and event.type() == QEvent.Resize:
            self._fit_placeholder(event.size().width())
        if obj is self.edit and event.type() == QEvent.KeyPress and event.key() in (Qt.Key_Return, Qt.Key_Enter):
            if event.modifiers() & Qt.ShiftModifier:
                return False  # default: new line
            self.send_requested.emit()
            return True
        return super().eventFilter(obj, event)

    def _fit_placeholder(self, width: int) -> None:
        # The empty box is one line high and the placeholder is not part of its document, so a placeholder wider
        # than the box wraps onto a second line that is cut off (a narrow chat column): use the short one there.
        room = width - 2 * self.edit.document().documentMargin()
        text = PLACEHOLDER if self.edit.fontMetrics().horizontalAdvance(PLACEHOLDER) <= room else PLACEHOLDER_SHORT
        if self.edit.placeholderText() != text:
            self.edit.setPlaceholderText(text)

    def _grow(self) -> None:
        # Grow with the text up to ~8 lines, then scroll inside.
        lines = max(1, int(self.edit.document().size().height()))
        line_h = self.edit.fontMetrics().lineSpacing()
        self.edit.setVerticalScrollBarPolicy(Qt.ScrollBarAsNeeded if lines > 8 else Qt.ScrollBarAlwaysOff)
        self.edit.setFixedHeight(min(lines, 8) * line_h + 16)

    def text(self) -> str:
        return self.edit.toPlainText()

    def set_text(self, text: str) -> None:
        self.edit.setPlainText(text)
        self.edit.moveCursor(self.edit.textCursor().MoveOperation.End)

    def set_generating(self, on: bool, thinking: bool = False) -> None:
        self.send_btn.setText("Stop" if on else "Send")
        self.send_btn.setAccessibleName("Stop" if on else "Send")
        self.send_btn.setProperty("primary", not on)
        self.send_btn.style().unpolish(self.send_btn)
        self.send_btn.style().polish(self.send_btn)
        self.stop_thinking_btn.setVisible(on and thinking)
        self.vote_btn.setVisible(not on)

    def set_vote_chains(self, n: int) -> None:
        self.vote_btn.setText(f"Ask ×{n}")
        self.vote_btn.setToolTip(
            f"Sample {n} reasoning chains and answer with their majority (Settings: Chains for Ask ×N)"
        )


class Banner(QFrame):
    """A dismissable message with up to a few actions; the app stays usable under it."""

    def __init__(self):
        super().__init__()
        self.setObjectName("Banner")
        self.setAccessibleName("Notice")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(12, 8, 8, 8)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        lay.addWidget(self.label, 1)
        self.buttons_box = QHBoxLayout()
        lay.addLayout(self.buttons_box)
        close = QToolButton()
        close.setText("✕")
        close.setAccessibleName("Dismiss notice")
        close.clicked.connect(self.hide)
        lay.addWidget(close)
        self.kind = ""
        self.hide()

    def show_message(self, kind: str, text: str, actions: list[tuple[str, object]] = ()) -> None:
        self.kind = kind
        self.label.setText(text)
        while self.buttons_box.count():
            w = self.buttons_box.takeAt(0).widget()
            if w:
                w.deleteLater()
        for label, fn in actions:
            b = QPushButton(label)
            b.setAccessibleName(label)
            b.clicked.connect(fn)
            self.buttons_box.addWidget(b)
        self.show()

    def action_buttons(self) -> list[QPushButton]:
        return [self.buttons_box.itemAt(i).widget() for i in range(self.buttons_box.count())]
