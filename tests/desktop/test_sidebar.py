"""The sidebar (desktop.sidebar) in the window: the conversation list searched by title and message text, a
chat opened, renamed and deleted from it, and Esc in the search box."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QInputDialog

from fakes import FakeEngine, reply


def test_conversation_list_search_rename_delete(qtbot, make_window, monkeypatch):
    win = make_window(engine=FakeEngine(token_s=0.0))
    reply(qtbot, win, "Tell me about pelicans")
    pelicans = win.conv_id
    win.new_chat()
    reply(qtbot, win, "Integrate x squared")
    assert win.sidebar.conv_list.count() == 2
    win.sidebar.search.setText("PELICAN")  # search by message text, case-insensitive
    assert win.sidebar.conv_list.count() == 1 and win.sidebar.conv_list.item(0).data(Qt.UserRole) == pelicans
    win.sidebar.search.setText("perfect square")  # matches reply text too (both replies contain it)
    assert win.sidebar.conv_list.count() == 2
    win.sidebar.search.clear()
    win.sidebar.conv_list.setCurrentRow(1)  # clicking a chat opens it
    assert win.conv_id == pelicans and win.chat.widgets[0].answer == "Tell me about pelicans"
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("Birds", True))
    win.rename_conversation(pelicans)
    assert win.topbar.title_label.text() == "Birds" and win.store.conversation(pelicans)["title"] == "Birds"
    assert "Birds" in [win.sidebar.conv_list.item(i).text() for i in range(win.sidebar.conv_list.count())]
    win.delete_conversation(pelicans, confirm=False)
    assert win.store.conversation(pelicans) is None and win.sidebar.conv_list.count() == 1 and win.conv_id is None


def test_esc_in_the_search_box_clears_the_search_and_leaves_the_reply(qtbot, make_window):
    engine = FakeEngine(token_s=0.0)
    win = make_window(engine=engine)
    win.activateWindow()  # window shortcuts need the active window
    reply(qtbot, win, "question")
    engine.token_s = 0.01
    win.send("again")
    qtbot.waitUntil(lambda: win.stream is not None and len(win.stream.reasoning) > 20, timeout=10000)
    win.focus_search()
    qtbot.keyClicks(win.sidebar.search, "ques")
    qtbot.keyClick(win.sidebar.search, Qt.Key_Escape)
    assert win.sidebar.search.text() == "" and win.stream is not None  # the reply goes on
    with qtbot.waitSignal(win.reply_finished, timeout=10000):
        qtbot.keyClick(win.sidebar.search, Qt.Key_Escape)  # a second Esc, with nothing to clear, stops it
