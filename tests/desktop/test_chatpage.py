"""The chat page (desktop.chatpage): what can be done in each state of the engine and the reply, and the line
that says a message is being edited."""

from __future__ import annotations

from desktop.chatpage import EDITING_TEXT, ChatPage
from desktop.theme import LIGHT


def test_send_stop_ask_and_history_actions_follow_the_state(qtbot, renderer):
    page = ChatPage(renderer, LIGHT, vote_chains=3)
    qtbot.addWidget(page)
    page.show()
    composer, chat = page.composer, page.chat
    assert composer.vote_btn.text() == "Ask ×3"

    def state():
        return composer.send_btn.isEnabled(), composer.vote_btn.isEnabled(), chat.history_actions

    page.show_state(generating=False, thinking=False, ready=False)  # loading: nothing to send to yet
    assert state() == (False, False, True)
    page.show_state(generating=False, thinking=False, ready=True)
    assert state() == (True, True, True)
    page.show_state(generating=True, thinking=True, ready=True)  # Stop works, the history is not to be edited
    assert state() == (True, True, False) and composer.send_btn.text() == "Stop"
    assert composer.stop_thinking_btn.isVisible()
    page.show_state(generating=True, thinking=False, ready=False)  # a reply still stoppable while reloading
    assert state() == (True, False, False) and not composer.stop_thinking_btn.isVisible()


def test_the_editing_line_shows_while_a_message_is_edited(qtbot, renderer):
    page = ChatPage(renderer, LIGHT, vote_chains=8)
    qtbot.addWidget(page)
    page.show()
    page.show_editing(True)
    assert page.composer.editing_label.isVisible() and page.composer.editing_label.text() == EDITING_TEXT
    page.show_editing(False)
    assert not page.composer.editing_label.isVisible()
