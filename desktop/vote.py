"""Ask ×N: N reasoning chains of one question, their majority answer, and every chain one click away.

VoteRequest looks to the window's reply controller like one GenerationRequest (the same signals, cancel and
stop-thinking), but submits N requests to the engine service: seeds S, S+1, ... of one prompt, marked as samples
of one prompt so that with several replies at once they decode together and share the prompt's prefill. It streams
the first chain as the reply; when every chain has ended it picks the majority (model_loader.vote: pure Python)
and finishes with that group's first chain as the reply; the reply controller stores the vote in its stats: the
summary, the answer, and each chain's answer, seed, tokens and text. ChainsDialog shows them.
"""

from __future__ import annotations

import itertools
import os

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QVBoxLayout,
)

from model_loader.events import Finished, Started  # plain dataclasses: no torch
from model_loader.vote import vote

_names = itertools.count(1)


class VoteRequest(QObject):
    """N chains through the service, seen as one request (desktop.service.GenerationRequest's interface). It
    finishes with the chosen chain's Finished; `vote` then holds the vote, in the form stored with its stats."""

    queued = Signal(int)
    started = Signal(object)  # model_loader.events.Started (the first chain's to start)
    delta = Signal(str, str, int)
    finished = Signal(object)  # model_loader.events.Finished: the chain shown as the reply
    failed = Signal(str, str)

    def __init__(self, service, messages: list[dict], settings: dict, n: int):
        """Raises what service.submit raises (NotReady, QueueFull) before any chain is queued."""
        super().__init__(service)
        self.n = n
        base = settings.get("seed")
        if base is None:
            base = int.from_bytes(os.urandom(4), "little")
        name = f"vote-{next(_names)}"
        refusal = service.refusal()
        if refusal is None and len(service.waiting) + n > service.max_waiting:
            from desktop.service import QueueFull

            refusal = QueueFull(f"{len(service.waiting)} requests are already waiting, and a vote adds {n}")
        if refusal is not None:
            raise refusal
        self.chains = [
            service.submit(messages, {**settings, "seed": (base + i) % (2**32)}, client="chat", samples_of=(name, n))
            for i in range(n)
        ]
        self.results: list[Finished | None] = [None] * n
        self.failures: list[str] = [""] * n  # a chain that ended without a result: why ("cancelled", ...)
        self.ended = 0
        self.started_once = False
        for i, chain in enumerate(self.chains):
            chain.started.connect(lambda started, i=i: self._on_started(i, started))
            chain.delta.connect(lambda text, kind, count, i=i: self._on_delta(i, text, kind, count))
            chain.finished.connect(lambda result, i=i: self._on_end(i, result))
            chain.failed.connect(lambda kind, message, i=i: self._on_end(i, None, kind, message))
        self.chains[0].queued.connect(self.queued)
        self.ahead = self.chains[0].ahead
        self.last_failure = ("generate", "")
        self.vote: dict | None = None  # set as it finishes: the summary, the answer and each chain (JSON-ready)

    @property
    def state(self) -> str:
        return "done" if self.ended == self.n else ("running" if self.started_once else "waiting")

    def cancel(self) -> None:
        for chain in self.chains:
            if chain.state != "done":
                chain.cancel()

    def stop_thinking(self) -> None:
        for chain in self.chains:
            if chain.state == "running":
                chain.stop_thinking()

    def _on_started(self, i: int, started: Started) -> None:
        if not self.started_once:
            self.started_once = True
            self.started.emit(started)

    def _on_delta(self, i: int, text: str, kind: str, count: int) -> None:
        if i == 0:  # the first chain streams as the reply; the others are counted
            self.delta.emit(text, kind, count)

    def _on_end(self, i: int, result: Finished | None, kind: str = "", message: str = "") -> None:
        self.results[i] = result
        self.ended += 1
        if result is None:
            self.failures[i] = kind
            self.last_failure = (kind, message)
        if self.ended < self.n:
            return
        done = [r for r in self.results if r is not None]
        if not done:
            self.failed.emit(*self.last_failure)
            return
        outcome = vote([r.answer if r is not None else "" for r in self.results])
        pick = outcome.winner.chains[0] if outcome.winner else self.results.index(done[0])
        self.vote = {
            "summary": outcome.summary(),
            "answer": outcome.winner.display if outcome.winner else None,
            "support": len(outcome.winner.chains) if outcome.winner else 0,
            "total": self.n,
            "shown": pick,
            "chains": [
                {
                    "answer": outcome.answers[j],
                    "seed": r.stats.seed if r is not None else None,
                    "tokens": r.stats.completion_tokens if r is not None else 0,
                    "finish_reason": r.stats.finish_reason if r is not None else self.failures[j],
                    "text": r.text if r is not None else "",
                    "majority": bool(outcome.winner and j in outcome.winner.chains),
                }
                for j, r in enumerate(self.results)
            ],
        }
        self.finished.emit(self.results[pick])


class ChainsDialog(QDialog):
    """Every chain of a vote: its answer (the majority's marked) and, selected, its whole text."""

    def __init__(self, vote_stats: dict, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Chains of this answer")
        self.setAccessibleName("Chains of this answer")
        self.resize(860, 560)
        lay = QVBoxLayout(self)
        summary = QLabel(vote_stats.get("summary", ""))
        summary.setObjectName("Role")
        lay.addWidget(summary)
        row = QHBoxLayout()
        self.list = QListWidget()
        self.list.setAccessibleName("Chains")
        self.list.setMaximumWidth(330)
        self.list.setSpacing(2)  # the theme pads the selected row: without room it covers its neighbours
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setAccessibleName("Chain text")
        self.chains = vote_stats.get("chains") or []
        for j, chain in enumerate(self.chains):
            answer = chain.get("answer")
            line = (
                f"{'★ ' if chain.get('majority') else ''}Chain {j + 1}: "
                f"{answer if answer is not None else '(no answer)'} · {chain.get('tokens') or 0:,} tokens"
            )
            item = QListWidgetItem(line)
            item.setToolTip(f"seed {chain.get('seed')}, {chain.get('finish_reason')}")
            self.list.addItem(item)
        self.list.currentRowChanged.connect(self._show)
        row.addWidget(self.list)
        row.addWidget(self.text, 1)
        lay.addLayout(row, 1)
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)
        if self.chains:
            self.list.setCurrentRow(vote_stats.get("shown", 0))

    def _show(self, row: int) -> None:
        self.text.setPlainText(self.chains[row].get("text", "") if 0 <= row < len(self.chains) else "")
        self.text.moveCursor(self.text.textCursor().MoveOperation.Start)
