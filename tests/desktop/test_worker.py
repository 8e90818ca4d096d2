"""The engine worker with the real engine (tiny model, CPU): signal order, threads, cancel, stop-thinking."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from PySide6.QtCore import Qt

from desktop.worker import EngineHost, LoadRequest


@pytest.fixture
def host(qtbot):
    h = EngineHost()
    yield h
    assert h.shutdown(5000)


def _record(host):
    events = []
    threads = {}
    w = host.worker
    w.stage.connect(lambda s: events.append(("stage", s)))
    w.progress.connect(lambda d, t: events.append(("progress", d, t)))
    w.ready.connect(lambda info: events.append(("ready", info)))
    w.started.connect(lambda g, st: events.append(("started", g, st)))
    w.delta.connect(lambda g, t, k, n: events.append(("delta", g, t, k, n)))
    w.finished.connect(lambda g, r: events.append(("finished", g, r)))
    w.failed.connect(lambda g, k, m: events.append(("failed", g, k, m)))
    # A direct connection runs in the emitting thread: tells us where the engine work happened.
    w.delta.connect(lambda *a: threads.setdefault("delta", threading.get_ident()), Qt.DirectConnection)
    return events, threads


def test_load_then_generate_signal_order_and_threads(wait_cross_thread, qtbot, host, tiny_model):
    from model_loader.events import Finished, GenerationControl, Started

    events, threads = _record(host)
    with wait_cross_thread(host.worker.ready, timeout=60000):
        host.load(LoadRequest(tiny_model, "cpu", 512))
    kinds = [e[0] if e[0] != "stage" else f"stage:{e[1]}" for e in events]
    assert kinds[:2] == ["stage:importing", "stage:loading"]
    assert kinds[-2:] == ["stage:warming", "ready"]
    progress = [e for e in events if e[0] == "progress"]
    assert progress and progress[-1][1] == progress[-1][2] > 0  # bytes, ending at the total
    assert all(a[1] <= b[1] for a, b in zip(progress, progress[1:]))
    info = events[-1][1]
    assert info["device"] == "cpu" and info["context_length"] == 512 and "memory" in info

    events.clear()
    settings = dict(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=24)
    with wait_cross_thread(host.worker.finished, timeout=60000):
        gen = host.generate([{"role": "user", "content": "Hello"}], settings, GenerationControl())
    assert [e[0] for e in events][0] == "started" and [e[0] for e in events][-1] == "finished"
    assert {e[0] for e in events[1:-1]} == {"delta"}  # one started, then only deltas before the one finished
    assert all(e[1] == gen for e in events)
    result = events[-1][2]  # the engine's own event, its token ids left behind
    assert isinstance(result, Finished) and result.token_ids == []
    streamed = "".join(e[2] for e in events if e[0] == "delta" and e[3] == "reasoning")
    assert streamed == result.reasoning
    assert result.stats.completion_tokens == 24
    started = events[0][2]  # known before the first token: what the live panel shows during the reply
    st = result.stats
    assert started == Started(
        prompt_tokens=st.prompt_tokens, prefix_reused_tokens=st.prefix_reused_tokens, context_length=st.context_length
    )
    assert started.prompt_tokens > 0 and started.context_length == 512
    counts = [e[4] for e in events if e[0] == "delta"]
    assert counts == sorted(counts) and counts[-1] == 24  # the engine's token count, not a count of deltas
    assert threads["delta"] != threading.get_ident()  # the engine ran on the worker thread, not the GUI's


def test_cancel_stops_the_reply(wait_cross_thread, qtbot, host, tiny_model):
    from model_loader.events import GenerationControl

    with wait_cross_thread(host.worker.ready, timeout=60000):
        host.load(LoadRequest(tiny_model, "cpu", 4096))
    control = GenerationControl()
    host.worker.delta.connect(lambda *a: control.cancel())  # cancel from the GUI thread at the first delta
    with wait_cross_thread(host.worker.finished, timeout=60000) as blocker:
        host.generate(
            [{"role": "user", "content": "Count to a thousand"}], dict(temperature=0.0, max_new_tokens=3000), control
        )
    stats = blocker.args[1].stats
    assert stats.finish_reason == "cancelled"
    assert stats.completion_tokens < 3000


def test_stop_thinking_makes_the_model_answer(wait_cross_thread, qtbot, host, tiny_model):
    from model_loader.events import GenerationControl

    with wait_cross_thread(host.worker.ready, timeout=60000):
        host.load(LoadRequest(tiny_model, "cpu", 1024))
    control = GenerationControl()
    kinds = []
    host.worker.delta.connect(
        lambda g, t, k, n: (kinds.append(k), control.stop_thinking() if len(kinds) == 3 else None)
    )
    with wait_cross_thread(host.worker.finished, timeout=60000) as blocker:
        host.generate([{"role": "user", "content": "Think hard"}], dict(temperature=0.0, max_new_tokens=80), control)
    stats = blocker.args[1].stats
    assert stats.stopped_thinking is True
    assert "answer" in kinds and kinds.index("answer") >= 3


def test_load_errors_are_reported_not_raised(wait_cross_thread, qtbot, host, tmp_path):
    with wait_cross_thread(host.worker.failed, timeout=60000) as blocker:
        host.load(LoadRequest(str(tmp_path), "cpu", 512))  # an empty folder
    gen_id, kind, message = blocker.args
    assert (gen_id, kind) == (0, "model")
    assert str(tmp_path) in message and "config.json" in message


def test_kernels_that_fail_after_their_check_load_the_model_again_without_them(wait_cross_thread, qtbot, host):
    """A load whose warm-up fails inside Triton (here: a C module the kernel store lacks, with no C compiler) is
    loaded again on plain PyTorch operations, and the engine's note says why (the live panel shows it); a failure
    that isn't the kernels' is reported as before, not retried."""
    from fakes import FakeEngine

    from model_loader.kernels.kernel_store import StoreMiss

    class KernelsFailOnWarmUp(FakeEngine):
        def warm_up(self, progress=None):
            raise StoreMiss(
                "Triton needs its C module '__triton_launcher' for this kernel, which r1desk's kernel "
                "store lacks, and no C compiler was found to build it"
            )

    asked, closed = [], []

    def make(request, progress, on_compiling=None):
        asked.append(request.use_triton)
        engine = KernelsFailOnWarmUp() if request.use_triton is None else FakeEngine()
        engine.close = lambda: closed.append(request.use_triton)
        return engine

    host.worker.engine_factory = make
    with wait_cross_thread(host.worker.ready, timeout=30000) as blocker:
        host.load(LoadRequest("/models/any", "cuda", 512))
    assert asked == [None, False] and closed == [None]  # the failed engine closed before the second load
    note = blocker.args[0]["kernels_note"]
    assert "'__triton_launcher'" in note and "install gcc" in note

    def not_the_kernels(request, progress, on_compiling=None):
        asked.append(request.use_triton)
        raise OSError("the disk went away")

    asked.clear()
    host.worker.engine_factory = not_the_kernels
    with wait_cross_thread(host.worker.failed, timeout=30000) as blocker:
        host.load(LoadRequest("/models/any", "cuda", 512))
    assert asked == [None] and "the disk went away" in blocker.args[2]


def test_paged_kernels_that_fail_when_batching_starts_load_the_model_again_without_them(wait_cross_thread, qtbot, host):
    """Several replies at once start the scheduler's paged kernels after the warm-up (Engine.serve_batched): a C
    module the store lacks fails there, and the model is loaded again on plain PyTorch operations and batches,
    the warmed-up engine closed first, instead of the load failing."""
    from fakes import FakeEngine

    from model_loader.kernels.kernel_store import StoreMiss

    class Scheduler:
        def has_work(self):
            return False

        def end_all(self, *args):
            pass

    class Batching(FakeEngine):
        def serve_batched(self, max_seqs):
            if self.use_triton is None:
                raise StoreMiss(
                    "Triton needs its C module '__triton_launcher' for this kernel, which r1desk's kernel store "
                    "lacks, and no C compiler was found to build it"
                )
            batched.append(max_seqs)
            return Scheduler()

    asked, closed, batched = [], [], []

    def make(request, progress, on_compiling=None):
        asked.append(request.use_triton)
        engine = Batching()
        engine.use_triton = request.use_triton
        engine.close = lambda: closed.append(request.use_triton)
        return engine

    host.worker.engine_factory = make
    with wait_cross_thread(host.worker.ready, timeout=30000) as blocker:
        host.load(LoadRequest("/models/any", "cuda", 512, max_parallel=3))
    assert asked == [None, False] and closed == [None] and batched == [3]
    assert blocker.args[0]["max_parallel"] == 3 and "'__triton_launcher'" in blocker.args[0]["kernels_note"]


@pytest.mark.parametrize("fails_in", ["warm_up", "serve_batched"])
def test_auto_parallel_is_sized_on_the_engine_that_serves(wait_cross_thread, qtbot, host, fails_in):
    """`serve --max-parallel auto` (0): the worker asks the loaded engine how many replies its free memory holds.
    Where r1desk's kernels fail (in the warm-up, or when batching starts) the engine loaded again without them is
    asked again: its memory is its own."""
    from fakes import FakeEngine

    from model_loader.kernels.kernel_store import StoreMiss

    class Scheduler:
        def has_work(self):
            return False

        def end_all(self, *args):
            pass

    def store_miss():
        raise StoreMiss(
            "Triton needs its C module '__triton_launcher' for this kernel, which r1desk's kernel store lacks"
        )

    class Sized(FakeEngine):
        def parallel_that_fits(self):
            return 6 if self.use_triton is None else 5

        def warm_up(self, progress=None):
            if fails_in == "warm_up" and self.use_triton is None:
                store_miss()

        def serve_batched(self, max_seqs):
            if fails_in == "serve_batched" and self.use_triton is None:
                store_miss()
            batched.append((self.use_triton, max_seqs))
            return Scheduler()

    batched = []

    def make(request, progress, on_compiling=None):
        engine = Sized()
        engine.use_triton = request.use_triton
        engine.close = lambda: None
        return engine

    host.worker.engine_factory = make
    with wait_cross_thread(host.worker.ready, timeout=30000) as blocker:
        host.load(LoadRequest("/models/any", "cuda", 512, max_parallel=0))
    assert batched == [(False, 5)] and blocker.args[0]["max_parallel"] == 5


def test_a_failed_loads_half_loaded_weights_are_freed_before_it_reports(wait_cross_thread, qtbot, host):
    """A load that runs out of memory raises out of frames that hold what was loaded so far, and the error's
    traceback keeps those frames. The worker reported the failure (and emptied torch's cache) while it still
    held the error, so those weights were freed only afterwards, into torch's cache, out of the driver's reach
    (other programs see the memory as used). They are freed by the time the failure is reported."""
    import gc
    import weakref

    from model_loader.errors import OutOfMemoryError

    class Weights:  # stands for the tensors loaded before memory ran out
        pass

    loaded = []

    def make(request, progress, on_compiling=None):
        weights = Weights()
        loaded.append(weakref.ref(weights))
        try:
            raise RuntimeError("CUDA out of memory")
        except RuntimeError as err:
            raise OutOfMemoryError("the model did not fit") from err

    host.worker.engine_factory = make
    freed_when_reported = []
    host.worker.failed.connect(lambda *a: freed_when_reported.append(loaded[0]() is None), Qt.DirectConnection)
    was_enabled = gc.isenabled()  # off in the desktop tests (conftest): it must stay off after this one
    gc.disable()
    try:
        with wait_cross_thread(host.worker.failed, timeout=30000) as blocker:
            host.load(LoadRequest("/models/any", "cpu", 512))
        assert blocker.args[1] == "oom" and freed_when_reported == [True]
    finally:
        if was_enabled:
            gc.enable()


def test_window_is_shown_before_torch_is_imported(tmp_path, tiny_model):
    code = f"""
import os, sys
os.environ["QT_QPA_PLATFORM"] = "offscreen"
os.environ["R1DESK_DATA_DIR"] = {str(tmp_path)!r}
os.environ["R1DESK_CONFIG_DIR"] = {str(tmp_path)!r}
from PySide6.QtWidgets import QApplication
app = QApplication([])
from desktop.app import build_window, parse_args
win = build_window(parse_args(["--model", {tiny_model!r}, "--device", "cpu"]))
win.show(); app.processEvents()
assert win.isVisible()
print("torch imported at show:", "torch" in sys.modules, flush=True)
win.start_engine()
from PySide6.QtCore import QTimer
QTimer.singleShot(60000, app.quit)
win.engine_ready.connect(lambda info: app.quit())
app.exec()
print("ready:", win.engine_state, "torch imported:", "torch" in sys.modules, flush=True)
win.close()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "torch imported at show: False" in out.stdout, out.stdout + out.stderr
    assert "ready: ready torch imported: True" in out.stdout, out.stdout + out.stderr


def test_deltas_are_joined_per_interval_without_losing_or_reordering_text():
    from desktop.worker import DeltaCoalescer

    now = [0.0]
    sent = []
    c = DeltaCoalescer(lambda text, kind, n: sent.append((text, kind, n)), interval_s=0.01, clock=lambda: now[0])
    c.add("a", "reasoning", 1)  # the first goes out at once: time to first token stays visible
    assert sent == [("a", "reasoning", 1)]
    for i, piece in enumerate("bcd"):
        now[0] += 0.001
        c.add(piece, "reasoning", 2 + i)
    assert len(sent) == 1  # held: within the interval
    now[0] += 0.001
    c.add("X", "answer", 5)  # a change of kind sends what was held, then holds the new kind
    assert sent[-1] == ("bcd", "reasoning", 4)
    now[0] += 0.02
    c.add("Y", "answer", 6)  # past the interval: out with what was held
    assert sent[-1] == ("XY", "answer", 6)
    c.add("Z", "answer", 7)
    c.flush()
    assert sent[-1] == ("Z", "answer", 7)
    c.flush()
    assert "".join(t for t, _, _ in sent) == "abcdXYZ" and len(sent) == 4
