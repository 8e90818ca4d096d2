"""Lock files that say "this process is running" (desktop.process_lock): taken or not at once, never taken from
a live owner (another process, or another lock of this one), given up on release, and taken over where an earlier
run left one naming this very PID (a sandbox that gives every start the same PID)."""

from __future__ import annotations

import subprocess
import sys

from PySide6.QtCore import QLockFile

from desktop.process_lock import process_lock, release, take

HOLDER = """
import sys
from PySide6.QtCore import QLockFile
lock = QLockFile(sys.argv[1])
print("locked" if lock.tryLock(0) else "refused", flush=True)
sys.stdin.read()  # held until the test closes stdin
"""


def test_a_lock_is_taken_once_and_given_back(tmp_path):
    path = tmp_path / "r1desk.lock"
    first, second = process_lock(path), process_lock(path)
    assert take(first) and path.exists()
    assert not take(second)  # held by this process's own lock: not taken over
    release(first)
    assert not path.exists() and not first.isLocked()
    release(first)  # releasing what is not held does nothing
    assert take(second)
    release(second)


def test_a_lock_another_process_holds_is_not_taken_until_it_ends(tmp_path):
    path = tmp_path / "r1desk.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        lock = process_lock(path)
        assert not take(lock)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert take(lock)  # its owner is gone: stale at once, whatever its age
    release(lock)


def test_a_lock_left_naming_this_pid_is_taken_over(tmp_path):
    path = tmp_path / "r1desk.lock"
    earlier = process_lock(path)  # this process held it once and gave it back: no longer its own
    assert take(earlier)
    release(earlier)
    left = QLockFile(str(path))  # an earlier run's lock with this PID: written, never taken through take()
    assert left.tryLock(0)
    lock = process_lock(path)
    assert take(lock) and lock.isLocked()
    assert lock.getLockInfo()[0] == left.getLockInfo()[0]  # now this lock's file
    release(lock)
    assert not path.exists()
