"""Renaming, deleting and exporting a stored conversation: the dialog that asks, the store's change, and a clear
notice where the store or the disk refuses (a read-only folder, a full disk, another program holding the file)."""

from __future__ import annotations

import sqlite3
from typing import Callable

from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox, QWidget

from desktop.store import Store, store_problem

Report = Callable[[str, str], None]  # (banner kind, text)


def export_file_name(title: str, fmt: str) -> str:
    """The file name an export suggests: the chat's title without the characters file systems refuse."""
    safe = "".join(c if c.isalnum() or c in " -_" else "_" for c in title).strip() or "chat"
    return f"{safe}.{fmt}"


class ConversationActions:
    def __init__(self, store: Store, parent: QWidget, report: Report):
        self.store, self.parent, self.report = store, parent, report

    def write(self, what: str, write: Callable[[], object]) -> bool:
        """A change to the store from a user's action; where the store refuses it, a notice says what was not
        done and why: False."""
        try:
            write()
            return True
        except sqlite3.Error as err:
            self.report("save_failed", f"Could not {what}: {store_problem(err)}")
            return False

    def rename(self, conv_id: int) -> str | None:
        """Ask for a new title and store it: the title, or None (cancelled, empty, or refused)."""
        conv = self.store.conversation(conv_id)
        if not conv:
            return None
        title, ok = QInputDialog.getText(self.parent, "Rename chat", "Title", text=conv["title"])
        if not ok or not title.strip():
            return None
        if not self.write("rename the chat", lambda: self.store.rename(conv_id, title)):
            return None
        return title.strip()

    def delete(self, conv_id: int, confirm: bool = True) -> bool:
        if (
            confirm
            and QMessageBox.question(self.parent, "Delete chat", "Delete this chat? This cannot be undone.")
            != QMessageBox.Yes
        ):
            return False
        return self.write("delete the chat", lambda: self.store.delete_conversation(conv_id))

    def export(self, conv_id: int, fmt: str, path: str | None = None) -> str | None:
        """Write the chat as Markdown ("md") or JSON to `path` (asked for when None): the path, or None."""
        conv = self.store.conversation(conv_id)
        if conv is None:
            return None
        if path is None:
            filt = "Markdown (*.md)" if fmt == "md" else "JSON (*.json)"
            path, _ = QFileDialog.getSaveFileName(
                self.parent, "Export chat", export_file_name(conv["title"], fmt), filt
            )
            if not path:
                return None
        text = self.store.export_markdown(conv_id) if fmt == "md" else self.store.export_json(conv_id)
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as err:  # a read-only folder, a full disk: the chat itself is untouched
            self.report("save_failed", f"Could not export the chat to {path}: {err.strerror or err}.")
            return None
        return path
