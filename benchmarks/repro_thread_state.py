"""Does the engine-thread crash of issue 11 still happen with this torch, and does desktop.worker avoid it?

The crash without the app: torch imported inside a queued slot on a QThread.

    python -m benchmarks.repro_thread_state plain       # a QThread running its event loop in C++ (the old worker)
    python -m benchmarks.repro_thread_state python-run  # desktop.worker.EngineThread (run() written in Python)

Each queued slot call on a plain QThread enters Python through PyGILState_Ensure and leaves through
PyGILState_Release, which frees the thread state it made. `import torch` in the first slot initialises
pybind11's internals on that thread; a pybind11 without its PR #5870 (issue #2888) keeps that thread state in
its own thread-local slot, and every later gil_scoped_acquire on the thread uses it after it was freed. An
autograd hook is a gil_scoped_acquire we can call on demand (the engine reaches others, such as a tensor's
Python object being released from C++). Prints one line: "ok" with the thread-local check, or dies.
Only meaningful where torch bundles an affected pybind11 (torch 2.11 does; 2.13 does not).
"""

from __future__ import annotations

import sys
import threading

from PySide6.QtCore import QCoreApplication, QObject, QThread, Qt, Signal, Slot


class Worker(QObject):
    done = Signal(int, object)

    def __init__(self):
        super().__init__()
        self.local = threading.local()

    @Slot(int)
    def job(self, i: int) -> None:
        import torch  # the first call imports it, on this thread

        kept = getattr(self.local, "mark", None)  # a Python thread-local set by the previous job
        self.local.mark = i
        for _ in range(50):
            x = torch.randn(256, requires_grad=True)
            x.register_hook(lambda g: g * 1)  # runs from C++ under pybind11's gil_scoped_acquire
            (x * 2).sum().backward()
        self.done.emit(i, kept)


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "plain"
    app = QCoreApplication(sys.argv[:1])
    if mode == "plain":
        thread = QThread()
    else:
        from desktop.worker import EngineThread

        thread = EngineThread()
    worker = Worker()
    worker.moveToThread(thread)

    class Client(QObject):
        go = Signal(int)

    client = Client()
    client.go.connect(worker.job, Qt.QueuedConnection)
    results = []

    def done(i, kept):
        results.append((i, kept))
        if len(results) == 20:
            app.quit()

    worker.done.connect(done, Qt.QueuedConnection)
    thread.start()
    for i in range(20):
        client.go.emit(i)
    app.exec()
    thread.quit()
    thread.wait()
    lost = sum(1 for i, kept in results[1:] if kept != i - 1)
    print(f"ok {mode}: 20 jobs, thread-local lost between jobs {lost} times", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
