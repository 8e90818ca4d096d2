"""One r1desk window per profile: a second start brings the first window forward and exits at once (two would
load the model twice onto one GPU and write one chat database behind each other's windows)."""

from __future__ import annotations

import os
import subprocess
import sys

from desktop.single_instance import LOCK_NAME, SingleInstance

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _second_start(profile) -> subprocess.Popen:
    """`python -m desktop.app` on the same profile, as a second double-click would start it."""
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        R1DESK_DATA_DIR=str(profile / "data"),
        R1DESK_CONFIG_DIR=str(profile / "config"),
    )
    return subprocess.Popen(
        [sys.executable, "-m", "desktop.app"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_second_start_brings_the_first_window_forward_and_exits(qtbot, profile, make_window):
    win = make_window(engine=None, start=False)
    first = SingleInstance(profile / "data" / "instance")
    assert first.acquire()
    first.activated.connect(win.bring_to_front)
    win.showMinimized()
    second = None
    try:
        with qtbot.waitSignal(first.activated, timeout=60000):
            second = _second_start(profile)
        out, err = second.communicate(timeout=60)
        assert second.returncode == 0 and "already running" in err, err
        qtbot.waitUntil(lambda: not win.isMinimized(), timeout=5000)
        assert not (profile / "data" / "instance" / "show-window.request").exists()  # taken
    finally:
        if second is not None and second.poll() is None:  # a second window after all: the test failed
            second.kill()
            second.communicate()
        first.release()
    # the first gone (its lock released, as at exit or by its death): the next start runs
    again = SingleInstance(profile / "data" / "instance")
    assert again.acquire()
    again.release()


def test_a_lock_left_by_a_dead_run_or_an_earlier_run_with_this_pid_does_not_block_the_start(tmp_path):
    from PySide6.QtCore import QLockFile

    folder = tmp_path / "instance"
    folder.mkdir()
    # a run that died: QLockFile tells its PID is gone
    dead = subprocess.run(
        [sys.executable, "-c", "import os, sys; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    (folder / LOCK_NAME).write_text(f"{dead}\npython\n{os.uname().nodename}\n")
    first = SingleInstance(folder)
    assert first.acquire()
    first.release()
    # a lock naming this very process that it never took (PIDs repeat in sandboxes): an earlier run's
    probe = QLockFile(str(tmp_path / "probe.lock"))
    assert probe.tryLock(0)
    mine = (tmp_path / "probe.lock").read_bytes()
    probe.unlock()
    (folder / LOCK_NAME).write_bytes(mine)
    again = SingleInstance(folder)
    assert again.acquire()
    # while it holds the lock, another instance in this process is refused (and asks it to show itself)
    assert not SingleInstance(folder).acquire()
    again.release()
