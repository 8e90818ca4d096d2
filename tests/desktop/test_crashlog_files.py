"""desktop.crashlog's files: of the crash logs only the newest KEEP_CRASH_LOGS stay (by modification time, not
name), and of several runs that ended without a clean exit the newest is the one reported."""

from __future__ import annotations

import os

from desktop.crashlog import KEEP_CRASH_LOGS, CrashLog


def _touch(path, mtime: float, text: str = "") -> None:
    path.write_text(text, encoding="utf-8")
    os.utime(path, (mtime, mtime))


def test_the_newest_crash_logs_are_kept_and_the_oldest_pruned(tmp_path):
    t0 = 1_700_000_000
    # names sorted the other way round from their times: pruning by name would keep the wrong ones
    for i in range(KEEP_CRASH_LOGS + 5):
        _touch(tmp_path / f"crash-{99 - i:02d}.log", t0 + i)
    CrashLog(tmp_path).collect_previous()
    kept = sorted(p.stat().st_mtime for p in tmp_path.glob("crash-*.log"))
    assert kept == [t0 + i for i in range(5, KEEP_CRASH_LOGS + 5)]


def test_of_several_unfinished_runs_the_newest_is_reported(tmp_path):
    t0 = 1_700_000_000
    _touch(tmp_path / "session-c.log", t0 + 30, "last lines of the newest run\n")
    _touch(tmp_path / "session-a.log", t0 + 10, "Fatal Python error: the oldest run\n")
    _touch(tmp_path / "session-b.log", t0 + 20)
    crash = CrashLog(tmp_path).collect_previous()
    assert crash is not None and crash.when.timestamp() == t0 + 30
    assert "newest run" in crash.log_path.read_text(encoding="utf-8")
    assert not crash.fatal  # the fatal marker was the oldest run's
    assert len(list(tmp_path.glob("crash-*.log"))) == 3 and not list(tmp_path.glob("session-*.log"))
