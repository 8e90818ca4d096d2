"""4-bit (AWQ) in the window: the Precision entry when a 4-bit sibling exists, and the first-run 4-bit copy
(download -> quantize on the engine thread -> load), with the tiny model on CPU at group size 32 (it is 64 wide;
the app uses 128). r1desk's models folder is a tmp folder (XDG_DATA_HOME), as in test_welcome."""

from __future__ import annotations

import asyncio
import shutil
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, Qt, QTimer, Slot
from PySide6.QtWidgets import QApplication

from desktop.settings import SettingsDialog

# Small calibration so a quantize takes about a second; the group size is what the tiny model needs.
FAST = dict(group_size=32, samples=8, seq_len=128)


@pytest.fixture
def models_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))  # r1desk's own models folder (platformdirs)
    from model_loader.locate import user_models_dir

    d = user_models_dir()
    d.mkdir(parents=True)
    return d


class _OnGuiThread(QObject):
    """A receiver that lives on the GUI thread, so the worker's signal reaches fn queued, as the window's slots
    do (a bare Python callable would run on the emitting thread)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    @Slot(int, int, str)
    def call(self, *args):
        self.fn(*args)


def _precisions(dlg: SettingsDialog) -> list[str]:
    return [dlg.precision.itemData(i) for i in range(dlg.precision.count())]


def _in_settings_dialog(fn):
    """Run fn(dialog) on the modal settings dialog once it is open (exec() blocks the test until it closes)."""
    seen = []

    def act():
        dlg = QApplication.activeModalWidget()
        seen.append(dlg)
        fn(dlg)

    QTimer.singleShot(0, act)
    return seen


def test_precision_offers_4bit_only_when_a_4bit_copy_exists_and_switches_to_it(
    qtbot, make_window, models_dir, tiny_model
):
    from model_loader.quantize import quantize

    dense = models_dir / "tiny-r1"
    shutil.copytree(tiny_model, dense)
    win = make_window(model=str(dense), temperature=0.0, max_new_tokens=8)
    assert win.engine_info["variants"] == {"dense": str(dense), "awq": None}
    seen = _in_settings_dialog(lambda dlg: dlg.reject())
    win.open_settings()
    assert "awq" not in _precisions(seen[0]) and "bf16" in _precisions(seen[0])  # no 4-bit copy: no entry
    assert not win.engine_info.get("quantization") and "4-bit" not in win.live.device_label.text()

    awq = models_dir / "tiny-r1-AWQ"
    quantize(str(dense), str(awq), device="cpu", **FAST)
    with qtbot.waitSignal(win.engine_ready, timeout=60000):
        win.start_engine()  # the variants are looked up after each load
    assert win.engine_info["variants"] == {"dense": str(dense), "awq": str(awq)}

    def pick_4bit(dlg):
        assert _precisions(dlg) == ["auto", "bf16", "fp16", "fp32", "awq"]
        assert dlg.precision.itemText(4) == "4-bit (AWQ)"
        dlg.precision.setCurrentIndex(4)
        assert dlg.model_path.text() == str(awq)  # the folder switches to the 4-bit copy, in view
        dlg.accept()

    with qtbot.waitSignal(win.engine_ready, timeout=60000) as blocker:  # picking it reloads, from the AWQ folder
        _in_settings_dialog(pick_4bit)
        win.open_settings()
    info = blocker.args[0]
    assert info["model_path"] == str(awq) and info["quantization"].startswith("awq")
    assert win.settings.model_path == str(awq) and win.settings.precision == "awq"
    win.topbar.live_btn.setChecked(True)
    assert f"4-bit {info['quantization']}" in win.live.device_label.text()  # which AWQ path is in use
    with qtbot.waitSignal(win.reply_finished, timeout=60000) as reply:
        win.send("Hello")
    assert reply.args[0]["stats"]["completion_tokens"] == 8  # the 4-bit model replies

    def back_to_bf16(dlg):
        assert dlg.precision.currentData() == "awq"  # the loaded model is the 4-bit one
        dlg.precision.setCurrentIndex(dlg.precision.findData("bf16"))
        assert dlg.model_path.text() == str(dense)
        dlg.accept()

    with qtbot.waitSignal(win.engine_ready, timeout=60000) as blocker:
        _in_settings_dialog(back_to_bf16)
        win.open_settings()
    assert blocker.args[0]["model_path"] == str(dense) and not blocker.args[0]["quantization"]
    assert win.settings.precision == "bf16"


def test_first_run_download_then_4bit_copy_loads_and_replies(qtbot, aio, hub, make_window, models_dir):
    win = make_window(model=None, wait_ready=False, temperature=0.0, max_new_tokens=8)
    win.quantize_options = FAST
    welcome = win.welcome
    assert welcome.quantize_box.isVisible() and "4-bit copy" in welcome.quantize_box.text()
    welcome.quantize_box.setChecked(True)
    steps, threads = [], set()
    shown = threading.Event()

    def on_step(i, n, what):  # on the worker thread (direct): hold the first step until the GUI has shown it
        steps.append((i, n, what))
        threads.add(threading.get_ident())
        if i == 0:
            shown.wait(30)

    with qtbot.waitSignal(win.engine_ready, timeout=120000) as blocker:
        task = welcome.start_download()  # into r1desk's models folder, as the button does
        win.service.host.worker.quantize_progress.connect(on_step, Qt.DirectConnection)
        dest = aio.run_until_complete(asyncio.wait_for(task, 120))
        qtbot.waitUntil(lambda: "layer 1/2" in welcome.download_status.text(), timeout=30000)  # layer i/N
        assert welcome.cancel_btn.isVisible() and welcome.download_progress.isVisible()
        assert not welcome.download_btn.isEnabled() and not welcome.use_btn.isEnabled()
        shown.set()
    info = blocker.args[0]
    assert dest == str(models_dir / "DeepSeek-R1-Distill-Qwen-1.5B")
    awq = models_dir / "DeepSeek-R1-Distill-Qwen-1.5B-AWQ"
    assert info["model_path"] == str(awq) and info["quantization"].startswith("awq")
    assert (awq / "config.json").is_file() and not list(awq.glob("*.partial"))
    assert steps[0][:2] == (0, 2) and steps[-1][:2] == (2, 2)  # layer i/N, from the worker
    assert threading.get_ident() not in threads  # quantized on the engine thread, not the GUI's
    assert win.settings.precision == "awq" and win.settings.model_path == str(awq)
    assert win.stack.currentWidget() is win.chat_page
    assert info["variants"] == {"dense": dest, "awq": str(awq)}  # both stay: Precision can switch back
    with qtbot.waitSignal(win.reply_finished, timeout=60000) as reply:
        win.send("Hello")
    assert reply.args[0]["stats"]["completion_tokens"] == 8


def test_cancelling_the_4bit_copy_leaves_no_half_made_model(
    wait_cross_thread, qtbot, make_window, models_dir, tiny_model
):
    dense = models_dir / "tiny-r1"
    shutil.copytree(tiny_model, dense)
    win = make_window(model=None, wait_ready=False)
    win.quantize_options = FAST
    welcome = win.welcome
    clicked = threading.Event()

    def cancel_at_first_step(i, n, what):  # on the GUI thread, as a user's click
        if not clicked.is_set():
            assert welcome.cancel_btn.isVisible() and welcome.cancel_btn.isEnabled()
            qtbot.mouseClick(welcome.cancel_btn, Qt.LeftButton)
            clicked.set()

    win._ensure_service()
    on_gui = _OnGuiThread(cancel_at_first_step)
    win.service.host.worker.quantize_progress.connect(on_gui.call, Qt.QueuedConnection)
    # Hold the worker at its first step until the click has happened (the tiny model quantizes in well under a
    # second, faster than a click): what is tested is what Cancel does mid-way, not who wins a race.
    win.service.host.worker.quantize_progress.connect(lambda *a: clicked.wait(30), Qt.DirectConnection)
    with wait_cross_thread(win.service.host.worker.quantize_failed, timeout=60000) as blocker:
        win.quantize_model(str(dense))
    assert blocker.args[0] == "cancelled"
    assert not (models_dir / "tiny-r1-AWQ").exists()
    qtbot.waitUntil(lambda: "Cancelled" in welcome.download_status.text(), timeout=10000)
    assert not welcome.cancel_btn.isVisible()
    assert welcome.download_btn.isEnabled() and welcome.quantize_box.isEnabled() and welcome.folder_btn.isEnabled()
    assert win.engine_state == "none" and win.stack.currentWidget() is welcome
    qtbot.waitUntil(lambda: not welcome.scanning, timeout=30000)
    paths = [welcome.found.item(i).data(Qt.UserRole) for i in range(welcome.found.count())]
    assert str(dense) in paths and not any(p and p.endswith("-AWQ") for p in paths)
