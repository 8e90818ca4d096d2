"""Lock files that say "this process is running" (QLockFile: a dead owner's lock is stale at once, on every
platform), with the one case QLockFile gets wrong: PIDs repeat. A sandbox or container can give every start the
same PID, so a lock an earlier run left naming this process's PID looks held by this very process. Such a lock
that this process did not take is taken over. Used by the crash log, the one-window guard and the download."""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QLockFile

_HELD: set[str] = set()  # the locks this process holds through take()


def process_lock(path: str | Path) -> QLockFile:
    lock = QLockFile(str(path))
    lock.setStaleLockTime(0)  # held as long as its process lives: never stale with age, only with its owner
    return lock


def take(lock: QLockFile) -> bool:
    """Lock it now (no waiting): True if this process holds it afterwards."""
    if lock.tryLock(0) or _left_by_this_pid(lock):
        _HELD.add(lock.fileName())
        return True
    return False


def release(lock: QLockFile) -> None:
    if lock.isLocked():
        _HELD.discard(lock.fileName())
        lock.unlock()  # also removes the file


def _left_by_this_pid(lock: QLockFile) -> bool:
    pid, _host, _app = lock.getLockInfo()
    if pid != os.getpid() or lock.fileName() in _HELD:
        return False
    try:
        Path(lock.fileName()).unlink()
    except OSError:
        return False
    return lock.tryLock(0)
