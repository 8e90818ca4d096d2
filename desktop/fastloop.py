"""qasync's event loop with asyncio's own bookkeeping for callbacks, timers and sockets (the API's per-request
cost).

What qasync 0.28 does, and what it costs the local API on each request:
- call_soon is call_later(0): every callback gets its own Qt zero-time timer (QObject.startTimer(0), a
  QTimerEvent delivered to a Python timerEvent(), killTimer), after an asyncio.iscoroutinefunction check that
  asyncio's own loop makes only in debug mode.
- call_later/call_at start one Qt timer each, and cancelling the handle does not stop it: it stays in Qt's timer
  list until it fires. aiohttp arms a keep-alive timer of 3630 s on every new connection (the openai client
  opens one per streamed request), so Qt's list grows by one timer per request for an hour, and Qt inserts and
  kills timers by a linear scan of that list: every call_soon hop slows down as a busy server's connections
  pile timers up (docs/BENCHMARKS.md, 'The API: overhead, per-request options, structured output', compares the
  two loops).
- a socket that becomes ready costs a signal to a Python lambda that disables its QSocketNotifier, one more
  call_soon (a timer) to run the transport's callback, and re-enabling the notifier after; and a signal
  connection to a new lambda for every notifier (each new connection).

Here, as asyncio's own loop does it:
- call_soon appends the Handle to a deque (asyncio's _ready) and posts ONE Qt event that runs the callbacks
  queued at that point, FIFO. Callbacks they queue wait for the next event, so Qt's own events (input, paint,
  sockets) still run between batches, as the selector runs between asyncio's own iterations.
- call_soon_threadsafe appends to the same deque (atomic) and posts the same event (postEvent is thread-safe),
  not qasync's queued signal that then calls call_soon (two Qt events); it returns the Handle as asyncio does.
- timers go in asyncio's heap (BaseEventLoop._scheduled, with its lazy removal of cancelled ones) and ONE Qt
  timer is armed for the earliest.
- a socket's readiness runs the transport's callback right in the QSocketNotifier's event, as asyncio runs it
  right after its select (and as qasync's own selector path, _Selector, already does).
In debug mode (PYTHONASYNCIODEBUG, set_debug) call_soon and timers stay qasync's, which time each callback.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import math

import qasync
from PySide6.QtCore import QCoreApplication, QEvent, QObject, QSocketNotifier, Qt

_BATCH_EVENT = QEvent.Type(QEvent.registerEventType())
MAX_TIMER_MS = 86_400_000  # the longest Qt timer armed at once (a day); later deadlines re-arm on waking


class _Driver(QObject):
    """Receives the posted event that runs a batch, and the one Qt timer (on the loop's thread)."""

    def __init__(self, loop: FastQEventLoop):
        super().__init__()
        self._loop = loop

    def event(self, ev):  # noqa: N802 (Qt's name)
        if ev.type() == _BATCH_EVENT:
            self._loop._run_batch()
            return True
        return super().event(ev)

    def timerEvent(self, ev):  # noqa: N802
        self._loop._on_timer(ev.timerId())


class _Notifier(QSocketNotifier):
    """A QSocketNotifier that runs its Handle on each activation (QEvent.SockAct, before Qt would emit the
    `activated` signal): cheaper than connecting a Python slot to every new connection's notifier."""

    def __init__(self, fd: int, kind, handle: asyncio.Handle):
        super().__init__(fd, kind)
        self.handle: asyncio.Handle | None = handle

    def event(self, ev):  # noqa: N802
        if ev.type() == QEvent.Type.SockAct:
            if self.handle is not None:
                self.handle._run()  # Handle._run hands an exception to the loop's exception handler
            return True
        return super().event(ev)


class FastQEventLoop(qasync.QEventLoop):
    """A drop-in qasync.QEventLoop (same constructor)."""

    def __init__(self, *args, **kwargs):
        self._ready_batch: collections.deque[asyncio.Handle] = collections.deque()
        self._batch_posted = False
        self._driver = _Driver(self)
        self._qt_timer_id = 0  # the Qt timer armed for the earliest scheduled handle (0: none)
        self._qt_timer_when = math.inf
        self._dropped_notifiers: list[_Notifier] = []
        super().__init__(*args, **kwargs)

    # ---------------------------------------------------------------- callbacks
    def _post_batch(self) -> None:
        # The flag may race with another thread's call_soon_threadsafe: then a second event is posted and finds
        # the queue shorter or empty (harmless). A wake-up is never lost, since _run_batch clears the flag
        # before it reads the queue's length.
        self._batch_posted = True
        QCoreApplication.postEvent(self._driver, QEvent(_BATCH_EVENT))

    def call_soon(self, callback, *args, context=None):
        if self.get_debug():
            return super().call_soon(callback, *args, context=context)
        return self._queue(callback, args, context)

    def call_soon_threadsafe(self, callback, *args, context=None):
        return self._queue(callback, args, context)

    def _queue(self, callback, args, context) -> asyncio.Handle:
        """The Handle, queued for the next batch (from any thread: deque appends are atomic, postEvent is
        thread-safe)."""
        self._check_closed()
        handle = asyncio.Handle(callback, args, self, context)
        self._ready_batch.append(handle)
        if not self._batch_posted:
            self._post_batch()
        return handle

    def _run_batch(self) -> None:
        self._batch_posted = False
        if self.is_closed():  # a batch posted (or a thread's handle queued) just before close()
            self._ready_batch.clear()
            return
        self._dropped_notifiers.clear()
        ready = self._ready_batch
        try:
            for _ in range(len(ready)):  # only what is queued now: what these queue goes in the next batch
                if not ready:  # a callback ran a nested Qt loop (a modal dialog, processEvents) that drained it
                    break
                handle = ready.popleft()
                if not handle._cancelled:
                    handle._run()  # hands an exception to the loop's exception handler, but re-raises
                    # KeyboardInterrupt and SystemExit: the finally below keeps the rest of the queue going
        finally:
            if ready and not self._batch_posted:
                self._post_batch()

    # ---------------------------------------------------------------- timers
    def call_later(self, delay, callback, *args, context=None):
        if self.get_debug():
            return super().call_later(delay, callback, *args, context=context)
        return self.call_at(self.time() + delay, callback, *args, context=context)

    def call_at(self, when, callback, *args, context=None):
        if self.get_debug():  # (qasync's call_at calls call_later, ours; its call_later does not)
            return super().call_later(when - self.time(), callback, *args, context=context)
        self._check_closed()
        timer = asyncio.TimerHandle(when, callback, args, self, context)
        heapq.heappush(self._scheduled, timer)
        timer._scheduled = True
        if when < self._qt_timer_when:
            self._arm_qt_timer()
        return timer

    def _arm_qt_timer(self) -> None:
        """One Qt timer, for the earliest handle still scheduled (cancelled ones at the head are dropped)."""
        scheduled = self._scheduled
        while scheduled and scheduled[0]._cancelled:
            self._timer_cancelled_count -= 1
            heapq.heappop(scheduled)._scheduled = False
        if self._qt_timer_id:
            self._driver.killTimer(self._qt_timer_id)
            self._qt_timer_id, self._qt_timer_when = 0, math.inf
        if scheduled:
            when = scheduled[0]._when
            delay_ms = (when - self.time()) * 1000
            # Never early (Qt counts whole milliseconds), and at most a day: Qt takes a 32-bit int (24.8 days),
            # and asyncio allows sleep(inf). Waking early is harmless: _on_timer runs only what is due and
            # arms the timer again for the rest.
            ms = 0 if delay_ms <= 0 else MAX_TIMER_MS if delay_ms >= MAX_TIMER_MS else math.ceil(delay_ms)
            self._qt_timer_id = self._driver.startTimer(ms, Qt.TimerType.PreciseTimer)
            self._qt_timer_when = when

    def _timer_handle_cancelled(self, handle) -> None:
        super()._timer_handle_cancelled(handle)
        # As asyncio's _run_once: once most of the heap is cancelled handles, rebuild it without them (a
        # connection's 3630 s keep-alive timer is cancelled when it closes; the head is pruned lazily).
        scheduled = self._scheduled
        if self._timer_cancelled_count > 100 and self._timer_cancelled_count > len(scheduled) // 2:
            live = []
            for timer in scheduled:
                if timer._cancelled or timer is handle:  # (TimerHandle.cancel calls this before it sets _cancelled)
                    timer._scheduled = False
                else:
                    live.append(timer)
            heapq.heapify(live)
            scheduled[:] = live
            self._timer_cancelled_count = 0

    def _on_timer(self, timer_id: int) -> None:
        if timer_id != self._qt_timer_id:  # killed and replaced after its event was queued
            return  # (Qt may reuse an id for the new timer: then this runs early, which only re-arms)
        self._driver.killTimer(timer_id)
        self._qt_timer_id, self._qt_timer_when = 0, math.inf
        scheduled = self._scheduled
        end = self.time() + self._clock_resolution
        due = False
        while scheduled and (scheduled[0]._cancelled or scheduled[0]._when < end):
            handle = heapq.heappop(scheduled)
            handle._scheduled = False
            if handle._cancelled:
                self._timer_cancelled_count -= 1
            else:
                self._ready_batch.append(handle)
                due = True
        self._arm_qt_timer()
        if due and not self._batch_posted:
            self._run_batch()  # (it re-posts itself for what is left if a callback raises KeyboardInterrupt)

    # ---------------------------------------------------------------- sockets
    # The Handle is returned, and cancelled once replaced or removed, as asyncio's selector loop does: its
    # sock_recv/sock_sendall remove a reader only if their handle was not cancelled (a newer one on that fd).
    def _add_reader(self, fd, callback, *args):
        return self._add_notifier(self._read_notifiers, fd, QSocketNotifier.Type.Read, callback, args)

    def _add_writer(self, fd, callback, *args):
        return self._add_notifier(self._write_notifiers, fd, QSocketNotifier.Type.Write, callback, args)

    def _add_notifier(self, notifiers: dict, fd, kind, callback, args) -> asyncio.Handle:
        self._check_closed()
        self._drop_notifier(notifiers, fd)
        handle = asyncio.Handle(callback, args, self, None)
        notifiers[fd] = _Notifier(qasync._fileno(fd), kind, handle)
        return handle

    def _remove_reader(self, fd):
        return not self.is_closed() and self._drop_notifier(self._read_notifiers, fd)

    def _remove_writer(self, fd):
        return not self.is_closed() and self._drop_notifier(self._write_notifiers, fd)

    def _drop_notifier(self, notifiers: dict, fd) -> bool:
        notifier = notifiers.pop(fd, None)
        if notifier is None:
            return False
        notifier.setEnabled(False)
        if notifier.handle is not None:
            notifier.handle.cancel()
        notifier.handle = None
        # A transport often removes its reader from inside that notifier's own event (EOF, an error): if this
        # were the last reference, the QSocketNotifier would be deleted in its own event(). Keep it until the
        # next batch, which never runs inside a notifier's event.
        self._dropped_notifiers.append(notifier)
        return True

    def close(self):
        if not self.is_running() and not self.is_closed():
            self._ready_batch.clear()
            if self._qt_timer_id:
                self._driver.killTimer(self._qt_timer_id)
                self._qt_timer_id, self._qt_timer_when = 0, math.inf
            # qasync's close() disconnects each notifier's `activated` signal, which ours never connect.
            for notifiers in (self._read_notifiers, self._write_notifiers):
                for fd in list(notifiers):
                    self._drop_notifier(notifiers, fd)
            self._dropped_notifiers.clear()
        super().close()


def qt_event_loop(app, **kwargs):
    """The asyncio loop the app and `r1desk-cli serve` run on: FastQEventLoop, or qasync's own where
    R1DESK_QASYNC_LOOP=1 (to compare them, or to rule this module out when chasing a problem)."""
    import os

    if os.environ.get("R1DESK_QASYNC_LOOP") == "1":
        return qasync.QEventLoop(app, **kwargs)
    return FastQEventLoop(app, **kwargs)
