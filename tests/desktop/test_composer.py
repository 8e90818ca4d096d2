"""The composer and the banner (desktop.composer), as widgets: Enter sends and Shift+Enter breaks the line, the
box grows to eight lines then scrolls, the buttons follow a reply's state, the placeholder fits the box, and the
banner's actions are the last message's."""

from __future__ import annotations

from PySide6.QtCore import Qt

from desktop.composer import PLACEHOLDER, PLACEHOLDER_SHORT, Banner, Composer


def _composer(qtbot, width=700):
    composer = Composer()
    qtbot.addWidget(composer)
    composer.resize(width, 80)
    composer.show()
    qtbot.waitExposed(composer)
    return composer


def test_enter_sends_and_shift_enter_breaks_the_line(qtbot):
    composer = _composer(qtbot)
    sent = []
    composer.send_requested.connect(lambda: sent.append(composer.text()))
    qtbot.keyClicks(composer.edit, "line one")
    qtbot.keyClick(composer.edit, Qt.Key_Return, Qt.ShiftModifier)
    qtbot.keyClicks(composer.edit, "line two")
    assert sent == [] and composer.text() == "line one\nline two"
    qtbot.keyClick(composer.edit, Qt.Key_Return)
    qtbot.keyClick(composer.edit, Qt.Key_Enter, Qt.KeypadModifier)  # the keypad's Enter too
    assert sent == ["line one\nline two"] * 2 and composer.text() == "line one\nline two"  # no newline typed


def test_the_box_grows_to_eight_lines_then_scrolls(qtbot):
    composer = _composer(qtbot)
    one = composer.edit.height()
    composer.set_text("a\nb\nc")
    three = composer.edit.height()
    composer.set_text("\n".join("line" for _ in range(8)))
    eight = composer.edit.height()
    composer.set_text("\n".join("line" for _ in range(30)))
    assert one < three < eight == composer.edit.height()
    assert composer.edit.verticalScrollBarPolicy() == Qt.ScrollBarAsNeeded
    composer.set_text("short")
    assert composer.edit.height() == one and composer.edit.verticalScrollBarPolicy() == Qt.ScrollBarAlwaysOff


def test_the_buttons_follow_the_replys_state(qtbot):
    composer = _composer(qtbot)
    composer.set_vote_chains(5)
    assert composer.vote_btn.text() == "Ask ×5" and "Sample 5 reasoning chains" in composer.vote_btn.toolTip()

    def shown():
        return composer.send_btn.text(), composer.stop_thinking_btn.isVisible(), composer.vote_btn.isVisible()

    assert shown() == ("Send", False, True)
    composer.set_generating(True, thinking=True)
    assert shown() == ("Stop", True, False) and composer.send_btn.accessibleName() == "Stop"
    composer.set_generating(True, thinking=False)  # the answer has started: nothing left to stop thinking
    assert shown() == ("Stop", False, False)
    composer.set_generating(False)
    assert shown() == ("Send", False, True)


def test_the_placeholder_is_the_one_that_fits_the_box(qtbot):
    composer = _composer(qtbot, width=900)
    qtbot.waitUntil(lambda: composer.edit.placeholderText() == PLACEHOLDER, timeout=5000)
    composer.resize(260, 80)
    qtbot.waitUntil(lambda: composer.edit.placeholderText() == PLACEHOLDER_SHORT, timeout=5000)
    composer.resize(900, 80)
    qtbot.waitUntil(lambda: composer.edit.placeholderText() == PLACEHOLDER, timeout=5000)


def test_the_banner_shows_the_last_messages_actions(qtbot):
    banner = Banner()
    qtbot.addWidget(banner)
    assert banner.isHidden()
    clicked = []
    banner.show_message("error", "First", [("Retry", lambda: clicked.append("retry"))])
    banner.show_message("info", "Second", [("Use CPU", lambda: clicked.append("cpu")), ("Dismiss", banner.hide)])
    qtbot.waitUntil(lambda: len(banner.action_buttons()) == 2)  # the first message's button is gone
    assert (banner.kind, banner.label.text()) == ("info", "Second") and not banner.isHidden()
    use_cpu, dismiss = banner.action_buttons()
    assert use_cpu.text() == "Use CPU" and use_cpu.accessibleName() == "Use CPU"
    qtbot.mouseClick(use_cpu, Qt.LeftButton)
    assert clicked == ["cpu"]
    qtbot.mouseClick(dismiss, Qt.LeftButton)
    assert banner.isHidden()
