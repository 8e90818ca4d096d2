"""One r1desk window per user profile: a second start brings the first window to the front and exits.

Two would each load the model onto the same GPU (on a 6-8 GB card the second runs out of memory, or pushes the
first out) and write one chat database behind each other's windows (an edit or regenerate in one deletes rows
the other just added). A double-click too many, or a start from the menu while the window hides behind others,
is the common way to get there.

QtCore only (the bundle leaves QtNetwork out): a lock file in the data folder says who runs (QLockFile tells a
dead owner from a live one on every platform, so a crash leaves no lock behind), and the second start asks the
first to show itself by writing a request file there, which the first watches (QFileSystemWatcher).
"""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QFileSystemWatcher, QObject, Signal

from desktop.process_lock import process_lock, release, take

LOCK_NAME = "r1desk.lock"
REQUEST_NAME = "show-window.request"


class SingleInstance(QObject):
    activated = Signal()  # another start asked this one to show its window

    def __init__(self, folder: Path, parent=None):
        super().__init__(parent)
        self.folder = Path(folder)
        self.request = self.folder / REQUEST_NAME
        self.lock = process_lock(self.folder / LOCK_NAME)
        self.watcher: QFileSystemWatcher | None = None

    def acquire(self) -> bool:
        """True: this is the only r1desk on this profile (or the folder can't hold a lock: run unguarded). False:
        another one runs and was asked to show its window; this start should end."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return True  # a data folder that can't be written says so elsewhere; never block the start for it
        if not take(self.lock):
            pid, _host, _app = self.lock.getLockInfo()
            if pid <= 0:  # unreadable, not held: not a running r1desk
                return True
            try:
                self.request.write_text(str(os.getpid()), encoding="utf-8")
            except OSError:
                pass
            return False
        try:
            self.request.unlink()  # a request left from before this run is not for this window
        except OSError:
            pass
        self.watcher = QFileSystemWatcher([str(self.folder)], self)
        self.watcher.directoryChanged.connect(self._on_folder_changed)
        return True

    def release(self) -> None:
        if self.watcher is not None:
            self.watcher.removePaths(self.watcher.directories())
            self.watcher = None
        release(self.lock)

    def _on_folder_changed(self, _path: str) -> None:
        if not self.request.exists():
            return
        try:
            self.request.unlink()
        except OSError:
            return  # another change event got it first
        self.activated.emit()
