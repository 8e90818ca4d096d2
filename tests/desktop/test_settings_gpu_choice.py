"""A machine with several NVIDIA GPUs: Settings > Device lists each one by name (the worker reports them once a
model has loaded), a choice is saved as "cuda:N" and loads there; with one GPU the list is as before."""

from __future__ import annotations

import torch

from desktop.settings import AppSettings, SettingsDialog, device_choices
from desktop.worker import EngineWorker

GTX_1060 = {"device": "cuda:0", "name": "NVIDIA GeForce GTX 1060 6GB", "supported": False}
RTX_4070 = {"device": "cuda:1", "name": "NVIDIA GeForce RTX 4070", "supported": True}


def test_each_gpu_is_offered_and_the_choice_is_saved(qtbot, make_window, tiny_model, monkeypatch):
    win = make_window(model=tiny_model)
    assert win.engine_info["gpus"] == []  # this machine has none: the list stays GPU / CPU
    dlg = SettingsDialog(win.settings, win, gpus=[GTX_1060, RTX_4070])
    qtbot.addWidget(dlg)
    items = [(dlg.device.itemText(i), dlg.device.itemData(i)) for i in range(dlg.device.count())]
    assert items == [
        ("GPU (NVIDIA), the first that works", "cuda"),
        ("GPU 0: NVIDIA GeForce GTX 1060 6GB (not supported by this PyTorch)", "cuda:0"),
        ("GPU 1: NVIDIA GeForce RTX 4070", "cuda:1"),
        ("CPU (slow)", "cpu"),
    ]
    assert dlg.device.currentData() == "cpu"  # what this window runs on
    dlg.device.setCurrentIndex(dlg.device.findData("cuda:1"))
    chosen = dlg.result_settings()
    assert chosen.device == "cuda:1"
    # From here torch sees an RTX 4070 as cuda:0 and a GTX 1060 as cuda:1: the reload names the GTX 1060, so the
    # choice reached the loader (the automatic one would have taken the RTX 4070)
    machine = [((8, 9), "NVIDIA GeForce RTX 4070"), ((6, 1), "NVIDIA GeForce GTX 1060 6GB")]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    index = lambda d: d if isinstance(d, int) else torch.device(d).index  # noqa: E731
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: machine[index(d)][0])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: machine[index(d)][1])
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: ["sm_75", "sm_80", "sm_86", "sm_90", "sm_120"])
    monkeypatch.setattr(torch.version, "hip", None)
    with qtbot.waitSignal(win.engine_failed, timeout=60000) as blocker:
        win.apply_settings(chosen)  # a model setting: the window reloads, on the GPU asked for
    kind, message = blocker.args
    assert kind == "no_gpu" and message.startswith("Your NVIDIA GeForce GTX 1060 6GB")
    assert AppSettings.load(win.qs).device == "cuda:1"


def test_one_gpu_and_a_saved_gpu_not_listed():
    assert device_choices([RTX_4070 | {"device": "cuda:0"}], "cuda") == [
        ("GPU (NVIDIA)", "cuda"),
        ("CPU (slow)", "cpu"),
    ]
    assert device_choices(None, "cpu") == [("GPU (NVIDIA)", "cuda"), ("CPU (slow)", "cpu")]
    # chosen earlier, before a model loaded this time (or the card was removed): kept, so OK changes nothing
    assert device_choices(None, "cuda:1") == [("GPU (NVIDIA)", "cuda"), ("GPU 1", "cuda:1"), ("CPU (slow)", "cpu")]


def test_the_worker_lists_the_machines_gpus(monkeypatch):
    gpus = [((6, 1), "NVIDIA GeForce GTX 1060 6GB"), ((8, 9), "NVIDIA GeForce RTX 4070")]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: gpus[i][0])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: gpus[i][1])
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: ["sm_75", "sm_80", "sm_86", "sm_90", "sm_120"])
    monkeypatch.setattr(torch.version, "hip", None)
    assert EngineWorker._gpus() == [GTX_1060, RTX_4070]


def test_a_chosen_gpu_that_is_gone_says_so_and_offers_the_first_that_works(qtbot, make_window, tiny_model, monkeypatch):
    """GPU 1 chosen in Settings, then the machine has one GPU (a card taken out, an eGPU unplugged): a message
    that says which, and a button that goes back to the automatic choice and loads."""
    from PySide6.QtCore import Qt

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    win = make_window(model=tiny_model, device="cuda:1", wait_ready=False)
    with qtbot.waitSignal(win.engine_failed, timeout=60000) as blocker:
        pass
    kind, message = blocker.args
    assert kind == "gpu_missing" and message == (
        "GPU 1, chosen in Settings, is not on this computer now: it has 1 NVIDIA GPU (numbered from 0)."
    )
    assert win.banner.kind == "gpu_missing" and message in win.banner.label.text()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the rest of this machine is what it is
    button = next(b for b in win.banner.action_buttons() if b.text() == "Use the first GPU that works")
    with qtbot.waitSignal(win.engine_failed, timeout=60000) as blocker:
        qtbot.mouseClick(button, Qt.LeftButton)
    assert blocker.args[0] == "no_gpu"  # the automatic choice was loaded (and found no GPU on this CPU machine)
    assert win.settings.device == "cuda" and AppSettings.load(win.qs).device == "cuda"


def test_the_status_line_numbers_the_gpu_only_where_there_are_several():
    from desktop.engine_status import device_title

    two = [GTX_1060, RTX_4070]
    assert (
        device_title({"device": "cuda:1", "device_name": "NVIDIA GeForce RTX 4070", "gpus": two})
        == "NVIDIA GeForce RTX 4070 (GPU 1)"
    )
    assert (
        device_title(
            {"device": "cuda:0", "device_name": "NVIDIA GeForce RTX 4070", "gpus": [RTX_4070 | {"device": "cuda:0"}]}
        )
        == "NVIDIA GeForce RTX 4070"
    )
    assert device_title({"device": "cpu", "device_name": "CPU", "gpus": two}) == "CPU"
