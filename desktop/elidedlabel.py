"""A one-line label that gives way when its row is short of room: it shrinks with the layout and ends its text
with "…" instead of pushing its neighbours over each other (a QLabel's minimum width is its whole text). The
full text stays in text() and shows as the tooltip."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QLabel

MIN_CHARS = 8  # the least it shrinks to, in average character widths


class ElidedLabel(QLabel):
    def __init__(self, text: str = "", parent=None, widest: int = 420):
        super().__init__(text, parent)
        self.widest = widest  # the most it asks for when there is room; past it the text is elided
        self.setToolTip(text)

    def setText(self, text: str) -> None:
        super().setText(text)
        self.setToolTip(text)

    def sizeHint(self) -> QSize:
        hint = super().sizeHint()
        return QSize(min(hint.width(), self.widest), hint.height())

    def minimumSizeHint(self) -> QSize:
        hint = super().minimumSizeHint()
        return QSize(min(hint.width(), self.fontMetrics().averageCharWidth() * MIN_CHARS), hint.height())

    def paintEvent(self, event) -> None:
        rect = self.contentsRect()
        text = self.fontMetrics().elidedText(self.text(), Qt.ElideRight, rect.width())
        painter = QPainter(self)
        self.style().drawItemText(
            painter, rect, int(self.alignment()), self.palette(), self.isEnabled(), text, self.foregroundRole()
        )
