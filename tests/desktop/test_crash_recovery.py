"""If it ever crashes anyway: the crash log and the notice on the next start; a corrupt conversations database
moved aside; a full disk while a reply is saved."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _child(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=dict(os.environ, QT_QPA_PLATFORM="offscreen", **env),
    )


SEGFAULT_IN_A_FUNCTION = """
    import faulthandler
    from PySide6.QtCore import QCoreApplication
    from desktop.crashlog import CrashLog
    app = QCoreApplication([])
    log = CrashLog({folder!r})
    log.start()
    def deep_inside_a_reply():
        faulthandler._sigsegv()
    deep_inside_a_reply()
"""


def test_a_crash_leaves_a_log_and_the_next_start_says_where(qtbot, profile):
    from desktop.app import build_window, parse_args
    from desktop.crashlog import CrashLog

    logs = profile / "data" / "logs"
    out = _child(SEGFAULT_IN_A_FUNCTION.format(folder=str(logs)))
    assert out.returncode != 0  # it really died
    (session_log,) = logs.glob("session-*.log")
    text = session_log.read_text()
    assert "Segmentation fault" in text and "deep_inside_a_reply" in text  # faulthandler's Python stack

    crash_log = CrashLog(logs)
    win = build_window(parse_args([]), crash_log)
    qtbot.addWidget(win)
    try:
        (kept,) = logs.glob("crash-*.log")  # renamed so the next start does not report it again
        assert kept.read_text() == text
        assert [p.name for p in logs.glob("session-*.log")] == [crash_log.path.name]  # this run's own log
        assert win.banner.kind == "crash" and not win.banner.isHidden()
        message = win.banner.label.text()
        assert "crashed last time" in message and str(kept) in message and "conversations were kept" in message
        assert [b.text() for b in win.banner.action_buttons()] == ["Open log folder"]
    finally:
        win.close()
        win.store.close()
        crash_log.stop()
    assert not list(logs.glob("session-*"))  # a clean exit leaves nothing behind
    assert CrashLog(logs).collect_previous() is None  # and the crash is reported once only


def test_a_running_window_is_not_mistaken_for_a_crash(profile):
    """Two windows at once: the second must not report the first (whose lock is held) as crashed."""
    from desktop.crashlog import CrashLog

    logs = profile / "data" / "logs"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import sys
        from PySide6.QtCore import QCoreApplication
        from desktop.crashlog import CrashLog
        app = QCoreApplication([])
        log = CrashLog({str(logs)!r}); log.start()
        print("started", flush=True)
        sys.stdin.readline()
        log.stop()
        print("stopped", flush=True)
    """),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert child.stdout.readline().strip() == "started"
        assert CrashLog(logs).collect_previous() is None
        assert len(list(logs.glob("session-*.log"))) == 1  # untouched
    finally:
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "stopped"
        child.wait(30)
    assert child.returncode == 0 and not list(logs.iterdir())


def test_a_killed_run_is_reported_as_closed_unexpectedly(profile):
    from desktop.crashlog import CrashLog

    logs = profile / "data" / "logs"
    out = _child(f"""
        import os, signal
        from PySide6.QtCore import QCoreApplication
        from desktop.crashlog import CrashLog
        app = QCoreApplication([])
        CrashLog({str(logs)!r}).start()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert out.returncode == -9
    crash = CrashLog(logs).collect_previous()
    assert crash is not None and not crash.fatal and crash.log_path.name.startswith("crash-")


# ---------------------------------------------------------------------------------------------- the database
def test_a_database_that_is_not_one_is_moved_aside_and_the_app_starts(qtbot, profile):
    from desktop.app import build_window, parse_args

    db = profile / "data" / "conversations.sqlite3"
    db.parent.mkdir(parents=True)
    db.write_bytes(b"this is not a database " * 200)
    win = build_window(parse_args([]))
    qtbot.addWidget(win)
    try:
        (aside,) = db.parent.glob("conversations-corrupt-*.sqlite3")
        assert aside.read_bytes() == b"this is not a database " * 200  # kept as it was
        assert win.banner.kind == "database" and str(aside) in win.banner.label.text()
        assert win.store.conversations() == []
        win.store.create_conversation("works")  # a usable, new database
    finally:
        win.close()
        win.store.close()


def test_a_database_that_cant_be_opened_leaves_the_app_usable_and_the_file_untouched(qtbot, profile):
    """Not damaged but out of reach (here a folder where the file should be; a read-only folder, a full disk or
    another program's lock alike): moving it aside would not help, and the app used to stop at start with a
    traceback. It starts, says what happened, where, and that this session's chats are not kept."""
    from desktop.app import build_window, parse_args

    db = profile / "data" / "conversations.sqlite3"
    db.mkdir(parents=True)
    (db / "something").write_text("the user's")
    win = build_window(parse_args([]))
    qtbot.addWidget(win)
    try:
        message = win.banner.label.text()
        assert win.banner.kind == "database" and str(db) in message and "could not be opened" in message
        assert "keeps nothing from this session" in message
        assert [b.text() for b in win.banner.action_buttons()] == ["Open folder"]
        conv = win.store.create_conversation("works")  # usable, in memory
        assert win.store.conversation(conv)["title"] == "works"
        assert (db / "something").read_text() == "the user's" and not list(db.parent.glob("*corrupt*"))
    finally:
        win.close()
        win.store.close()


def test_a_database_a_newer_r1desk_wrote_is_left_alone(qtbot, profile):
    """Its format version (PRAGMA user_version) is past what this code knows: it is not written (a newer
    table layout would be damaged), not moved aside as damaged, and the start says why."""
    from desktop.app import build_window, parse_args
    from desktop.store import SCHEMA_VERSION, Store

    db = profile / "data" / "conversations.sqlite3"
    db.parent.mkdir(parents=True)
    made = Store(db)
    assert made.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION  # a new file says its format
    made.create_conversation("from the future")
    made.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    made.close()
    before = db.read_bytes()
    win = build_window(parse_args([]))
    qtbot.addWidget(win)
    try:
        message = win.banner.label.text()
        assert win.banner.kind == "database" and "newer r1desk" in message and str(db) in message
        assert win.store.conversations() == [] and not list(db.parent.glob("*corrupt*"))
    finally:
        win.close()
        win.store.close()
    assert db.read_bytes() == before


def test_a_crash_and_a_damaged_database_are_both_said(qtbot, profile):
    """The banner holds one message: the crash notice used to replace the damaged database's, saying the
    conversations were kept when they had just been moved aside."""
    from desktop.app import build_window, parse_args
    from desktop.crashlog import CrashLog

    logs = profile / "data" / "logs"
    assert _child(SEGFAULT_IN_A_FUNCTION.format(folder=str(logs))).returncode != 0
    db = profile / "data" / "conversations.sqlite3"
    db.write_bytes(b"this is not a database " * 200)
    crash_log = CrashLog(logs)
    win = build_window(parse_args([]), crash_log)
    qtbot.addWidget(win)
    try:
        (aside,) = db.parent.glob("conversations-corrupt-*.sqlite3")
        (kept,) = logs.glob("crash-*.log")
        message = win.banner.label.text()
        assert str(aside) in message and "crashed last time" in message and str(kept) in message
        assert "were kept" not in message
        assert [b.text() for b in win.banner.action_buttons()] == ["Open folder", "Open log folder"]
    finally:
        win.close()
        win.store.close()
        crash_log.stop()


def test_a_database_with_damaged_pages_is_moved_aside(tmp_path):
    from desktop.store import Store, open_store

    path = tmp_path / "conversations.sqlite3"
    store = Store(path)
    cid = store.create_conversation("x")
    for i in range(300):
        store.add_message(cid, "user", f"message {i} " * 40)
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    raw = bytearray(path.read_bytes())
    page = 4096
    for p in range(2, len(raw) // page):  # scribble over every page's header after the first two
        raw[p * page : p * page + 16] = b"\xde\xad\xbe\xef" * 4
    path.write_bytes(bytes(raw))
    store, aside = open_store(path)
    assert aside is not None and aside.exists() and store.conversations() == []
    store.close()


def test_a_database_that_cannot_be_opened_is_not_moved(tmp_path):
    """No permission is not corruption: moving the file would hide the user's history for nothing."""
    from desktop.store import open_store

    folder = tmp_path / "data"
    (folder / "conversations.sqlite3").mkdir(parents=True)  # a directory where the file should be
    try:
        open_store(folder / "conversations.sqlite3")
    except sqlite3.OperationalError:
        pass
    else:
        raise AssertionError("opening a directory as the database should fail")
    assert not list(folder.glob("*corrupt*"))


# ---------------------------------------------------------------------------------------------- a full disk
def test_a_full_disk_while_a_reply_is_saved_keeps_it_in_the_window(qtbot, make_window):
    """SQLite's own limit (max_page_count) makes every write that grows the file fail with 'database or disk is
    full', as a full disk does. The reply goes on, stays in the window, a banner says why; when there is room
    again it is saved."""
    from fakes import ANSWER, REASONING, FakeEngine

    engine = FakeEngine(token_s=0.002)
    win = make_window(engine=engine)
    with qtbot.waitSignal(win.reply_finished, timeout=20000):
        assert win.send("first")  # the conversation and its rows exist before the disk fills
    pages = win.store.db.execute("PRAGMA page_count").fetchone()[0]
    win.store.db.execute(f"PRAGMA max_page_count = {pages}")
    engine.reasoning = REASONING * 6  # a reply that can't fit in the pages that are left
    with qtbot.waitSignal(win.reply_finished, timeout=30000) as blocker:
        assert win.send("second")
    msg = blocker.args[0]
    assert msg["reasoning"] == REASONING * 6 and msg["answer"] == ANSWER  # the window has all of it
    assert win.banner.kind == "save_failed" and "disk is full" in win.banner.label.text()
    assert msg["id"] in win.unsaved
    stored = win.store.message(msg["id"])
    assert len(stored["reasoning"]) < len(REASONING * 6)  # the disk really refused it
    shown = win.chat.widget_for(msg["id"])
    assert shown is not None and shown.answer == ANSWER
    win.open_conversation(win.conv_id)  # reopening the chat shows the reply from memory, not the stale row
    assert win.chat.widget_for(msg["id"]).answer == ANSWER

    win.store.db.execute("PRAGMA max_page_count = 1073741823")  # room again
    qtbot.waitUntil(lambda: not win.unsaved, timeout=10000)  # the retry timer writes it
    stored = win.store.message(msg["id"])
    assert stored["complete"] and stored["reasoning"] == REASONING * 6 and stored["answer"] == ANSWER
    assert win.banner.kind == "saved"


def _a_reply_the_disk_refused(qtbot, make_window):
    """A window whose second reply did not fit on the (made) full disk: (window, that reply's id)."""
    from fakes import REASONING, FakeEngine

    engine = FakeEngine(token_s=0.002)
    win = make_window(engine=engine)
    with qtbot.waitSignal(win.reply_finished, timeout=20000):
        assert win.send("first")
    pages = win.store.db.execute("PRAGMA page_count").fetchone()[0]
    win.store.db.execute(f"PRAGMA max_page_count = {pages}")
    engine.reasoning = REASONING * 6  # a reply that can't fit in the pages that are left
    with qtbot.waitSignal(win.reply_finished, timeout=30000) as blocker:
        assert win.send("second")
    msg_id = blocker.args[0]["id"]
    assert msg_id in win.unsaved
    return win, msg_id


def test_closing_with_a_reply_the_disk_refused_asks_first(qtbot, make_window, monkeypatch):
    """A reply the store refused exists only in the window: closing used to drop it without a word. Now the
    close asks; Cancel keeps the window (and r1desk's retries) going, Close closes."""
    from PySide6.QtWidgets import QMessageBox

    win, msg_id = _a_reply_the_disk_refused(qtbot, make_window)
    asked = []
    monkeypatch.setattr(QMessageBox, "warning", lambda *a, **k: asked.append(a[2]) or QMessageBox.Cancel)
    assert not win.close() and win.isVisible() and msg_id in win.unsaved
    assert len(asked) == 1 and "1 reply has not been saved" in asked[0]
    monkeypatch.setattr(QMessageBox, "warning", lambda *a, **k: QMessageBox.Close)
    assert win.close() and not win.isVisible()  # "close anyway"


def test_once_the_disk_takes_the_reply_the_window_closes_without_asking(qtbot, make_window, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    from fakes import REASONING

    win, msg_id = _a_reply_the_disk_refused(qtbot, make_window)
    win.store.db.execute("PRAGMA max_page_count = 1073741823")  # the user freed some space
    asked = []
    monkeypatch.setattr(QMessageBox, "warning", lambda *a, **k: asked.append(a) or QMessageBox.Cancel)
    assert win.close() and asked == []  # the close's own retry saved it
    assert win.store.message(msg_id)["reasoning"] == REASONING * 6


def test_a_full_disk_when_sending_keeps_the_message_in_the_box(qtbot, make_window):
    from fakes import FakeEngine

    win = make_window(engine=FakeEngine(token_s=0.002))
    pages = win.store.db.execute("PRAGMA page_count").fetchone()[0]
    win.store.db.execute(f"PRAGMA max_page_count = {pages}")
    text = "a question that will not fit " * 200
    win.composer.set_text(text)
    assert not win.send()
    assert win.composer.text() == text and win.stream is None
    assert win.banner.kind == "save_failed" and "still in the box" in win.banner.label.text()


def test_a_crash_log_left_by_a_run_with_this_very_pid_is_still_reported(tmp_path):
    """PIDs repeat: in a sandbox or container every start can get the same one. An earlier run's session files
    that name this process's PID used to look like its own live session: not reported, then overwritten, and
    its lock left behind for good. Here the leftover lock holds what this process's own lock would."""
    from PySide6.QtCore import QLockFile

    from desktop.crashlog import CrashLog

    probe = QLockFile(str(tmp_path / "probe.lock"))
    assert probe.tryLock(0)
    mine = (tmp_path / "probe.lock").read_bytes()  # the lock this process writes: its PID, host and name
    probe.unlock()
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / f"session-{os.getpid()}-0badc0de.lock").write_bytes(mine)
    (logs / f"session-{os.getpid()}-0badc0de.log").write_text("Fatal Python error: Segmentation fault\n")
    crash = CrashLog(logs).collect_previous()
    assert crash is not None and crash.fatal and "Segmentation fault" in crash.log_path.read_text()
    assert not list(logs.glob("session-*"))
    live = CrashLog(logs)
    assert live.start()  # a lock this process holds is not taken for a leftover
    assert CrashLog(logs).collect_previous() is None and live.path.exists()
    live.stop()


def test_a_data_folder_that_cant_be_written_costs_the_crash_log_not_the_start(tmp_path):
    from desktop.crashlog import CrashLog

    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    log = CrashLog(blocked / "logs")
    assert log.start() is False and log.path is None
    log.note("nothing to write to")  # and the rest of its use is harmless
    log.stop()
