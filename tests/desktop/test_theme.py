"""Light and dark themes (desktop.theme) in the window: a switch to dark re-renders the conversation, and the
system's colour scheme is followed live."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication

from desktop.settings import AppSettings
from desktop.theme import DARK
from fakes import FakeEngine, reply


def test_dark_theme(qtbot, make_window):
    win = make_window(engine=FakeEngine(token_s=0.0))
    reply(qtbot, win, "hello")
    win.apply_settings(AppSettings(**{**win.settings.__dict__, "theme": "dark"}))
    assert QApplication.palette().window().color().name() == DARK.window
    assert win.renderer.theme is DARK
    # the conversation was re-rendered with the dark palette (math images included)
    assert DARK.text in win.chat.widgets[-1].body.document().defaultStyleSheet()


def test_system_theme_is_followed_live(qtbot, make_window, monkeypatch):
    from desktop import theme as themes

    win = make_window(engine=FakeEngine(token_s=0.0))
    assert win.settings.theme == "system"
    # The offscreen platform has no colour scheme of its own: stand in for the OS switching to dark.
    monkeypatch.setattr(themes, "system_is_dark", lambda: True)
    QGuiApplication.styleHints().colorSchemeChanged.emit(Qt.ColorScheme.Dark)
    assert QApplication.palette().window().color().name() == DARK.window and win.theme is DARK
