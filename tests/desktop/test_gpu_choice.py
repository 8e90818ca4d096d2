"""A machine with several NVIDIA GPUs: Settings > Device lists each one by name (the worker reports them once a
model has loaded), a choice is saved as "cuda:N" and loads there; with one GPU the list is as before."""

from __future__ import annotations

import torch

from desktop.settings import AppSettings, SettingsDialog, device_choices
from desktop.worker import EngineWorker

GTX_1060 = {"device": "cuda:0", "name": "NVIDIA GeForce GTX 1060 6GB", "supported": False}
RTX_4070 = {"device": "cuda:1", "name": "NVIDIA GeForce RTX 4070", "supported": True}


def test_each_gpu_is_offered_and_the_choice_is_saved(qtbot, make_window, tiny_model):
    win = make_window(model=tiny_model)
    assert win.engine_info["gpus"] == []  # this machine has none: the list stays GPU / CPU
    dlg = SettingsDialog(win.settings, win, gpus=[GTX_1060, RTX_4070])
    qtbot.addWidget(dlg)
    items = [(dlg.device.itemText(i), dlg.device.itemData(i)) for i in range(dlg.device.count())]
    assert items == [("GPU (NVIDIA), the first that works", "cuda"),
                     ("GPU 0: NVIDIA GeForce GTX 1060 6GB (not supported by this PyTorch)", "cuda:0"),
                     ("GPU 1: NVIDIA GeForce RTX 4070", "cuda:1"), ("CPU (slow)", "cpu")]
    assert dlg.device.currentData() == "cpu"  # what this window runs on
    dlg.device.setCurrentIndex(dlg.device.findData("cuda:1"))
    chosen = dlg.result_settings()
    assert chosen.device == "cuda:1"
    win.apply_settings(chosen)  # a model setting: the window reloads, on the GPU asked for
    qtbot.waitUntil(lambda: win.engine_state == "failed", timeout=60000)
    assert "CUDA was requested" in win.banner.label.text()  # this CPU-only torch: the choice reached the loader
    assert AppSettings.load(win.qs).device == "cuda:1"


def test_one_gpu_and_a_saved_gpu_not_listed():
    assert device_choices([RTX_4070 | {"device": "cuda:0"}], "cuda") == [("GPU (NVIDIA)", "cuda"), ("CPU (slow)", "cpu")]
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
