"""The sidebar: the app's name, New chat, the search box and the conversation list with its context menu.

It shows what it is given and says what the user asked for (signals); the window decides what happens, so the
store and the reply in flight stay out of here.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLabel, QLineEdit, QListWidget, QListWidgetItem, QMenu, QPushButton, QVBoxLayout, QWidget

from desktop import theme as themes


class Sidebar(QWidget):
    new_chat_requested = Signal()
    opened = Signal(int)  # a conversation picked in the list
    rename_requested = Signal(int)
    export_requested = Signal(int, str)  # conversation id, "md" | "json"
    delete_requested = Signal(int)
    query_changed = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("Sidebar")
        self.setMinimumWidth(200)
        self.setMaximumWidth(360)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 12, 10, 10)
        lay.setSpacing(8)
        brand = QLabel("r1desk")
        themes.make_heading(brand, 1.25)
        lay.addWidget(brand)
        self.new_btn = QPushButton("＋  New chat")
        self.new_btn.setAccessibleName("New chat")
        self.new_btn.setToolTip("New chat (Ctrl+N)")
        self.new_btn.clicked.connect(self.new_chat_requested)
        lay.addWidget(self.new_btn)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats  (Ctrl+K)")
        self.search.setAccessibleName("Search conversations")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self.query_changed)
        lay.addWidget(self.search)
        self.conv_list = QListWidget()
        self.conv_list.setAccessibleName("Conversations")
        self.conv_list.setToolTip("Double-click or F2 to rename; right-click for export and delete")
        self.conv_list.setContextMenuPolicy(Qt.CustomContextMenu)
        self.conv_list.customContextMenuRequested.connect(self._menu)
        self.conv_list.itemSelectionChanged.connect(self._on_selection)
        self.conv_list.itemDoubleClicked.connect(lambda item: self.rename_requested.emit(item.data(Qt.UserRole)))
        self.conv_list.setTextElideMode(Qt.ElideRight)
        self.conv_list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.conv_list.setWordWrap(False)
        self.conv_list.setUniformItemSizes(True)
        lay.addWidget(self.conv_list, 1)

    def query(self) -> str:
        return self.search.text()

    def show_conversations(self, rows: list[dict], current: int | None) -> None:
        """The list as `rows` (id, title) with `current` selected; no `opened` for the selection made here."""
        self.conv_list.blockSignals(True)
        self.conv_list.clear()
        for c in rows:
            item = QListWidgetItem(c["title"])
            item.setData(Qt.UserRole, c["id"])
            item.setToolTip(c["title"])
            self.conv_list.addItem(item)
            if c["id"] == current:
                item.setSelected(True)
                self.conv_list.setCurrentItem(item)
        self.conv_list.blockSignals(False)

    def current_id(self) -> int | None:
        item = self.conv_list.currentItem()
        return item.data(Qt.UserRole) if item is not None else None

    def clear_selection(self) -> None:
        self.conv_list.clearSelection()

    def focus_search(self) -> None:
        self.search.setFocus()
        self.search.selectAll()

    def clear_search_if_focused(self) -> bool:
        """Esc in a search box with text clears it, as anywhere else: True if it did (so Esc does nothing more,
        in particular it doesn't stop the reply being written)."""
        if self.search.hasFocus() and self.search.text():
            self.search.clear()
            return True
        return False

    def _on_selection(self) -> None:
        items = self.conv_list.selectedItems()
        if items:
            self.opened.emit(items[0].data(Qt.UserRole))

    def _menu(self, pos) -> None:
        item = self.conv_list.itemAt(pos)
        if item is None:
            return
        cid = item.data(Qt.UserRole)
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self.rename_requested.emit(cid))
        menu.addAction("Export as Markdown…", lambda: self.export_requested.emit(cid, "md"))
        menu.addAction("Export as JSON…", lambda: self.export_requested.emit(cid, "json"))
        menu.addSeparator()
        menu.addAction("Delete…", lambda: self.delete_requested.emit(cid))
        menu.exec(self.conv_list.mapToGlobal(pos))
