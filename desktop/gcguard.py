"""Run Python's cyclic garbage collector on the GUI thread only.

Automatic collection runs in whichever thread happens to allocate. If it runs on the engine or a pool thread
and the garbage holds Qt widgets (a closed window's wrappers in a reference cycle), their C++ destructors run
off the GUI thread: Qt forbids that and it crashes. So automatic collection is turned off and this timer
collects, generation by generation as the thresholds say, from the GUI thread (the pattern pyqtgraph uses).
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer


class GuiThreadGC(QObject):
    def __init__(self, interval_ms: int = 1000, parent=None):
        super().__init__(parent)
        self.threshold = gc.get_threshold()
        gc.disable()
        self.timer = QTimer(self)
        self.timer.timeout.connect(self.check)
        self.timer.start(interval_ms)

    def check(self) -> None:
        l0, l1, l2 = gc.get_count()
        if l0 > self.threshold[0]:
            gc.collect(0)
            if l1 > self.threshold[1]:
                gc.collect(1)
                if l2 > self.threshold[2]:
                    gc.collect(2)
