"""What a start found, said in one banner: the conversations database that could not be opened, the damaged one
that was moved aside, a last run that ended without closing (desktop.crashlog)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices

from desktop.store import store_problem


def _open_folder(path: Path):
    return lambda: QDesktopServices.openUrl(QUrl.fromLocalFile(str(path)))


def start_notice(crash=None, moved_aside: Path | None = None, unavailable=None) -> tuple[str, str, list] | None:
    """(banner kind, text, actions) for what the start found, or None when all is well. unavailable: (the
    database's path, the error) where it could not be opened at all (the chats of this run are then not kept)."""
    parts, actions = [], []
    if unavailable is not None:
        path, err = unavailable
        problem = store_problem(err) if isinstance(err, sqlite3.Error) else f"{err}."
        parts.append(
            f"Your conversations at {path} could not be opened: {problem} r1desk works, but keeps "
            "nothing from this session; the file was not changed."
        )
        actions.append(("Open folder", _open_folder(path.parent)))
    if moved_aside is not None:
        parts.append(
            f"The conversations database was damaged, so r1desk started a new one. The old file is "
            f"kept at {moved_aside}."
        )
        actions.append(("Open folder", _open_folder(moved_aside.parent)))
    if crash is not None:
        how = "crashed" if crash.fatal else "closed unexpectedly"
        # (the store writes a reply as it grows: what was written survives)
        kept = "" if parts else " Your conversations were kept, including the reply that was being written."
        parts.append(
            f"r1desk {how} last time ({crash.when.strftime('%Y-%m-%d %H:%M')}).{kept} The crash "
            f"log is at {crash.log_path}."
        )
        actions.append(("Open log folder", _open_folder(crash.log_path.parent)))
    if not parts:
        return None
    kind = "database" if unavailable is not None or moved_aside is not None else "crash"
    return kind, " ".join(parts), actions
