"""Renaming, deleting and exporting a stored chat (desktop.conversations), with the real store; the dialogs'
answers given, and refusals from the store or the disk said, not raised."""

import sqlite3

import pytest

from desktop.conversations import ConversationActions, export_file_name
from desktop.store import Store


@pytest.fixture
def actions(tmp_path):
    store = Store(tmp_path / "c.sqlite3")
    reports = []
    yield ConversationActions(store, None, lambda kind, text: reports.append((kind, text))), store, reports
    store.close()


def test_an_export_suggests_the_title_as_a_file_name():
    assert export_file_name("What is 1 + 2?", "md") == "What is 1 _ 2_.md"
    assert export_file_name("***", "json") == "___.json"
    assert export_file_name("   ", "md") == "chat.md"


def test_export_writes_the_chat_and_a_disk_that_refuses_is_said(actions, tmp_path):
    acts, store, reports = actions
    cid = store.create_conversation("Lighthouses")
    store.add_message(cid, "user", "How do lighthouses work?")
    path = acts.export(cid, "md", str(tmp_path / "out.md"))
    assert path and "How do lighthouses work?" in (tmp_path / "out.md").read_text()
    assert acts.export(cid, "md", str(tmp_path / "no" / "such" / "dir" / "x.md")) is None
    assert reports and reports[-1][0] == "save_failed" and "Could not export the chat" in reports[-1][1]
    assert acts.export(cid + 100, "json", str(tmp_path / "y.json")) is None  # no such chat: nothing written


def test_a_refused_write_is_reported_and_returns_false(actions):
    acts, _store, reports = actions

    def refuse():
        raise sqlite3.OperationalError("database is locked")

    assert acts.write("rename the chat", refuse) is False
    assert reports[-1][0] == "save_failed" and reports[-1][1].startswith("Could not rename the chat:")
    assert acts.write("rename the chat", lambda: None) is True


def test_delete_without_asking(actions):
    acts, store, _ = actions
    cid = store.create_conversation("Gone soon")
    assert acts.delete(cid, confirm=False) and store.conversation(cid) is None
