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
