"""The window's states after the things that go wrong in a chat: a reply that fails, a reload that fails, a
theme change mid-reply, history actions while a reply is written or a message is being edited."""

from __future__ import annotations

from PySide6.QtCore import Qt

import fakes
from fakes import FakeEngine, OutOfMemoryError, reply


class MidFailEngine(FakeEngine):
    """Streams some reasoning, then runs out of GPU memory mid-reply."""

    def generate(self, messages, settings=None, control=None, tools=None, continue_final=False):
        for i, event in enumerate(FakeEngine.generate(self, messages, settings, control)):
            if i > 12:
                raise OutOfMemoryError("out of GPU memory while generating")
            yield event


def test_the_live_panel_stops_at_a_failed_reply(qtbot, make_window):
    """A reply that failed stayed "live" in the panel: its TTFT said "waiting…" for ever, or its thinking time
    and speed curve went on growing at every tick."""
    win = make_window(engine=FakeEngine(fail_generate=OutOfMemoryError("oom")))
    win.set_live_visible(True)
    with qtbot.waitSignal(win.reply_failed, timeout=10000):
        win.send("hi")
    win.live.refresh()
    assert win.live.values["ttft"].text() == "failed"
    win = make_window(engine=MidFailEngine(token_s=0.005))
    win.set_live_visible(True)
    with qtbot.waitSignal(win.reply_failed, timeout=10000):
        win.send("hi")
    win.live.refresh()
    split, points = win.live.values["split"].text(), len(win.live.reply.rate_series)
    for _ in range(5):  # the panel's ticks go on
        win.live.refresh()
    assert win.live.values["split"].text() == split and len(win.live.reply.rate_series) == points


def test_a_failed_reload_leaves_no_old_model_in_the_live_panel(qtbot, make_window):
    """The worker drops the old model before loading the next: its weights and device stayed on show."""
    engine = FakeEngine(token_s=0.0)
    win = make_window(engine=engine)
    win.set_live_visible(True)
    assert win.live.values["weights"].text() != "—"
    win.service.host.worker.engine_factory = fakes.factory(engine, OutOfMemoryError("oom while loading"))
    new = win.settings.__class__(**vars(win.settings))
    new.context_length = 2048
    with qtbot.waitSignal(win.engine_failed, timeout=10000):
        win.apply_settings(new)
    assert win.live.values["weights"].text() == "—" and win.live.device_label.text() == "No model loaded"


def test_a_theme_change_mid_reply_reaches_every_message_when_it_ends(qtbot, make_window):
    engine = FakeEngine(token_s=0.0)
    win = make_window(engine=engine, theme="light")
    reply(qtbot, win, "first")
    engine.token_s = 0.01
    win.send("second")
    qtbot.waitUntil(lambda: win.stream is not None and len(win.stream.reasoning) > 20, timeout=10000)
    new = win.settings.__class__(**vars(win.settings))
    new.theme = "dark"
    with qtbot.waitSignal(win.reply_finished, timeout=20000):
        win.apply_settings(new)
    css = win.renderer.stylesheet()
    assert all(w.body.document().defaultStyleSheet() == css for w in win.chat.widgets if w.role == "assistant")


def test_a_regenerate_before_the_message_being_edited_ends_the_edit(qtbot, make_window):
    """Regenerating an earlier reply deleted the message being edited too, but the edit stayed: its Send then
    deleted everything from that message's id on, the regenerated reply included."""
    win = make_window(engine=FakeEngine(token_s=0.0))
    reply(qtbot, win, "question one")
    reply(qtbot, win, "question two")
    reply1, user2 = win.store.messages(win.conv_id)[1:3]
    win._on_message_action("edit", user2["id"])
    with qtbot.waitSignal(win.reply_finished, timeout=20000) as blocker:
        win._on_message_action("regenerate", reply1["id"])
    regenerated = blocker.args[0]["id"]
    assert win.editing_msg_id is None and not win.composer.editing_label.isVisible()
    reply(qtbot, win, "a follow-up")
    assert regenerated in [m["id"] for m in win.store.messages(win.conv_id)]


def test_a_regenerate_that_cant_start_keeps_the_old_reply(qtbot, make_window):
    """With the queue full (API requests waiting), the old reply was deleted and nothing took its place."""
    win = make_window(engine=FakeEngine(token_s=0.0))
    old = reply(qtbot, win, "question")
    win.service.max_waiting = len(win.service.waiting)  # as full as 16 waiting API requests make it
    win._on_message_action("regenerate", old["id"])
    assert win.store.message(old["id"]) is not None and "could not start" in win.banner.label.text()


def test_enter_after_a_failed_load_keeps_its_banner_and_ways_out(qtbot, make_window):
    win = make_window(fail_load=RuntimeError("bad weights"), wait_ready=False)
    with qtbot.waitSignal(win.engine_failed, timeout=20000):
        pass
    kind, buttons = win.banner.kind, [b.text() for b in win.banner.action_buttons()]
    win.stack.setCurrentWidget(win.chat_page)
    win.composer.edit.setPlainText("hello")
    qtbot.keyClick(win.composer.edit, Qt.Key_Return)
    assert (win.banner.kind, [b.text() for b in win.banner.action_buttons()]) == (kind, buttons)
    assert win.composer.text() == "hello"


def test_history_actions_are_off_while_a_reply_is_written(qtbot, make_window):
    """They looked usable mid-reply and did nothing when clicked."""
    engine = FakeEngine(token_s=0.0)
    win = make_window(engine=engine)
    old = reply(qtbot, win, "question")
    engine.token_s = 0.01
    win.send("again")
    qtbot.waitUntil(lambda: win.stream is not None and len(win.stream.reasoning) > 20, timeout=10000)
    buttons = win.chat.widget_for(old["id"]).buttons
    assert not buttons["regenerate"].isEnabled() and not buttons["delete"].isEnabled()
    assert buttons["copy"].isEnabled()
    with qtbot.waitSignal(win.reply_finished, timeout=10000):
        win.stop()
    assert buttons["regenerate"].isEnabled() and win.chat.widgets[0].buttons["edit"].isEnabled()


def test_a_reply_kept_after_an_error_says_so(qtbot, make_window):
    win = make_window(engine=MidFailEngine(token_s=0.005))
    with qtbot.waitSignal(win.reply_failed, timeout=10000):
        win.send("hi")
    win.open_conversation(win.conv_id)  # as after a restart, when the banner is gone
    w = win.chat.widgets[-1]
    assert "stopped by an error" in w.meta.text() and "stopped by an error" in w.reasoning_block.toggle.text()
