"""The chat view's widgets (desktop.chatview): a reply's rich text with its math images and copy links, and stored
messages shown with their reasoning folded, open, or marked interrupted."""

from __future__ import annotations

import re

from PySide6.QtCore import QUrl
from PySide6.QtGui import QGuiApplication, QTextDocument

from desktop.chatview import RichText


def test_rich_text_loads_math_images_and_copies_code(qtbot, renderer):
    view = RichText()
    qtbot.addWidget(view)
    view.resize(500, 100)
    view.set_rendered(renderer.render("Here $a^2$\n\n```\ncopy me\n```"), renderer.stylesheet())
    url = re.search(r'src="(math:[0-9a-f]+)"', view.toHtml()).group(1)
    assert not view.document().resource(QTextDocument.ImageResource, QUrl(url)).isNull()
    assert view.height() > 60  # grew to fit its text: the chat view scrolls, not this
    view.anchorClicked.emit(QUrl("copy:0"))
    assert QGuiApplication.clipboard().text() == "copy me"


def test_stored_messages_render_reasoning_folded_or_open(qtbot, make_window):
    win = make_window(start=False)
    win.chat.assistant_name = "R1"
    done = win.chat.add_message(
        {
            "id": 1,
            "role": "assistant",
            "content": "r</think>\n\na",
            "reasoning": "hmm $x$",
            "answer": "The answer is **4**.",
            "complete": True,
            "stats": {
                "thinking_s": 12.0,
                "finish_reason": "eos",
                "total_s": 14.0,
                "completion_tokens": 99,
                "decode_tok_s": 88.0,
            },
        }
    )
    assert done.reasoning_block.toggle.text() == "Thought for 12 s" and not done.reasoning_block.expanded()
    assert "The answer is 4." in done.body.toPlainText()
    assert done.meta.text() == "14 s · 99 tokens · 88 tok/s"
    never_closed = win.chat.add_message(
        {
            "id": 2,
            "role": "assistant",
            "content": "still thinking",
            "reasoning": "still thinking",
            "answer": "",
            "complete": True,
            "stats": {"thinking_s": 30.0, "finish_reason": "max_new_tokens"},
        }
    )
    block = never_closed.reasoning_block
    assert block.expanded() and "no answer (hit the token limit while thinking)" in block.toggle.text()
    assert "still thinking" in block.visible_text() and not never_closed.body.isVisible()
    crashed = win.chat.add_message(
        {
            "id": 3,
            "role": "assistant",
            "content": "half",
            "reasoning": "half",
            "answer": "",
            "complete": False,
            "stats": None,
        }
    )
    assert "interrupted" in crashed.reasoning_block.toggle.text() and crashed.meta.text() == "interrupted"
