"""Desktop tests: real widgets offscreen, the tiny random Qwen2 on CPU, and a scripted fake engine where the
model is beside the point. Every window gets its own settings file and database under tmp_path."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before any QApplication exists
sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `import fakes`

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _gc_on_the_gui_thread_only():
    """As desktop.gcguard does in the app: a collection on the engine/pool thread could destroy widgets of
    earlier tests off the GUI thread (a crash). Collect between tests, on this thread, instead. At the session's
    end, a last collection here, and the collector stays off: switched back on, its next run could start on
    whichever thread allocates first, while the session's other fixtures are still being torn down."""
    import gc

    gc.disable()
    yield
    gc.collect()


@pytest.fixture(autouse=True)
def _collect_after_each_test():
    import gc

    yield
    gc.collect()


@pytest.fixture
def wait_cross_thread(qtbot):
    """`with wait_cross_thread(signal, timeout=ms) as caught: ...` then caught.args: qtbot.waitSignal for a signal
    emitted on another thread (the engine worker's, a polling thread's). pytest-qt's blocker is not a QObject, so
    its slot runs on the emitting thread and stops the blocker's timer from there: the wait can hang past its
    timeout, or the timer fire on a deleted object (a crash). Here the signal reaches a QObject on this thread,
    queued, and the wait polls for it."""
    from contextlib import contextmanager

    from PySide6.QtCore import QObject

    class Caught(QObject):  # on the GUI thread: a signal from another thread reaches catch() queued, here
        def __init__(self):
            super().__init__()
            self.args = None

        def catch(self, *args):
            if self.args is None:
                self.args = list(args)

    @contextmanager
    def wait(signal, timeout: int = 10000):
        caught = Caught()
        signal.connect(caught.catch)
        try:
            yield caught
            qtbot.waitUntil(lambda: caught.args is not None, timeout=timeout)
        finally:
            signal.disconnect(caught.catch)

    return wait


@pytest.fixture(scope="session")
def tiny_model(tiny_model) -> str:
    """tests/conftest.py's tiny model (built once a session), as the str path Qt settings and subprocesses take."""
    return str(tiny_model)


@pytest.fixture
def profile(tmp_path, monkeypatch) -> Path:
    """An isolated user profile: settings + conversations database."""
    monkeypatch.setenv("R1DESK_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("R1DESK_CONFIG_DIR", str(tmp_path / "config"))
    return tmp_path


@pytest.fixture
def make_window(qtbot, profile):
    """make_window(model=..., device="cpu", engine=FakeEngine | None, start=True, **settings) -> MainWindow."""
    from PySide6.QtCore import QSettings

    from desktop.store import Store
    from desktop.window import MainWindow

    windows = []

    def make(
        model=None,
        device="cpu",
        engine=None,
        fail_load=None,
        start=True,
        wait_ready=True,
        max_new_tokens=None,
        size=(1200, 800),
        load_chunk_s=0.0,
        compiling=False,
        **settings,
    ):
        import fakes

        qs = QSettings(str(profile / "config" / "r1desk.ini"), QSettings.IniFormat)
        for k, v in settings.items():
            qs.setValue(f"settings/{k}", v)
        qs.sync()
        store = Store(profile / "data" / "conversations.sqlite3")
        if (engine is not None or fail_load is not None) and model is None:
            model = "/models/DeepSeek-R1-Distill-Qwen-1.5B"
        win = MainWindow(qs, store, model=model, device=device, max_new_tokens=max_new_tokens)
        if engine is not None or fail_load is not None:
            win.engine_factory = fakes.factory(
                engine or fakes.FakeEngine(),
                fail_load,
                load_chunk_s,
                chunks=200 if load_chunk_s else 4,
                compiling=compiling,
            )
        qtbot.addWidget(win)
        if size:
            win.resize(*size)
        win.show()
        windows.append(win)
        if start:
            win.start_engine()
            if wait_ready:
                qtbot.waitUntil(lambda: win.engine_state == "ready", timeout=60000)
        return win

    yield make
    for win in windows:
        if not win._closing:
            win.close()
        win.store.close()


@pytest.fixture
def aio(qapp):
    """An asyncio loop run by Qt (the app's: qasync's, desktop.fastloop), as in the app: the download is asyncio
    code."""
    import asyncio

    from desktop.fastloop import FastQEventLoop

    loop = FastQEventLoop(qapp)
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


@pytest.fixture
def hub(tiny_model, tmp_path, monkeypatch):
    """A loopback Hugging Face hub serving the tiny model as deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B."""
    from fakehub import FakeHub

    h = FakeHub("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", tiny_model)
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    yield h
    h.close()


@pytest.fixture
def renderer(qapp):
    """The reply renderer in the light theme, as the window makes it (test_markdown, test_mathimg, ...)."""
    from desktop.markdown import MarkdownRenderer
    from desktop.theme import LIGHT

    return MarkdownRenderer(LIGHT, 15.0)


@pytest.fixture(scope="module")
def lab(tiny_model):
    """A real `r1desk-cli serve` on the tiny model (CPU) that requires serving.API_KEY, one per test module that
    uses it: (its model id, its /v1 URL)."""
    from serving import API_KEY, serve, stop

    proc, model_id, url = serve(tiny_model, "--api-key", API_KEY)
    yield model_id, url
    stop(proc)


@pytest.fixture
def system_keyring():
    """The system's keyring replaced by one in memory (fakes.MemoryKeyring) for the test: yields it."""
    import keyring
    from fakes import MemoryKeyring

    before = keyring.get_keyring()
    ring = MemoryKeyring()
    keyring.set_keyring(ring)
    yield ring
    keyring.set_keyring(before)
