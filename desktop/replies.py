"""One chat reply's life, from the saved empty row to the saved final text: the window's client of the engine
service.

  start -> empty assistant row saved (complete=0) -> service.submit(...) (may wait behind API requests:
  "waiting for 1 API request") -> started (prompt prefilled) -> deltas -> ReplyStream (paints once a frame);
  the row is rewritten every Store.FLUSH_S -> finished -> final text + stats saved (complete=1)
Stop and stop-thinking go to the request (thread-safe flags the decode loop checks before every token).

Saving survives a full disk: fields a write could not store are kept (`unsaved`), shown by the window, and
retried every 2 s until they are written.
"""

from __future__ import annotations

import dataclasses
import sqlite3

from PySide6.QtCore import QObject, QTimer, Signal

from desktop.chatview import ReplyStream
from desktop.service import NotReady, QueueFull
from desktop.store import Store, store_problem
from desktop.vote import VoteRequest
from model_loader.chat import stored_reply  # plain text rules: no torch
from model_loader.events import Finished, Started  # plain dataclasses: no torch
from model_loader.stats import thinking_seconds  # pure Python, like the line above


def content_of(reasoning: str, answer: str) -> str:
    """The stored text of a reply in flight, from what has streamed (model_loader.chat.stored_reply)."""
    return stored_reply(reasoning, answer, started_in_reasoning=bool(reasoning))


class ReplyController(QObject):
    """Owns the reply in flight (at most one) and the saving of replies. The window supplies the widgets."""

    finished = Signal(object)  # the saved assistant message
    failed = Signal(str, str)  # kind, message
    ended = Signal()  # after either: the window refreshes its list and controls

    def __init__(self, win):
        super().__init__(win)
        self.win = win
        self.request = None  # the GenerationRequest (desktop.service) or VoteRequest (desktop.vote) in flight
        self.stream: ReplyStream | None = None
        self.msg_id: int | None = None
        self.conv_id: int | None = None
        self._last_saved = ""
        # Reply fields the store could not write (a full disk): msg id -> fields, retried until they are saved.
        self.unsaved: dict[int, dict] = {}
        self.save_timer = QTimer(self)
        self.save_timer.setInterval(int(Store.FLUSH_S * 1000))
        self.save_timer.timeout.connect(self.save_partial)
        self.retry_timer = QTimer(self)
        self.retry_timer.setInterval(2000)
        self.retry_timer.timeout.connect(self.retry_unsaved)

    @property
    def store(self):
        return self.win.store

    @property
    def banner(self):
        return self.win.banner

    # ------------------------------------------------------------------ start / stop
    def start(self, conv_id: int, history: list[dict], settings: dict, chains: int = 1) -> bool:
        """chains > 1: Ask ×N, the majority of that many chains (desktop.vote.VoteRequest) as the reply."""
        try:
            self.msg_id = self.store.add_message(conv_id, "assistant", "", complete=False, settings=settings)
        except sqlite3.Error as err:
            self.banner.show_message(
                "save_failed",
                f"Could not start the reply: saving it failed: {store_problem(err)} Then use Regenerate or send again.",
            )
            return False
        try:
            if chains > 1:
                req = VoteRequest(self.win.service, history, settings, chains)
            else:
                req = self.win.service.submit(history, settings, client="chat")
        except (NotReady, QueueFull) as err:
            self._drop_row()
            self.banner.show_message("generate", f"The reply could not start: {err}.")
            return False
        self.conv_id = conv_id
        widget = self.win.chat.add_message(self.store.message(self.msg_id))
        self.win.chat.scroll_to_bottom()
        self.stream = ReplyStream(widget)
        self.request = req
        self._last_saved = ""
        if self.banner.kind in ("not_ready", "generate", "oom", "context_full"):  # stale once a new reply starts
            self.banner.hide()
        req.queued.connect(self._on_queued)
        req.started.connect(self._on_started)
        req.delta.connect(self._on_delta)
        req.finished.connect(self._on_finished)
        req.failed.connect(self._on_failed)
        self._on_queued(req.ahead)  # announced by submit(), before these connections
        self.save_timer.start()
        return True

    def stop(self) -> None:
        if self.request is not None:
            self.request.cancel()

    def stop_thinking(self) -> bool:
        if self.request is not None and self.stream is not None and not self.stream.answer:
            self.request.stop_thinking()
            return True
        return False

    def _drop_row(self) -> None:
        try:
            self.store.delete_message(self.msg_id)
        except sqlite3.Error:
            pass  # an empty, incomplete row: harmless if it stays
        self.msg_id = None

    # ------------------------------------------------------------------ events
    def _on_queued(self, ahead: int) -> None:
        """The reply waits behind API requests (the engine runs one at a time): say so on the reply."""
        if self.stream is None or self.request is None or self.request.state != "waiting":
            return
        if ahead:
            self.stream.widget.meta.setText(f"waiting for {ahead} API request{'s' if ahead > 1 else ''}…")

    def _on_started(self, started: Started) -> None:
        if self.stream is not None:
            self.stream.widget.meta.setText("")

    def _on_delta(self, text: str, kind: str, token_count: int) -> None:
        if self.stream is None:
            return
        was_thinking = self.stream.answer == ""
        self.stream.feed(text, kind)
        if was_thinking and (kind == "answer" or self.stream.reasoning == text):
            self.win.update_composer()

    def _on_finished(self, result: Finished) -> None:
        if self.stream is None:
            return
        # The stored form (JSON in the conversation): the stats' fields, and what the chat shows beside them.
        stats = dataclasses.asdict(result.stats)
        if isinstance(self.request, VoteRequest):  # Ask ×N: the vote goes with the chain shown
            stats["vote"] = self.request.vote
        if result.reasoning:
            stats["thinking_s"] = thinking_seconds(result.stats)
        info = self.win.engine_info
        if info:
            stats["model"] = info.get("model_name")
            stats["device"] = info.get("device_name")
            if info.get("server"):  # a server's model: which server, so the chat can go back to it
                stats["server"] = info["server"]
        fields = dict(content=result.text, reasoning=result.reasoning, answer=result.answer, complete=True, stats=stats)
        self.write(self.msg_id, fields, touch=self.conv_id)
        msg = {**(self.store.message(self.msg_id) or {"id": self.msg_id, "role": "assistant"}), **fields}
        self._end(msg)
        if result.stats.finish_reason == "context_full":
            self.win.context_full_banner("The conversation has filled the model's context, so the reply was cut off.")
        self.finished.emit(msg)

    def _on_failed(self, kind: str, message: str) -> None:
        if self.stream is None:
            return
        s = self.stream
        if s.reasoning or s.answer:  # keep what was written; say why it stopped
            fields = dict(
                content=content_of(s.reasoning, s.answer),
                reasoning=s.reasoning,
                answer=s.answer,
                complete=True,
                stats={"finish_reason": "error", "error": message},
            )
            self.write(self.msg_id, fields)
            msg = {**(self.store.message(self.msg_id) or {"id": self.msg_id, "role": "assistant"}), **fields}
        else:
            self.win.chat.remove(self.msg_id)
            self._drop_row()
            msg = None
        self._end(msg)
        if kind == "context_full":
            self.win.context_full_banner(f"This conversation no longer fits in the context: {message}.")
        elif kind == "oom":
            self.banner.show_message(
                "oom",
                f"Out of GPU memory: {message}. The conversation is kept; try a "
                "shorter context length or 4-bit weights.",
                [("Settings…", self.win.open_settings)],
            )
        elif kind == "unloaded":
            self.banner.show_message("generate", f"The reply did not start: {message}.")
        elif kind != "cancelled":  # Stop pressed while the reply still waited behind API requests: nothing to say
            self.banner.show_message("generate", f"The reply failed: {message}")
        self.failed.emit(kind, message)

    def _end(self, msg: dict | None) -> None:
        self.save_timer.stop()
        if self.stream is not None and msg is not None:
            self.stream.finish(msg)
        elif self.stream is not None:
            self.stream.timer.stop()
            self.stream.label_timer.stop()
        self.stream = None
        self.request = None
        self.msg_id = None
        self.ended.emit()

    def save_on_close(self) -> None:
        """The window is closing and the engine has stopped: keep the reply as it stands (cancelled)."""
        if self.stream is not None and self.msg_id is not None:
            s = self.stream
            self.write(
                self.msg_id,
                dict(
                    content=content_of(s.reasoning, s.answer),
                    reasoning=s.reasoning,
                    answer=s.answer,
                    complete=True,
                    stats={"finish_reason": "cancelled"},
                ),
            )
            self._end(None)
        self.retry_unsaved()  # a last try for anything a full disk held back
        self.retry_timer.stop()

    # ------------------------------------------------------------------ saving
    def save_partial(self) -> None:
        s = self.stream
        if s is None or self.msg_id is None:
            return
        content = content_of(s.reasoning, s.answer)
        if content != self._last_saved:
            self._last_saved = content
            self.write(self.msg_id, dict(content=content, reasoning=s.reasoning, answer=s.answer))

    def write(self, msg_id: int, fields: dict, touch: int | None = None) -> bool:
        """Write a reply's fields (with any that an earlier write could not save); on failure keep them for
        the retry timer and say so. The reply stays in the window either way."""
        pending = {**self.unsaved.get(msg_id, {}), **fields}
        try:
            columns = {k: v for k, v in pending.items() if k != "touch"}
            if columns:
                self.store.update_message(msg_id, **columns)
            if touch is not None or pending.get("touch") is not None:
                self.store.touch(touch if touch is not None else pending["touch"])
        except sqlite3.Error as err:
            if touch is not None:
                pending["touch"] = touch
            self.unsaved[msg_id] = pending
            if self.banner.kind != "save_failed" or not self.banner.isVisible():
                self.banner.show_message(
                    "save_failed",
                    f"Could not save the reply: {store_problem(err)} It stays in this window and r1desk keeps trying.",
                )
            self.retry_timer.start()
            return False
        if self.unsaved.pop(msg_id, None) is not None and not self.unsaved and self.banner.kind == "save_failed":
            self.banner.show_message("saved", "Saved: the reply that could not be written earlier is stored now.")
        return True

    def retry_unsaved(self) -> None:
        for msg_id in list(self.unsaved):
            if not self.write(msg_id, {}):
                return
        self.retry_timer.stop()
