"""desktop.aioloop.QEventLoop, the app's and `r1desk-cli serve`'s asyncio loop: qasync's, with call_soon callbacks
run from one ready queue instead of a Qt timer each."""

from __future__ import annotations

import asyncio

from PySide6.QtCore import QTimer


def test_callbacks_keep_their_order_and_a_coroutine_that_never_blocks_leaves_qt_its_turn(qapp):
    from desktop.aioloop import QEventLoop

    loop = QEventLoop(qapp)
    asyncio.set_event_loop(loop)
    try:
        order, qt_ran = [], []

        async def main():
            for i in range(5):
                loop.call_soon(order.append, i)
            QTimer.singleShot(0, lambda: qt_ran.append(order[:]))  # a Qt event queued behind busy asyncio work
            steps = 0
            while not qt_ran:  # never blocks: the loop must still hand the Qt loop its turn
                await asyncio.sleep(0)
                steps += 1
            return steps

        assert loop.run_until_complete(main()) > 0
        assert order == [0, 1, 2, 3, 4] and qt_ran == [[0, 1, 2, 3, 4]]
    finally:
        asyncio.set_event_loop(None)
        loop.close()
