"""The app's asyncio loop: qasync's QEventLoop with a cheaper call_soon.

qasync runs every call_soon callback through its own zero-time Qt timer (QObject.startTimer(0), a timerEvent
into Python, killTimer), so each hop of an asyncio chain (a socket becomes readable -> the protocol reads ->
a future's waiter wakes -> a task steps -> it creates the handler's task ...) costs a full trip through the Qt
event loop. For the local API server that is a few of those trips between a request's bytes arriving and its
handler running, and one more for each event coming back.

Here call_soon appends to a FIFO of ready handles (as asyncio's own loop does), and one zero-time QTimer runs
them. A run keeps going while callbacks schedule further callbacks, for at most RUN_BUDGET_S, then gives the Qt
loop its turn (paint, input, queued signals) and continues on the next pass: a coroutine that never blocks
cannot freeze the window. Callbacks run in the order they were scheduled, each exactly once, as before. When a
socket becomes ready, its callback and whatever it schedules run in that same Qt event instead of a timer later.
Timers with a delay (call_later, call_at) stay qasync's.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

import qasync
from PySide6.QtCore import QTimer

RUN_BUDGET_S = 0.002  # longest stretch of asyncio callbacks before the Qt loop gets a turn


class QEventLoop(qasync.QEventLoop):
    def __init__(self, *args, **kwargs):
        self._ready_handles: deque[asyncio.Handle] = deque()
        super().__init__(*args, **kwargs)
        self._ready_timer = QTimer()
        self._ready_timer.setSingleShot(True)
        self._ready_timer.setInterval(0)
        self._ready_timer.timeout.connect(self._run_ready)

    def call_soon(self, callback, *args, context=None):
        if asyncio.iscoroutinefunction(callback):
            raise TypeError("coroutines cannot be used with call_soon")
        if not callable(callback):
            raise TypeError(f"callback must be callable: {type(callback).__name__}")
        self._check_closed()
        handle = asyncio.Handle(callback, args, self, context=context)
        self._ready_handles.append(handle)
        if not self._ready_timer.isActive():
            self._ready_timer.start()
        return handle

    def _run_ready(self) -> None:
        """Run ready callbacks in FIFO order, including the ones they schedule, for at most RUN_BUDGET_S.
        A nested Qt event loop inside a callback (a modal dialog) runs callbacks too, as qasync's timers do."""
        ready = self._ready_handles
        deadline = time.monotonic() + RUN_BUDGET_S
        try:
            while ready:
                for _ in range(len(ready)):  # this round: what was ready when it began
                    if not ready:  # a nested run took them
                        break
                    handle = ready.popleft()
                    if not handle._cancelled:
                        handle._run()
                if time.monotonic() >= deadline:
                    break
        finally:
            if self.is_closed():
                return
            if ready:
                self._ready_timer.start()  # the Qt loop's turn first, then the rest
            else:
                self._ready_timer.stop()  # nothing left: no empty pass

    def _QEventLoop__on_notifier_ready(self, notifiers, notifier, fd, callback, args):
        # qasync's handler disables the notifier and schedules the read/write callback with call_soon: run it
        # (and what it schedules) now, in this Qt event, rather than on the next pass of the Qt loop.
        super()._QEventLoop__on_notifier_ready(notifiers, notifier, fd, callback, args)
        self._run_ready()

    def close(self):
        if self.is_running():
            raise RuntimeError("Cannot close a running event loop")
        self._ready_timer.stop()
        self._ready_handles.clear()
        super().close()
