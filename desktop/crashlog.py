"""The crash log: what the app leaves behind if it ever dies, and the notice on the next start.

At start the app opens `logs/session-<pid>-<random>.log` in its data folder, holds a lock file beside it for as long as
it runs, and points faulthandler at the log: a segmentation fault, an abort or a fatal Python error writes every
thread's Python stack there. Python exceptions that nothing caught (in a slot, on a thread) are appended too.
A clean exit deletes both files. So on the next start a session log whose lock is no longer held (QLockFile
knows a dead owner from a live one, on every platform) belongs to a run that ended without closing: it is kept
as `crash-<time>.log` and the window says so. Two windows at once each have their own session files. A
folder that can't be written (read-only, a full disk) costs the crash log, never the start.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import sys
import threading
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QLockFile

from desktop.process_lock import process_lock, release, take

KEEP_CRASH_LOGS = 10  # older crash logs are removed


@dataclass
class PreviousCrash:
    log_path: Path
    when: datetime.datetime
    fatal: bool  # faulthandler wrote a stack (a crash), not only an unexpected end (killed, power loss)


class CrashLog:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.path: Path | None = None
        self._file = None
        self._lock: QLockFile | None = None
        self._old_excepthook = None
        self._old_thread_hook = None

    # ------------------------------------------------------------------ this run
    def start(self) -> bool:
        """Open this run's log, lock it and install faulthandler and the exception hooks. False (and no log)
        where the folder can't be written: a read-only data folder or a full disk must not stop the app."""
        # The PID alone repeats: a process namespace (a sandbox, a container) gives every start the same one,
        # and so would a run's leftover files to the next run, which took them for its own.
        stem = f"session-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._lock = process_lock(self.folder / f"{stem}.lock")
            take(self._lock)
            self.path = self.folder / f"{stem}.log"
            self._file = open(self.path, "x", encoding="utf-8", errors="replace", buffering=1)
            self._file.write(
                f"r1desk session started {datetime.datetime.now().isoformat(timespec='seconds')} "
                f"pid {os.getpid()} Python {sys.version.split()[0]} on {sys.platform}\n"
            )
            self._file.flush()
        except OSError as err:
            print(f"r1desk: no crash log this run ({self.folder} can't be written: {err})", file=sys.stderr)
            if self._file is not None:
                self._file.close()
            self._file, self.path = None, None
            if self._lock is not None:
                release(self._lock)
            return False
        faulthandler.enable(self._file, all_threads=True)
        self._old_excepthook = sys.excepthook
        self._old_thread_hook = threading.excepthook
        sys.excepthook = self._excepthook
        threading.excepthook = self._thread_excepthook
        return True

    def note(self, line: str) -> None:
        """Add a line to this run's log (e.g. versions once the engine has loaded)."""
        if self._file is not None:
            self._file.write(line.rstrip("\n") + "\n")
            self._file.flush()

    def stop(self) -> None:
        """A clean exit: nothing to report next time."""
        if self._file is None:
            return
        faulthandler.disable()
        sys.excepthook = self._old_excepthook or sys.__excepthook__
        threading.excepthook = self._old_thread_hook or threading.__excepthook__
        self._file.close()
        self._file = None
        try:
            self.path.unlink()
        except OSError:
            pass
        if self._lock is not None:
            release(self._lock)

    def _excepthook(self, exc_type, exc, tb) -> None:
        self.note("Uncaught exception:\n" + "".join(traceback.format_exception(exc_type, exc, tb)))
        (self._old_excepthook or sys.__excepthook__)(exc_type, exc, tb)

    def _thread_excepthook(self, args) -> None:
        name = args.thread.name if args.thread is not None else "?"
        self.note(
            f"Uncaught exception in thread {name}:\n"
            + "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
        )
        (self._old_thread_hook or threading.__excepthook__)(args)

    # ------------------------------------------------------------------ earlier runs
    def collect_previous(self) -> PreviousCrash | None:
        """Session logs of runs that are gone without a clean exit become crash logs; the newest is returned.
        Call before start()."""
        if not self.folder.is_dir():
            return None
        found: list[PreviousCrash] = []
        for log in sorted(self.folder.glob("session-*.log")):
            lock = process_lock(log.with_suffix(".lock"))
            if not take(lock):
                continue  # that run is still going (another window), or the lock can't be read: leave it
            try:
                when = datetime.datetime.fromtimestamp(log.stat().st_mtime)
                text = log.read_text(encoding="utf-8", errors="replace")
                target = self._free_name(when)
                log.rename(target)
                found.append(PreviousCrash(target, when, _looks_fatal(text)))
            except OSError:
                pass
            finally:
                release(lock)
        self._prune()
        return max(found, key=lambda c: c.when) if found else None

    def _free_name(self, when: datetime.datetime) -> Path:
        base = f"crash-{when.strftime('%Y%m%d-%H%M%S')}"
        target = self.folder / f"{base}.log"
        n = 1
        while target.exists():
            n += 1
            target = self.folder / f"{base}-{n}.log"
        return target

    def _prune(self) -> None:
        logs = sorted(self.folder.glob("crash-*.log"), key=_mtime)
        for old in logs[:-KEEP_CRASH_LOGS]:
            try:
                old.unlink()
            except OSError:
                pass


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile (another window pruning at the same moment)
        return 0.0


def _looks_fatal(text: str) -> bool:
    return any(
        marker in text
        for marker in (
            "Fatal Python error",
            "Segmentation fault",
            "Aborted",
            "Bus error",
            "Floating point exception",
            "Illegal instruction",
        )
    )
