"""desktop.fastloop.FastQEventLoop keeps asyncio's semantics over Qt: FIFO callbacks, cancellable handles,
exceptions to the loop's handler, wake-ups from other threads, timers in deadline order (cancelled ones do not
pile up), Qt's own events still served between batches, and sockets (an aiohttp round trip)."""

from __future__ import annotations

import asyncio
import math
import threading
import warnings

import pytest


@pytest.fixture
def loop(qapp):
    from PySide6.QtCore import QTimer

    from desktop.fastloop import FastQEventLoop

    loop = FastQEventLoop(qapp)
    asyncio.set_event_loop(loop)
    # A loop that stops waking would hang the test (pytest-timeout cannot interrupt Qt's wait): a plain Qt timer
    # stops it instead, and run_until_complete then raises "Event loop stopped before Future completed".
    watchdog = QTimer()
    watchdog.setSingleShot(True)
    watchdog.timeout.connect(loop.stop)
    watchdog.start(20_000)
    yield loop
    watchdog.stop()
    asyncio.set_event_loop(None)
    if not loop.is_closed():
        loop.close()


def test_callbacks_run_in_order_and_a_cancelled_one_does_not(loop):
    seen = []

    async def main():
        done = loop.create_future()
        for i in range(5):
            loop.call_soon(seen.append, i)
        loop.call_soon(seen.append, "cancelled").cancel()
        loop.call_soon(lambda: loop.call_soon(seen.append, "queued by a callback"))
        loop.call_soon(seen.append, 5)
        loop.call_soon(lambda: loop.call_soon(done.set_result, None))
        await done

    loop.run_until_complete(main())
    assert seen == [0, 1, 2, 3, 4, 5, "queued by a callback"]


def test_an_exception_goes_to_the_loop_handler_and_the_rest_still_run(loop):
    caught, seen = [], []
    loop.set_exception_handler(lambda lp, ctx: caught.append(ctx["exception"]))

    def boom():
        raise ValueError("boom")

    async def main():
        loop.call_soon(boom)
        loop.call_soon(seen.append, "after")
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    loop.run_until_complete(main())
    assert [str(e) for e in caught] == ["boom"] and seen == ["after"]


def test_call_soon_threadsafe_wakes_the_loop_from_another_thread(loop):
    async def main():
        fut = loop.create_future()
        results = []

        def worker():
            for i in range(200):
                results.append(loop.call_soon_threadsafe(lambda i=i: i == 199 and fut.set_result(i)))

        t = threading.Thread(target=worker)
        t.start()
        value = await asyncio.wait_for(fut, 10)
        t.join()
        return value, results

    value, handles = loop.run_until_complete(main())
    assert value == 199 and all(isinstance(h, asyncio.Handle) for h in handles)  # as asyncio's, not None


def test_a_callback_that_requeues_itself_forever_does_not_starve_qt(loop):
    """Each batch runs only what was queued when it started, so Qt's timers and posted events get their turn."""
    from PySide6.QtCore import QTimer

    count = [0]
    running = [True]

    def spin():
        count[0] += 1
        if running[0]:
            loop.call_soon(spin)

    async def main():
        fut = loop.create_future()
        loop.call_soon(spin)
        QTimer.singleShot(0, lambda: fut.set_result(count[0]))  # a plain Qt timer, not asyncio's
        try:
            return await asyncio.wait_for(fut, 10)
        finally:
            running[0] = False

    assert loop.run_until_complete(main()) < 1000


def test_timers_fire_in_deadline_order_not_early_and_cancelled_ones_are_dropped(loop):
    seen = []

    async def main():
        t0 = loop.time()
        loop.call_later(0.03, seen.append, "30 ms")
        loop.call_later(0.01, seen.append, "10 ms")
        loop.call_later(0.02, seen.append, "20 ms, cancelled").cancel()
        loop.call_at(t0 + 0.005, seen.append, "5 ms")
        # aiohttp arms a 3630 s keep-alive timer per connection and cancels it when the connection closes
        for _ in range(5000):
            loop.call_later(3630, seen.append, "never").cancel()
        await asyncio.sleep(0.04)
        return loop.time() - t0

    elapsed = loop.run_until_complete(main())
    assert seen == ["5 ms", "10 ms", "30 ms"] and elapsed >= 0.04
    assert len(loop._scheduled) < 200  # the cancelled ones do not pile up (qasync kept a Qt timer for each)


def test_sleep_and_wait_for_timeouts(loop):
    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 0.02)
        t0 = loop.time()
        await asyncio.sleep(0.015)
        return loop.time() - t0

    assert loop.run_until_complete(main()) >= 0.015


def test_an_aiohttp_server_and_client_talk_over_the_loop_and_close_cleanly(loop):
    import aiohttp
    from aiohttp import web

    async def hello(request):
        body = await request.read()
        resp = web.StreamResponse()
        await resp.prepare(request)
        for part in (b"a", b"b", body):
            await resp.write(part)
        await resp.write_eof()
        return resp

    async def main():
        app = web.Application()
        app.router.add_post("/", hello)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        out = []
        async with aiohttp.ClientSession() as session:
            for i in range(20):  # new connections and kept-alive ones
                async with session.post(
                    f"http://127.0.0.1:{port}/", data=str(i).encode(), headers={"Connection": "close"} if i % 2 else {}
                ) as resp:
                    out.append(await resp.read())
        await runner.cleanup()
        return out

    assert loop.run_until_complete(main()) == [b"ab" + str(i).encode() for i in range(20)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. libpyside's "Failed to disconnect" from qasync's close()
        loop.close()
    assert not loop._read_notifiers and not loop._write_notifiers


def test_an_infinite_or_very_long_timer_does_not_stop_the_others(loop):
    """asyncio allows sleep(inf) and delays past Qt's 32-bit milliseconds (24.8 days); they must neither raise
    nor keep the timers due before them from firing."""

    async def main():
        forever = asyncio.ensure_future(asyncio.sleep(math.inf))
        month = loop.call_later(3e6, lambda: None)
        await asyncio.sleep(0)  # forever's timer is armed first
        await asyncio.sleep(0.02)
        forever.cancel()
        month.cancel()
        return "woke"

    assert loop.run_until_complete(main()) == "woke"


def test_the_cancelled_timer_count_matches_the_heap(loop):
    """asyncio's TimerHandle.cancel() reports a cancel before it marks the handle cancelled: the heap rebuild must
    not count that handle as live (the count would end below the cancelled handles left, then negative)."""
    keep = loop.call_later(3600, lambda: None)  # a live timer ahead of them: the head is never pruned
    for _ in range(500):
        loop.call_later(3630, lambda: None).cancel()
        assert loop._timer_cancelled_count == sum(1 for t in loop._scheduled if t._cancelled)
    assert len(loop._scheduled) < 250  # rebuilt without the cancelled ones (the live head keeps them from pruning)
    keep.cancel()


def test_keyboard_interrupt_in_a_callback_leaves_the_rest_queued_to_run(loop):
    """Handle._run re-raises KeyboardInterrupt and SystemExit (Ctrl+C in a terminal): the callbacks queued after
    it must still run, in a batch posted again."""
    seen = []

    def interrupt():
        raise KeyboardInterrupt

    loop.call_soon(interrupt)
    loop.call_soon(seen.append, "after")
    with pytest.raises(KeyboardInterrupt):
        loop._run_batch()  # what the posted batch event runs
    assert seen == [] and loop._batch_posted  # "after" still queued, its batch posted again
    done = loop.create_future()
    loop.call_soon(done.set_result, None)
    loop.run_until_complete(done)
    assert seen == ["after"]


def test_the_app_runs_on_this_loop_unless_told_to_use_qasyncs(qapp, monkeypatch):
    import qasync

    from desktop.fastloop import FastQEventLoop, qt_event_loop

    monkeypatch.delenv("R1DESK_QASYNC_LOOP", raising=False)
    loop = qt_event_loop(qapp)
    assert isinstance(loop, FastQEventLoop)
    loop.close()
    monkeypatch.setenv("R1DESK_QASYNC_LOOP", "1")
    loop = qt_event_loop(qapp)
    assert type(loop) is qasync.QEventLoop
    loop.close()


def _stop_after(loop, ms: int):
    """A Qt timer that stops the loop: a test whose loop stops waking fails in `ms`, not at the 20 s watchdog."""
    from PySide6.QtCore import QTimer

    timer = QTimer()
    timer.setSingleShot(True)
    timer.timeout.connect(loop.stop)
    timer.start(ms)
    return timer


def test_no_timer_runs_before_its_deadline(loop):
    """Every callback records when it ran against when it was due, for deadlines 0.5-12 ms away, armed in a
    shuffled order."""
    late = []

    async def main():
        done = loop.create_future()
        delays = [0.0005 * k for k in range(1, 25)]
        delays = delays[::2] + delays[1::2][::-1]
        for delay in delays:
            when = loop.time() + delay
            loop.call_at(when, lambda when=when: late.append(loop.time() - when))
        loop.call_later(0.02, done.set_result, None)
        await done

    guard = _stop_after(loop, 3000)
    loop.run_until_complete(main())
    guard.stop()
    assert len(late) == 24
    assert min(late) >= -loop._clock_resolution, f"a timer ran {-min(late) * 1000:.2f} ms early"


def test_timers_armed_latest_first_run_earliest_first_and_promptly(loop):
    """Deadlines armed in descending order: only a heap gives the earliest first (a list would wait for the
    first one armed, the latest)."""
    seen = []

    async def main():
        done = loop.create_future()
        for k in range(20, 0, -1):
            loop.call_later(0.001 * k, seen.append, k)
        loop.call_later(0.03, done.set_result, None)
        await done

    guard = _stop_after(loop, 3000)
    loop.run_until_complete(main())
    guard.stop()
    assert seen == list(range(1, 21))


def test_a_cancelled_callback_never_reaches_the_exception_handler(loop):
    """A cancelled Handle has no callback left: running it anyway would hand a TypeError to the handler."""
    caught = []
    loop.set_exception_handler(lambda lp, ctx: caught.append(ctx))

    async def main():
        done = loop.create_future()
        for _ in range(10):
            loop.call_soon(print, "never").cancel()
        threaded = []
        worker = threading.Thread(target=lambda: threaded.append(loop.call_soon_threadsafe(print, "never")))
        worker.start()
        worker.join()
        threaded[0].cancel()
        loop.call_soon(lambda: loop.call_soon(done.set_result, None))
        await done

    loop.run_until_complete(main())
    assert caught == []


def test_the_app_loop_passes_its_options_on(qapp, monkeypatch):
    """qt_event_loop(app, **kwargs) hands both to the loop it makes, ours or qasync's (already_running: the app's
    own Qt loop is already running, so the asyncio loop counts as running from the start)."""
    from desktop.fastloop import qt_event_loop

    for qasyncs in ("0", "1"):
        monkeypatch.setenv("R1DESK_QASYNC_LOOP", qasyncs)
        loop = qt_event_loop(qapp, already_running=True)
        assert loop.is_running()
        loop.stop()
        loop.close()


def test_callbacks_run_in_the_context_they_were_scheduled_with(loop):
    """call_soon_threadsafe, call_later and call_at take a contextvars.Context, as asyncio's do (aiohttp and
    asyncio's own tasks rely on it)."""
    import contextvars

    var = contextvars.ContextVar("var", default="outside")
    seen = {}

    def record(name):
        seen[name] = var.get()

    async def main():
        done = loop.create_future()
        for name, schedule in (
            ("soon", lambda ctx: loop.call_soon(record, "soon", context=ctx)),
            ("threadsafe", lambda ctx: loop.call_soon_threadsafe(record, "threadsafe", context=ctx)),
            ("later", lambda ctx: loop.call_later(0.001, record, "later", context=ctx)),
            ("at", lambda ctx: loop.call_at(loop.time() + 0.001, record, "at", context=ctx)),
        ):
            ctx = contextvars.copy_context()
            ctx.run(var.set, f"in {name}")
            schedule(ctx)
        loop.call_later(0.01, done.set_result, None)
        await done

    loop.run_until_complete(main())
    assert seen == {"soon": "in soon", "threadsafe": "in threadsafe", "later": "in later", "at": "in at"}


def test_in_debug_mode_callbacks_and_timers_still_run_with_their_arguments_and_context(loop):
    """PYTHONASYNCIODEBUG / set_debug: call_soon, call_later and call_at are qasync's (they time each callback),
    and must still run each callback, with its arguments, in its context, in deadline order."""
    import contextvars

    var = contextvars.ContextVar("var", default="outside")
    seen = []
    loop.set_debug(True)

    async def main():
        done = loop.create_future()
        ctx = contextvars.copy_context()
        ctx.run(var.set, "inside")

        def record(name):
            seen.append((name, var.get()))

        loop.call_at(loop.time() + 0.02, record, "at", context=ctx)
        loop.call_later(0.01, record, "later", context=ctx)
        loop.call_soon(record, "soon", context=ctx)
        loop.call_later(0.06, done.set_result, None)
        await done

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # debug mode reports slow callbacks
        loop.run_until_complete(main())
    assert seen == [("soon", "inside"), ("later", "inside"), ("at", "inside")]


def test_the_timer_heap_is_rebuilt_when_asyncio_would(qapp):
    """As asyncio's _run_once: cancelled timers are purged from the heap once they are more than 100 and more
    than half of it, not before (each purge is a pass over the heap)."""
    from desktop.fastloop import FastQEventLoop

    def purged_at(n):
        """(the cancel that purged the heap, the timers left) for a live timer and n others, cancelled in turn"""
        loop = FastQEventLoop(qapp)
        try:
            loop.call_later(3600, lambda: None)  # a live head: cancelled ones behind it are never pruned lazily
            timers = [loop.call_later(3630, lambda: None) for _ in range(n)]
            for k, timer in enumerate(timers, 1):
                timer.cancel()
                if len(loop._scheduled) < 1 + n:
                    return k, len(loop._scheduled)
            return None
        finally:
            loop.close()

    assert purged_at(150) == (101, 1 + 150 - 101)  # 151 timers: the 101st cancelled one purges them
    assert purged_at(300) == (151, 1 + 300 - 151)  # 301 timers: past half of them


def test_cancelled_and_fired_timers_leave_the_cancelled_count_exact(loop):
    """A cancelled timer at the head of the heap is dropped when the Qt timer fires, and a timer that has run is
    no longer scheduled (cancelling it afterwards, as asyncio.wait_for does with its timeout, counts nothing):
    the count of cancelled timers keeps matching the heap, and no Qt timer stays armed once none is left."""

    async def main():
        done = loop.create_future()
        early = loop.call_later(0.002, lambda: None)
        fired = loop.call_later(0.004, lambda: None)
        loop.call_later(0.01, done.set_result, None)
        early.cancel()
        await done
        fired.cancel()  # after it ran

    loop.run_until_complete(main())
    assert loop._timer_cancelled_count == sum(1 for t in loop._scheduled if t._cancelled) == 0
    assert loop._scheduled == []
    assert (loop._qt_timer_id, loop._qt_timer_when) == (0, math.inf)


def test_removing_a_reader_or_writer_says_whether_there_was_one(loop):
    import socket

    a, b = socket.socketpair()
    try:
        assert loop.remove_reader(a.fileno()) is False  # none yet
        assert loop.remove_writer(a.fileno()) is False
        loop.add_reader(a.fileno(), lambda: None)
        loop.add_writer(a.fileno(), lambda: None)
        assert loop.remove_writer(a.fileno()) is True
        assert loop.remove_writer(a.fileno()) is False
        assert loop.remove_reader(a.fileno()) is True
        assert loop.remove_reader(a.fileno()) is False
        loop.add_reader(a.fileno(), lambda: None)
        loop.add_writer(b.fileno(), lambda: None)
        loop.close()
        assert not loop.remove_reader(a.fileno()) and not loop.remove_writer(b.fileno())  # closed: nothing left
    finally:
        a.close()
        b.close()


def test_a_deadline_already_past_runs_at_once(loop):
    ran = []

    async def main():
        done = loop.create_future()
        loop.call_at(loop.time() - 5.0, ran.append, "overdue")
        loop.call_later(0.02, done.set_result, None)
        await done

    guard = _stop_after(loop, 3000)
    loop.run_until_complete(main())
    guard.stop()
    assert ran == ["overdue"]


def test_a_replaced_or_removed_reader_has_its_handle_cancelled(loop):
    """As asyncio's selector loop: sock_recv and the like remove their reader only if its handle was not
    cancelled, i.e. not replaced by a newer reader on that socket."""
    import socket

    a, b = socket.socketpair()
    try:
        first = loop._add_reader(a.fileno(), lambda: None)
        second = loop._add_reader(a.fileno(), lambda: None)
        assert first.cancelled() and not second.cancelled()
        writer = loop._add_writer(b.fileno(), lambda: None)
        loop.remove_reader(a.fileno())
        loop.remove_writer(b.fileno())
        assert second.cancelled() and writer.cancelled()
    finally:
        a.close()
        b.close()


def test_closing_the_loop_leaves_no_callback_timer_or_socket_notifier_behind(loop):
    """Nothing of a closed loop fires afterwards: its queued callbacks, its Qt timer and its sockets' notifiers
    are all gone."""
    import socket

    a, b = socket.socketpair()
    try:
        loop.call_soon(print, "never")
        loop.call_later(0.001, print, "never")
        loop.add_reader(a.fileno(), lambda: None)
        loop.add_writer(b.fileno(), lambda: None)
        notifiers = [loop._read_notifiers[a.fileno()], loop._write_notifiers[b.fileno()]]
        loop.close()
        assert loop.is_closed()
        assert not loop._ready_batch
        assert (loop._qt_timer_id, loop._qt_timer_when) == (0, math.inf)
        assert [(n.isEnabled(), n.handle) for n in notifiers] == [(False, None), (False, None)]
    finally:
        a.close()
        b.close()
