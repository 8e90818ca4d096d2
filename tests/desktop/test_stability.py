"""The window must never crash (issue 11): the engine thread's Python state, signal reference counts, a stress
run of the real window fed by a fast scripted engine, and the long self-test that fills a 4,096-token context."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Qt, QTimer, Signal, Slot

from model_loader.events import Delta, Finished, GenerationStats, MemoryStats, Started


# ---------------------------------------------------------------------------------------------- engine thread
class _Probe(QObject):
    """Runs on the engine thread: reports whether a Python thread-local survived from the previous job."""

    seen = Signal(object)

    def __init__(self):
        super().__init__()
        self.local = threading.local()

    @Slot(int)
    def job(self, i: int) -> None:
        self.seen.emit((i, getattr(self.local, "mark", None), threading.get_native_id()))
        self.local.mark = i


class _Caller(QObject):
    go = Signal(int)


def test_engine_thread_keeps_one_python_thread_state_between_jobs(qtbot):
    """The root cause of the GPU machine's crashes: on a QThread whose event loop runs in C++, each queued job
    gets a new Python thread state that is freed afterwards, and torch's pybind11 (2.11) kept using the first
    one. The engine thread must keep one thread state for its whole life: a thread-local set by one job is
    still there in the next."""
    from desktop.worker import EngineHost

    host = EngineHost()
    probe, caller = _Probe(), _Caller()
    probe.moveToThread(host.thread)
    caller.go.connect(probe.job, Qt.QueuedConnection)
    got = []
    probe.seen.connect(got.append, Qt.QueuedConnection)
    for i in range(5):
        caller.go.emit(i)
    qtbot.waitUntil(lambda: len(got) == 5, timeout=10000)
    assert [mark for _, mark, _ in got] == [None, 0, 1, 2, 3]
    assert len({tid for _, _, tid in got}) == 1 and got[0][2] != threading.get_native_id()
    assert host.shutdown(5000)


# ---------------------------------------------------------------------------------------------- reference counts
_REFCOUNT_CHECK = textwrap.dedent("""
    import sys
    from PySide6.QtCore import QCoreApplication, QMetaObject, QObject, QThread, Qt, Signal, Slot

    app = QCoreApplication([])
    text, kind = "".join(["t", "ext"]), "".join(["reason", "ing"])  # objects of our own, not interned literals
    payload = {"stats": {"n": 1}, "ok": True}
    counts = [0, 0]

    class Here(QObject):
        delta = Signal(int, str, str, int)
        payload = Signal(int, object)

    class Sender(QObject):  # the engine's shape: a worker thread emitting to this thread, queued
        delta = Signal(int, str, str, int)
        payload = Signal(int, object)

        @Slot(int)
        def run(self, n):
            for i in range(n):
                self.delta.emit(i, text, kind, i % 2 == 0)
                self.payload.emit(i, payload)
            self.payload.emit(-1, payload)

        @Slot()
        def ping(self):
            pass

    class Kick(QObject):
        go = Signal(int)

    def on_delta(*args):
        counts[0] += 1

    def on_payload(i, p):
        if i == -1:
            # Queued to the application: PySide may call a plain function from the emitting thread, and there a
            # quit() that comes before app.exec() has started is dropped (Qt 6) and exec() would never return.
            QMetaObject.invokeMethod(app, "quit", Qt.QueuedConnection)
        else:
            counts[1] += 1

    here = Here()
    here.delta.connect(on_delta)  # direct: same thread
    here.payload.connect(on_payload)
    th = QThread()
    sender = Sender()
    sender.moveToThread(th)
    sender.delta.connect(on_delta, Qt.QueuedConnection)
    sender.payload.connect(on_payload, Qt.QueuedConnection)
    kick = Kick()
    kick.go.connect(sender.run, Qt.QueuedConnection)
    th.start()

    def round_trip(n):
        for i in range(n):
            here.delta.emit(i, text, kind, i % 2 == 0)
            here.payload.emit(i, payload)
        kick.go.emit(n)
        app.exec()
        # The sender may still be inside its last emit (holding the payload) when the -1 arrives here: wait
        # until its thread has left run(), so no count is taken while a reference is in flight.
        QMetaObject.invokeMethod(sender, "ping", Qt.BlockingQueuedConnection)

    round_trip(200)  # warm-up: whatever the first emits cache stays out of the count
    watched = {"text": text, "kind": kind, "payload": payload}
    if sys.version_info < (3, 12):
        # From 3.12 True/False/None are immortal and their count means nothing: PySide6 is built against the
        # stable ABI of older Pythons, whose Py_INCREF/Py_DECREF change it without the immortality check (by
        # design harmless: PEP 683). Measured on the GPU machine (3.12, 6.11.3): True +1,326 over 40,400 emits.
        watched.update({"True": True, "False": False, "None": None})
    before = {k: sys.getrefcount(v) for k, v in watched.items()}
    round_trip(20000)
    after = {k: sys.getrefcount(v) for k, v in watched.items()}
    th.quit()
    th.wait()
    changed = {k: (before[k], after[k]) for k in watched if before[k] != after[k]}
    print("delivered", counts, flush=True)
    print("refcounts changed:", changed if changed else "none", flush=True)
""")


def test_emitting_signals_leaves_reference_counts_alone(tmp_path):
    """PySide6 6.12.0 lost a reference to True in every Signal.emit (Python 3.11 aborts after a few thousand
    emits). 40,000 emits of each payload shape the worker uses, direct and queued across threads, must leave
    every object's reference count where it was (True/False/None only before 3.12: immortal from 3.12 on).
    In a child process: a broken PySide aborts it, and this test reports that instead of dying with it."""
    out = subprocess.run(
        [sys.executable, "-c", _REFCOUNT_CHECK],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, QT_QPA_PLATFORM="offscreen"),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "delivered [40400, 40400]" in out.stdout, out.stdout  # every emit reached its slot
    assert "refcounts changed: none" in out.stdout, out.stdout


# ---------------------------------------------------------------------------------------------- stress
def _stress_text(seed: int, n: int) -> list[str]:
    """n small pieces of markdown-ish text: words, newlines, code fences, inline and display math, emoji."""
    pieces = []
    for i in range(n):
        r = (i * 7919 + seed * 104729) % 97
        if r == 0:
            pieces.append("\n\n```python\n")
        elif r == 1:
            pieces.append("\n```\n\n")
        elif r == 2:
            pieces.append(" $x^2 + y_{%d}$ " % i)
        elif r == 3:
            pieces.append("\n\n$$\\frac{a}{b}$$\n\n")
        elif r < 10:
            pieces.append("\n")
        elif r < 12:
            pieces.append(" 🙂 漢字")
        else:
            pieces.append(f" w{i % 1000}")
    return pieces


@dataclass
class StressEngine:
    """A scripted engine that streams as fast as the worker thread can take deltas (no pacing): each reply
    is `per_reply` deltas, reasoning then answer, with the real Started/Finished payloads."""

    per_reply: int = 5000
    replies: list = field(default_factory=list)  # (reasoning, answer) per reply, in order
    rates: list = field(default_factory=list)  # deltas per second, per reply
    info: object = None

    def __post_init__(self):
        from fakes import FakeInfo

        self.info = FakeInfo()

    def memory(self) -> MemoryStats:
        return MemoryStats(
            device="cuda:0",
            weights_bytes=1,
            kv_cache_bytes=1,
            torch_allocated_bytes=1,
            torch_reserved_bytes=1,
            peak_allocated_bytes=1,
            device_total_bytes=8 * 2**30,
            device_free_bytes=4 * 2**30,
            gpu_utilization_pct=90,
        )

    def warm_up(self, progress=None) -> None:
        pass

    def generate(self, messages, settings=None, control=None, tools=None, continue_final=False):
        seed = len(self.replies)
        pieces = _stress_text(seed, self.per_reply)
        split = self.per_reply // 2
        yield Started(prompt_tokens=10 + len(messages), prefix_reused_tokens=0, context_length=32768)
        t0 = time.perf_counter()
        times = []
        for i, text in enumerate(pieces):
            times.append(time.perf_counter())
            yield Delta(text, "reasoning" if i < split else "answer", token_count=i + 1)
        t1 = time.perf_counter()
        self.rates.append(len(pieces) / max(t1 - t0, 1e-9))
        reasoning, answer = "".join(pieces[:split]), "".join(pieces[split:])
        self.replies.append((reasoning, answer))
        stats = GenerationStats(
            finish_reason="eos",
            prompt_tokens=10,
            completion_tokens=len(pieces),
            reasoning_tokens=split,
            prefix_reused_tokens=0,
            context_length=32768,
            ttft_ms=1.0,
            first_answer_ms=2.0,
            decode_tok_s=self.rates[-1],
            total_s=t1 - t0,
            token_latencies_ms=[(b - a) * 1000 for a, b in zip(times, times[1:])],
            memory=self.memory(),
        )
        yield Finished(
            text=reasoning + "</think>\n\n" + answer,
            reasoning=reasoning,
            answer=answer,
            token_ids=list(range(len(pieces))),
            stats=stats,
        )


def _displayed(msg: dict) -> tuple[str, str]:
    return msg["reasoning"], msg["answer"]


def test_window_survives_20000_fast_deltas_while_switching_chats_then_closes_cleanly(qtbot, make_window):
    engine = StressEngine(per_reply=5000)
    win = make_window(engine=engine)
    win.service.host.worker.delta_interval_s = 0  # every engine delta is its own queued signal: 20,000 of them
    signals = []
    win.service.host.worker.delta.connect(lambda *a: signals.append(1))
    # Other conversations to click on while the replies stream.
    others = [win.store.create_conversation(f"other {i}") for i in range(3)]
    win.refresh_list()
    switcher = QTimer()
    switcher.setInterval(3)
    clicks = [0]

    def click_another_chat():  # what a restless user does: select other chats, mid-reply and as it ends
        row = clicks[0] % win.sidebar.conv_list.count()
        clicks[0] += 1
        win.sidebar.conv_list.setCurrentRow(row)

    switcher.timeout.connect(click_another_chat)
    replies = []
    for turn in range(4):
        if win.conv_id in others or win.conv_id is None:
            win.new_chat()
        with qtbot.waitSignal(win.reply_finished, timeout=120000) as blocker:
            assert win.send(f"stress turn {turn}")
            conv = win.conv_id
            switcher.start()
        replies.append((conv, blocker.args[0]))
        at_end = clicks[0]
        qtbot.waitUntil(lambda: clicks[0] > at_end + 3, timeout=5000)  # and it goes on after the reply ended
        switcher.stop()
    assert len(signals) == 20000
    assert min(engine.rates) >= 2000, engine.rates  # the stress really was >= 2,000 deltas/s
    for (conv, msg), expected in zip(replies, engine.replies):
        assert _displayed(msg) == expected  # every delta arrived, in order, in the right reply
        stored = win.store.message(msg["id"])
        assert stored["conversation_id"] == conv  # saved into the chat it was asked in, whatever was clicked
        assert stored["complete"] and (stored["reasoning"], stored["answer"]) == expected
    assert clicks[0] > 8
    host = win.host
    win.close()
    assert host.thread.isFinished()  # the engine thread was joined, not abandoned


# ---------------------------------------------------------------------------------------------- long self-test
def test_long_self_test_fills_a_4096_token_context_on_the_cpu(tmp_path, tiny_model):
    """The real engine inside the window's process for a whole context: the shape of the GPU machine's
    crashes (they came in replies of 256-4,096 tokens and at close). Greedy, so it runs the same every time."""
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "r1desk.ini").write_text("[settings]\ncontext_length=4096\ntemperature=0\n")
    env = dict(
        os.environ, QT_QPA_PLATFORM="offscreen", R1DESK_DATA_DIR=str(tmp_path / "data"), R1DESK_CONFIG_DIR=str(cfg)
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "desktop.app",
            "--model",
            tiny_model,
            "--device",
            "cpu",
            "--self-test",
            "--max-new-tokens",
            "8192",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("r1desk self-test ok:")]
    assert line and "finish=context_full" in line[0], out.stdout
    tokens = int(line[0].split("tokens=")[1].split()[0])
    assert 4000 < tokens < 4096
    from desktop.store import Store

    store = Store(tmp_path / "data" / "conversations.sqlite3")
    (conv,) = store.conversations()
    reply = [m for m in store.messages(conv["id"]) if m["role"] == "assistant"][0]
    assert reply["complete"] and reply["stats"]["completion_tokens"] == tokens
    assert not list((tmp_path / "data" / "logs").glob("*.log"))  # a clean exit leaves no crash log
    store.close()
