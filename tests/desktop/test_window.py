"""Window interaction (desktop.window): keyboard, per-message actions, edits, a store that refuses a change,
accessible names. The conversation list: test_sidebar; settings: test_settings; themes: test_theme; the live
panel: test_livepanel; the first run: test_welcome."""

from __future__ import annotations


from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QAbstractButton,
    QApplication,
    QInputDialog,
    QLineEdit,
    QListWidget,
    QPlainTextEdit,
    QWidget,
)

from fakes import ANSWER, FakeEngine, reply


def test_keyboard(qtbot, make_window):
    win = make_window(engine=FakeEngine(token_s=0.0))
    win.activateWindow()  # window shortcuts need the active window
    qtbot.waitUntil(win.isActiveWindow)
    edit = win.composer.edit
    edit.setFocus()
    qtbot.keyClicks(edit, "line one")
    qtbot.keyClick(edit, Qt.Key_Return, Qt.ShiftModifier)  # Shift+Enter: a new line, not a send
    qtbot.keyClicks(edit, "line two")
    assert win.stream is None and edit.toPlainText() == "line one\nline two"
    with qtbot.waitSignal(win.reply_finished, timeout=20000):
        qtbot.keyClick(edit, Qt.Key_Return)
    assert win.store.messages(win.conv_id)[0]["content"] == "line one\nline two" and edit.toPlainText() == ""
    assert [w for w in QApplication.topLevelWidgets() if w.isVisible()] == [win]  # nothing orphaned shows up
    qtbot.waitUntil(win.isActiveWindow)
    qtbot.keyClick(win, Qt.Key_N, Qt.ControlModifier)
    assert win.conv_id is None and not win.chat.widgets
    for key in (Qt.Key_K, Qt.Key_F):
        edit.setFocus()
        qtbot.keyClick(win, key, Qt.ControlModifier)
        assert QApplication.focusWidget() is win.sidebar.search
    opened = []

    def close_dialog():
        dlg = QApplication.activeModalWidget()
        opened.append(type(dlg).__name__)
        dlg.reject()

    QTimer.singleShot(0, close_dialog)
    qtbot.keyClick(win, Qt.Key_Comma, Qt.ControlModifier)
    assert opened == ["SettingsDialog"]


def test_message_actions_copy_edit_regenerate_delete(qtbot, make_window):
    engine = FakeEngine(token_s=0.0)
    win = make_window(engine=engine)
    reply(qtbot, win, "first question")
    user_w, bot_w = win.chat.widgets
    qtbot.mouseClick(bot_w.buttons["copy"], Qt.LeftButton)
    assert QGuiApplication.clipboard().text() == ANSWER
    qtbot.mouseClick(user_w.buttons["copy"], Qt.LeftButton)
    assert QGuiApplication.clipboard().text() == "first question"

    with qtbot.waitSignal(win.reply_finished, timeout=20000):
        qtbot.mouseClick(bot_w.buttons["regenerate"], Qt.LeftButton)
    msgs = win.store.messages(win.conv_id)
    assert [m["role"] for m in msgs] == ["user", "assistant"] and msgs[1]["id"] != bot_w.msg_id
    assert len(engine.prompts) == 2 and engine.prompts[1] == [{"role": "user", "content": "first question"}]

    qtbot.mouseClick(win.chat.widgets[0].buttons["edit"], Qt.LeftButton)
    assert win.composer.text() == "first question" and win.composer.editing_label.isVisible()
    win.composer.edit.setPlainText("edited question")
    with qtbot.waitSignal(win.reply_finished, timeout=20000):
        qtbot.keyClick(win.composer.edit, Qt.Key_Return)
    msgs = win.store.messages(win.conv_id)
    assert [m["content"] for m in msgs if m["role"] == "user"] == ["edited question"] and len(msgs) == 2
    assert [w.role for w in win.chat.widgets] == ["user", "assistant"]

    reply(qtbot, win, "second question")
    # earlier replies go back into the prompt as their answer only, never their reasoning
    # (marked as the answer already: the prompt takes it as it is, model_loader.chat.history_message)
    assert engine.prompts[-1][1] == {"role": "assistant", "content": ANSWER, "answer_only": True}
    qtbot.mouseClick(win.chat.widgets[-1].buttons["delete"], Qt.LeftButton)
    assert [m["content"] for m in win.store.messages(win.conv_id)][-1] == "second question"
    assert len(win.chat.widgets) == 3


def test_an_edit_stays_with_its_chat(qtbot, make_window):
    """Edit a message, then go to another chat (or a new one) and send there: the message goes to that chat as
    a new one, and nothing is replaced anywhere. The edit used to follow the window: its send deleted that
    chat's messages from the edited message's id on (ids are global and grow, so all of a newer chat's)."""
    win = make_window(engine=FakeEngine(token_s=0.0))
    reply(qtbot, win, "chat A question")
    chat_a = win.conv_id
    win.new_chat()
    reply(qtbot, win, "chat B question")
    chat_b = win.conv_id
    win.open_conversation(chat_a)
    qtbot.mouseClick(win.chat.widgets[0].buttons["edit"], Qt.LeftButton)
    assert win.composer.editing_label.isVisible()
    win.open_conversation(chat_b)
    assert not win.composer.editing_label.isVisible() and win.composer.text() == "chat A question"  # kept
    reply(qtbot, win, "chat B follow-up")
    assert [m["content"] for m in win.store.messages(chat_b) if m["role"] == "user"] == [
        "chat B question",
        "chat B follow-up",
    ]
    assert [m["content"] for m in win.store.messages(chat_a) if m["role"] == "user"] == ["chat A question"]
    # the same through a new chat
    win.open_conversation(chat_a)
    qtbot.mouseClick(win.chat.widgets[0].buttons["edit"], Qt.LeftButton)
    win.new_chat()
    reply(qtbot, win, "chat C question")
    assert len(win.store.messages(chat_a)) == 2 and len(win.store.messages(chat_b)) == 4


def test_a_store_that_refuses_a_change_is_said_and_nothing_is_lost(qtbot, make_window, monkeypatch):
    """Rename, delete (a chat, a message), regenerate and an edit's resend on a database that refuses writes
    (here: locked by another program): each says what it could not do and why, the chat stays as it was, and
    the window goes on working. They used to raise out of the click."""
    import sqlite3

    win = make_window(engine=FakeEngine(token_s=0.0))
    reply(qtbot, win, "question")
    conv = win.conv_id
    before = win.store.messages(conv)

    def locked(*args, **kwargs):
        raise sqlite3.OperationalError("database is locked")

    for name in ("rename", "delete_conversation", "delete_message", "delete_from"):
        monkeypatch.setattr(win.store, name, locked)
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("New title", True))
    user_w, bot_w = win.chat.widgets
    actions = [
        ("rename the chat", lambda: win.rename_conversation(conv)),
        ("delete the chat", lambda: win.delete_conversation(conv, confirm=False)),
        ("delete the message", lambda: qtbot.mouseClick(bot_w.buttons["delete"], Qt.LeftButton)),
        ("regenerate the reply", lambda: qtbot.mouseClick(bot_w.buttons["regenerate"], Qt.LeftButton)),
    ]
    for what, act in actions:
        win.banner.hide()
        act()
        assert win.banner.isVisible() and win.banner.kind == "save_failed", what
        text = win.banner.label.text()
        assert text.startswith(f"Could not {what}: ") and "another program" in text
    qtbot.mouseClick(user_w.buttons["edit"], Qt.LeftButton)
    win.composer.edit.setPlainText("edited")
    assert not win.send()
    assert "Could not replace the edited message" in win.banner.label.text() and win.composer.text() == "edited"
    assert win.store.messages(conv) == before and win.conv_id == conv and len(win.chat.widgets) == 2
    assert win.topbar.title_label.text() != "New title" and win.stream is None


def test_controls_have_accessible_names(qtbot, make_window):
    win = make_window(engine=FakeEngine(token_s=0.0))
    reply(qtbot, win, "hello")
    win.topbar.live_btn.setChecked(True)
    missing = [
        f"{type(w).__name__} {getattr(w, 'text', lambda: '')()!r}"
        for w in win.findChildren(QWidget)
        if isinstance(w, (QAbstractButton, QLineEdit, QPlainTextEdit, QListWidget))
        and w.isVisible()
        and not w.accessibleName()
        and w.objectName() != "qt_scrollarea_viewport"
    ]
    assert missing == []
