"""The chat area: the notice banner, the conversation's messages and the composer, laid out as one page."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QVBoxLayout, QWidget

from desktop.chatview import ChatView
from desktop.composer import Banner, Composer

EDITING_TEXT = "Editing a message: sending replaces it and everything after it (Esc to cancel)"


class ChatPage(QWidget):
    def __init__(self, renderer, theme, vote_chains: int, parent=None):
        super().__init__(parent)
        self.setObjectName("ChatPage")
        self.setAttribute(Qt.WA_StyledBackground, True)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        self.banner = Banner()
        banner_wrap = QVBoxLayout()
        banner_wrap.setContentsMargins(16, 10, 16, 0)
        banner_wrap.addWidget(self.banner)
        lay.addLayout(banner_wrap)
        self.chat = ChatView(renderer, theme)
        lay.addWidget(self.chat, 1)
        self.composer = Composer()
        self.composer.set_vote_chains(vote_chains)
        row = QHBoxLayout()
        row.setContentsMargins(24, 8, 24, 16)
        row.addStretch(1)
        row.addWidget(self.composer, 100)
        self.composer.setMaximumWidth(900)
        row.addStretch(1)
        lay.addLayout(row)

    def show_editing(self, on: bool) -> None:
        """The composer's line that says sending replaces the message being edited."""
        self.composer.editing_label.setVisible(on)
        self.composer.editing_label.setText(EDITING_TEXT)

    def show_state(self, generating: bool, thinking: bool, ready: bool) -> None:
        """What can be done now: send (a model is ready) or stop (a reply is being written), stop thinking while
        it reasons, and no editing of the history under a reply (it would change its prompt)."""
        self.composer.set_generating(generating, thinking)
        self.composer.send_btn.setEnabled(generating or ready)
        self.composer.vote_btn.setEnabled(ready)
        self.chat.set_history_actions(not generating)
