"""Every error path leaves a clear message and a usable app."""

from __future__ import annotations

from PySide6.QtCore import Qt

from fakes import FakeEngine, OutOfMemoryError


def _button(win, label):
    return next(b for b in win.banner.action_buttons() if b.text() == label)


def test_no_gpu_offers_cpu_mode(qtbot, make_window, tiny_model, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this machine, seen as GPU-less
    win = make_window(model=tiny_model, device="cuda", wait_ready=False)
    qtbot.waitUntil(lambda: win.engine_state == "failed", timeout=60000)
    assert win.banner.isVisible() and win.banner.kind == "no_gpu"
    assert "slower" in win.banner.label.text()
    with qtbot.waitSignal(win.engine_ready, timeout=60000) as blocker:
        qtbot.mouseClick(_button(win, "Use CPU (slow)"), Qt.LeftButton)
    assert blocker.args[0]["device"] == "cpu"
    assert win.settings.device == "cpu"
    assert "much slower" in win.banner.label.text()  # the speed warning stays visible in CPU mode


def test_a_gpu_this_torch_cannot_use_offers_cpu_mode(qtbot, make_window, tiny_model, monkeypatch):
    """A GTX 1060 under a torch built for CUDA 13 (no code for it): the loader's message with what to install,
    the CPU offered as with no GPU at all, and the CPU then works."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (6, 1))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GeForce GTX 1060 6GB")
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"])
    win = make_window(model=tiny_model, device="cuda", wait_ready=False)
    with qtbot.waitSignal(win.engine_failed, timeout=60000) as blocker:
        pass
    kind, message = blocker.args
    assert kind == "no_gpu" and "GTX 1060 6GB" in message and "whl/cu126" in message
    assert win.banner.kind == "no_gpu" and message in win.banner.label.text()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the rest of this machine is what it is
    with qtbot.waitSignal(win.engine_ready, timeout=60000) as blocker:
        qtbot.mouseClick(_button(win, "Use CPU (slow)"), Qt.LeftButton)
    assert blocker.args[0]["device"] == "cpu"


def test_bad_model_folder_shows_the_loaders_message(qtbot, make_window, tiny_model, tmp_path):
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    win = make_window(model=str(empty), wait_ready=False)
    with qtbot.waitSignal(win.engine_failed, timeout=60000) as blocker:
        pass
    kind, message = blocker.args
    assert kind == "model" and str(empty) in message
    assert message in win.banner.label.text()
    qtbot.mouseClick(_button(win, "Choose another model…"), Qt.LeftButton)
    assert win.stack.currentWidget() is win.welcome and message in win.welcome.error.text()
    with qtbot.waitSignal(win.engine_ready, timeout=60000):
        win.welcome.model_chosen.emit(tiny_model)  # the app is still usable: pick a good one
    assert win.stack.currentWidget() is win.chat_page
    assert win.banner.kind == "cpu"  # the error is gone; what's left is the CPU speed note


def test_out_of_memory_while_loading(qtbot, make_window):
    err = OutOfMemoryError("out of GPU memory while loading X; try a shorter context length or 4-bit (AWQ) weights")
    win = make_window(fail_load=err, wait_ready=False)
    with qtbot.waitSignal(win.engine_failed, timeout=20000) as blocker:
        pass
    assert blocker.args[0] == "oom"
    assert "shorter context length" in win.banner.label.text()
    assert _button(win, "Settings…")


def test_out_of_memory_while_generating_keeps_the_conversation(qtbot, make_window):
    err = OutOfMemoryError("out of GPU memory while generating; try a shorter context length or 4-bit (AWQ) weights")
    win = make_window(engine=FakeEngine(fail_generate=err))
    with qtbot.waitSignal(win.reply_failed, timeout=10000) as blocker:
        win.send("A long question")
    assert blocker.args[0] == "oom"
    assert "conversation is kept" in win.banner.label.text() and "shorter context" in win.banner.label.text()
    msgs = win.store.messages(win.conv_id)
    assert [m["role"] for m in msgs] == ["user"]  # no empty assistant row left behind
    assert win.stream is None and win.composer.send_btn.text() == "Send"


def test_prompt_larger_than_the_context_offers_a_new_chat(qtbot, make_window, tiny_model):
    win = make_window(model=tiny_model, context_length=64)
    with qtbot.waitSignal(win.reply_failed, timeout=30000) as blocker:
        win.send("word " * 200)
    assert blocker.args[0] == "context_full"
    assert win.banner.kind == "context_full" and "context" in win.banner.label.text()
    conv = win.conv_id
    qtbot.mouseClick(_button(win, "New chat"), Qt.LeftButton)
    assert win.conv_id is None and not win.chat.widgets
    assert win.store.messages(conv)[0]["content"].startswith("word")  # nothing lost


def test_reply_that_fills_the_context_says_so(qtbot, make_window, tiny_model):
    win = make_window(model=tiny_model, context_length=96, temperature=0.0)
    with qtbot.waitSignal(win.reply_finished, timeout=60000) as blocker:
        win.send("Hello")
    assert blocker.args[0]["stats"]["finish_reason"] == "context_full"
    assert win.banner.kind == "context_full" and _button(win, "New chat")
    assert "context full" in win.chat.widgets[-1].meta.text()


def test_sending_before_the_model_is_ready_keeps_the_text(qtbot, make_window):
    win = make_window(engine=FakeEngine(), start=False)
    win.composer.edit.setPlainText("early bird")
    qtbot.keyClick(win.composer.edit, Qt.Key_Return)
    assert win.banner.kind == "not_ready" and win.composer.text() == "early bird"
    assert win.stream is None and win.conv_id is None
