"""Window interaction: keyboard, conversation list, per-message actions, settings, theme, live panel, first run."""

from __future__ import annotations

import shutil

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

from desktop.live_figures import memory_read
from desktop.settings import AppSettings, SettingsDialog
from desktop.theme import DARK
from fakes import ANSWER, FAKE_KV_TOKEN, FAKE_WEIGHT_READ, FakeEngine


def _reply(qtbot, win, text):
    with qtbot.waitSignal(win.reply_finished, timeout=20000) as blocker:
        assert win.send(text)
    return blocker.args[0]


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


def test_conversation_list_search_rename_delete(qtbot, make_window, monkeypatch):
    win = make_window(engine=FakeEngine(token_s=0.0))
    _reply(qtbot, win, "Tell me about pelicans")
    pelicans = win.conv_id
    win.new_chat()
    _reply(qtbot, win, "Integrate x squared")
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


def test_message_actions_copy_edit_regenerate_delete(qtbot, make_window):
    engine = FakeEngine(token_s=0.0)
    win = make_window(engine=engine)
    _reply(qtbot, win, "first question")
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

    _reply(qtbot, win, "second question")
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
    _reply(qtbot, win, "chat A question")
    chat_a = win.conv_id
    win.new_chat()
    _reply(qtbot, win, "chat B question")
    chat_b = win.conv_id
    win.open_conversation(chat_a)
    qtbot.mouseClick(win.chat.widgets[0].buttons["edit"], Qt.LeftButton)
    assert win.composer.editing_label.isVisible()
    win.open_conversation(chat_b)
    assert not win.composer.editing_label.isVisible() and win.composer.text() == "chat A question"  # kept
    _reply(qtbot, win, "chat B follow-up")
    assert [m["content"] for m in win.store.messages(chat_b) if m["role"] == "user"] == [
        "chat B question",
        "chat B follow-up",
    ]
    assert [m["content"] for m in win.store.messages(chat_a) if m["role"] == "user"] == ["chat A question"]
    # the same through a new chat
    win.open_conversation(chat_a)
    qtbot.mouseClick(win.chat.widgets[0].buttons["edit"], Qt.LeftButton)
    win.new_chat()
    _reply(qtbot, win, "chat C question")
    assert len(win.store.messages(chat_a)) == 2 and len(win.store.messages(chat_b)) == 4


def test_a_store_that_refuses_a_change_is_said_and_nothing_is_lost(qtbot, make_window, monkeypatch):
    """Rename, delete (a chat, a message), regenerate and an edit's resend on a database that refuses writes
    (here: locked by another program): each says what it could not do and why, the chat stays as it was, and
    the window goes on working. They used to raise out of the click."""
    import sqlite3

    win = make_window(engine=FakeEngine(token_s=0.0))
    _reply(qtbot, win, "question")
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
    _reply(qtbot, win, "hello")
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


def test_a_hand_edited_settings_file_loads_what_makes_sense_and_defaults_the_rest(tmp_path):
    """An ini file edited by hand (or by an older version): a comma left unquoted made QSettings hand back a
    list, stored as "['Be brief', 'be clear']"; nan, 0-point fonts, ports past 65535, negative contexts and
    unknown choices were taken as they were (nan reached the sampler)."""
    from PySide6.QtCore import QSettings

    ini = tmp_path / "r1desk.ini"
    ini.write_text(
        "[settings]\nsystem_prompt=Be brief, be clear\napi_origins=http://a.example, http://b.example\n"
        "temperature=nan\ntop_p=0.9\nfont_size=0\napi_port=70000\ncontext_length=-5\n"
        "max_new_tokens=2048\ntheme=purple\nprecision=int3\ndevice=cuda:1\nkv_cache=8-bit\n"
        "version=2\n"
    )
    s = AppSettings.load(QSettings(str(ini), QSettings.IniFormat))
    d = AppSettings()
    assert s.system_prompt == "Be brief, be clear" and s.api_origins == "http://a.example, http://b.example"
    assert (s.temperature, s.font_size, s.api_port, s.context_length, s.theme, s.precision) == (
        d.temperature,
        d.font_size,
        d.api_port,
        d.context_length,
        d.theme,
        d.precision,
    )
    assert (s.top_p, s.max_new_tokens, s.device, s.kv_cache) == (0.9, 2048, "cuda:1", "8-bit")  # sensible: kept


def test_settings_defaults_and_effect_on_the_next_reply(qtbot, make_window):
    d = AppSettings()
    assert (d.temperature, d.top_p, d.system_prompt, d.theme) == (0.6, 0.95, "", "system")
    dlg = SettingsDialog(d)
    qtbot.addWidget(dlg)
    assert dlg.result_settings() == d  # the dialog round-trips every field
    engine = FakeEngine(token_s=0.0)
    win = make_window(engine=engine)
    _reply(qtbot, win, "one")
    assert engine.prompts[-1][0]["role"] == "user"  # no system prompt by default, as DeepSeek advises
    new = AppSettings(
        **{
            **d.__dict__,
            "model_path": win.settings.model_path,
            "device": "cpu",
            "temperature": 0.3,
            "top_k": 20,
            "max_new_tokens": 512,
            "system_prompt": "Be brief.",
        }
    )
    win.apply_settings(new)
    msg = _reply(qtbot, win, "two")
    s = engine.settings_seen[-1]
    assert (s.temperature, s.top_k, s.max_new_tokens) == (0.3, 20, 512)
    assert msg["settings"]["temperature"] == 0.3  # each reply keeps the settings it was made with
    assert engine.prompts[-1][0] == {"role": "system", "content": "Be brief."}
    assert AppSettings.load(win.qs).temperature == 0.3  # persisted


def test_dark_theme(qtbot, make_window):
    win = make_window(engine=FakeEngine(token_s=0.0))
    _reply(qtbot, win, "hello")
    win.apply_settings(AppSettings(**{**win.settings.__dict__, "theme": "dark"}))
    assert QApplication.palette().window().color().name() == DARK.window
    assert win.renderer.theme is DARK
    # the conversation was re-rendered with the dark palette (math images included)
    assert DARK.text in win.chat.widgets[-1].body.document().defaultStyleSheet()


def test_live_panel_numbers(qtbot, make_window):
    # 4 tokens per delta: the live counts must come from the engine's token count, not from counting deltas
    engine = FakeEngine(token_s=0.002, tokens_per_delta=4, prefill_s=0.5)
    win = make_window(engine=engine)
    win.topbar.live_btn.setChecked(True)
    assert win.live.timer.interval() >= 100  # a few times a second, never per token
    _reply(qtbot, win, "hello")  # a first exchange, so the second reply reuses a prefix and shows it
    deltas = []
    win.service.host.worker.delta.connect(lambda *a: deltas.append(a), Qt.DirectConnection)  # counted as emitted
    win.send("and again")
    v = win.live.values
    # context use shows as soon as the prompt is prefilled, before the first token and throughout the reply
    prompt, reused = 40 + 30 * 3, 30 * 3 - 10  # the fake engine's numbers for a 3-message prompt
    qtbot.waitUntil(lambda: v["reused"].text() == f"{reused} of {prompt}", timeout=10000)
    assert win.stream is not None and win.live.reply.first_t is None  # still prefilling: no token yet
    assert v["ctx"].text() == f"{prompt} / 4,096 (3%)"
    qtbot.waitUntil(lambda: win.live.reply.count >= 60, timeout=10000)
    assert win.stream is not None  # mid-reply
    win.live.refresh()
    r = win.live.reply
    used = prompt + r.count
    assert v["ctx"].text() == f"{used} / 4,096 ({100 * used / 4096:.0f}%)"
    assert v["tokens"].text() == f"{r.reasoning_n} + {r.answer_n}" and r.reasoning_n + r.answer_n == r.count
    # what a decode step reads, live: the model's weights (engine info) and the cache up to the average step so far
    cache = FAKE_KV_TOKEN * (prompt + r.count / 2)
    assert v["read"].text() == f"{(FAKE_WEIGHT_READ + cache) / 1e9:.2f} GB"
    assert v["read_rate"].text().endswith("B/s") and f"{cache / 1e9:.2f} GB of KV cache" in v["read"].toolTip()
    qtbot.waitUntil(lambda: v["rate"].text() not in ("—", "0"), timeout=10000)
    assert int(v["rate"].text()) > 200  # ~450 tok/s of tokens; counting deltas would say ~115
    assert v["ttft"].text().endswith("ms")
    with qtbot.waitSignal(win.reply_finished, timeout=20000) as blocker:
        pass
    s = blocker.args[0]["stats"]
    win.live.refresh()
    assert v["ttft"].text() == f"{s['ttft_ms']:.0f} ms"
    assert v["ttft"].toolTip() == (
        f"Chat template and tokenizer: 0.5 ms\nPrefill of {prompt - reused} new tokens "
        f"({reused} cached) and the first token: {s['ttft_ms'] - 0.5:.1f} ms"
    )
    assert v["tokens"].text() == f"{s['reasoning_tokens']} + {s['completion_tokens'] - s['reasoning_tokens']}"
    assert v["ctx"].text().endswith("/ 4,096 (" + f"{100 * (s['prompt_tokens'] + s['completion_tokens']) / 4096:.0f}%)")
    assert win.live.reply.count == s["completion_tokens"] == 4 * len(deltas) and s["prompt_tokens"] == prompt
    assert v["replies"].text() == "2" and "ms" in v["ttft_p"].text()
    assert v["weights"].text() == "3.31 GiB" and v["kv"].text() == "112 MiB"
    assert len(win.live.rate_plot.values) > 3 and win.live.latency_plot.values[-1] == s["ttft_ms"]
    # what the average decode step read (the engine's figure) and at what rate: bytes x the reply's tok/s
    read, cache = s["decode_read_bytes"], s["decode_cache_read_bytes"]
    assert 0 < cache < read
    gb_s = read * s["decode_tok_s"] / 1e9
    assert v["read"].text() == f"{read / 1e9:.2f} GB"
    assert v["read_rate"].text() == (f"{gb_s / 1000:.2f} TB/s" if gb_s >= 1000 else f"{gb_s:.0f} GB/s")
    assert f"{(read - cache) / 1e9:.2f} GB of weights and {cache / 1e9:.2f} GB of KV cache" in v["read"].toolTip()
    assert memory_read(0.0, 0.0, 0.0) == ("—", "—", "")  # no decode step, or a reply saved without these


def test_first_run_lists_local_models_and_loads_the_chosen_one(qtbot, make_window, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))  # r1desk's own models folder (platformdirs)
    shutil.copytree(tiny_model, tmp_path / "xdg" / "r1desk" / "models" / "tiny-r1")
    win = make_window(model=None, wait_ready=False)
    assert win.stack.currentWidget() is win.welcome
    qtbot.waitUntil(lambda: not win.welcome.scanning, timeout=30000)
    labels = [win.welcome.found.item(i).text() for i in range(win.welcome.found.count())]
    assert any(label.startswith("tiny-r1") for label in labels)
    win.welcome.found.setCurrentRow(next(i for i, lb in enumerate(labels) if lb.startswith("tiny-r1")))
    with qtbot.waitSignal(win.engine_ready, timeout=60000):
        qtbot.mouseClick(win.welcome.use_btn, Qt.LeftButton)
    assert win.stack.currentWidget() is win.chat_page
    assert AppSettings.load(win.qs).model_path.endswith("tiny-r1")  # remembered for the next start


def test_system_theme_is_followed_live(qtbot, make_window, monkeypatch):
    from desktop import theme as themes

    win = make_window(engine=FakeEngine(token_s=0.0))
    assert win.settings.theme == "system"
    # The offscreen platform has no colour scheme of its own: stand in for the OS switching to dark.
    monkeypatch.setattr(themes, "system_is_dark", lambda: True)
    QGuiApplication.styleHints().colorSchemeChanged.emit(Qt.ColorScheme.Dark)
    assert QApplication.palette().window().color().name() == DARK.window and win.theme is DARK


def test_the_welcome_page_fits_the_smallest_window(qtbot, make_window):
    """At the window's minimum size (760 x 520) the welcome card gives every button and the 4-bit checkbox the
    width its text needs (they were squeezed to cut-off labels such as "se selected mod"), nothing runs past the
    page's right edge, and the wrapped introduction gets the height of its lines."""
    win = make_window(start=False, size=(760, 520))
    page = win.welcome
    qtbot.waitUntil(lambda: page.isVisible() and not page.scanning, timeout=10000)
    qtbot.waitUntil(lambda: page.card.width() < page.CARD_WIDTH, timeout=5000)  # the narrow layout is in effect
    for w in (page.use_btn, page.folder_btn, page.rescan_btn, page.download_btn, page.quantize_box):
        assert w.width() >= w.sizeHint().width(), (w.text(), w.width(), w.sizeHint().width())
        right = w.mapTo(page, w.rect().topRight()).x()
        assert right < page.width(), (w.text(), right, page.width())
    assert page.message.height() >= page.message.heightForWidth(page.message.width())


def test_the_live_panel_fits_beside_the_chat_in_a_narrow_window(qtbot, make_window, monkeypatch):
    """Opening the live panel in the smallest window used to overflow it: the window kept its fixed minimum, so
    the panel's right side, the top bar's buttons ("…") and the composer's placeholder were cut off. Now the
    window's minimum grows to what the visible columns need (never wider than the screen), and shrinks back
    when the panel closes; the composer shows a placeholder that fits its box."""
    from PySide6.QtCore import QRect

    from desktop.composer import PLACEHOLDER, PLACEHOLDER_SHORT

    win = make_window(engine=FakeEngine(), size=(760, 520))  # the chat page, with its composer
    screen = win.screen().availableGeometry().width()  # the offscreen screen: 800 px
    win.set_live_visible(True)
    qtbot.waitUntil(lambda: win.minimumWidth() == min(win.splitter.minimumSizeHint().width(), screen), timeout=5000)

    class WideScreen:  # a desktop monitor, where the columns fit
        @staticmethod
        def availableGeometry():
            return QRect(0, 0, 1920, 1080)

    monkeypatch.setattr(win, "screen", lambda: WideScreen)
    win.set_live_visible(False)
    win.set_live_visible(True)
    win.resize(760, 520)  # as small as it will go
    qtbot.waitUntil(
        lambda: win.live.isVisible() and win.width() >= win.splitter.minimumSizeHint().width(), timeout=5000
    )
    assert win.width() > 760
    panel_right = win.live.mapTo(win, win.live.rect().topRight()).x()
    assert panel_right < win.width()
    for button in (win.topbar.menu_btn, win.topbar.live_btn, win.topbar.settings_btn):
        assert button.width() >= button.sizeHint().width(), button.text()
    edit = win.composer.edit
    room = edit.viewport().width() - 2 * edit.document().documentMargin()
    assert edit.fontMetrics().horizontalAdvance(edit.placeholderText()) <= room
    assert edit.placeholderText() == PLACEHOLDER_SHORT  # the long one does not fit the column beside the panel
    win.set_live_visible(False)
    win.resize(760, 520)
    qtbot.waitUntil(lambda: win.width() < 900, timeout=5000)  # the minimum shrinks back with the panel closed
    win.resize(1300, 820)
    qtbot.waitUntil(lambda: edit.placeholderText() == PLACEHOLDER, timeout=5000)  # wide again: the full hint
