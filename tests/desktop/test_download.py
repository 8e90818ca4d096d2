"""The first-run download, for real: huggingface_hub against a loopback fake hub (HF_ENDPOINT), driven by asyncio
code on a qasync loop as in the app. Covers progress, an interrupted transfer, cancel + resume, and offline."""

from __future__ import annotations

import asyncio
from pathlib import Path

from desktop.download import OFFLINE_MESSAGE


def _same_files(a, b):
    names = sorted(p.name for p in Path(a).iterdir() if p.is_file())
    assert names == sorted(p.name for p in Path(b).iterdir() if p.is_file())
    assert all((Path(a) / n).read_bytes() == (Path(b) / n).read_bytes() for n in names)


def test_download_survives_an_interrupted_transfer_then_loads(qtbot, aio, hub, make_window, tiny_model, tmp_path):
    hub.cut_first_transfer = True  # the server drops each big file halfway the first time
    win = make_window(model=None, wait_ready=False)
    welcome = win.welcome
    seen = []
    welcome.download.progress.connect(lambda d, t: seen.append((d, t)))
    dest = tmp_path / "models" / "r1"
    task = welcome.start_download(dest)
    assert not welcome.download_btn.isEnabled() and welcome.cancel_btn.isVisible()
    with qtbot.waitSignal(win.engine_ready, timeout=120000):  # download done -> chosen -> loaded
        assert aio.run_until_complete(asyncio.wait_for(task, 120)) == str(dest)
    _same_files(dest, tiny_model)
    assert seen and seen[-1][0] == seen[-1][1] == sum(p.stat().st_size for p in Path(tiny_model).iterdir())
    assert any(r[2] and r[2] != "bytes=0-" for r in hub.requests)  # the cut transfer resumed with a Range request
    assert welcome.download_status.text() == "Download complete."
    assert win.settings.model_path == str(dest) and win.stack.currentWidget() is win.chat_page


def test_cancel_then_resume_where_it_stopped(qtbot, aio, hub, make_window, tiny_model, tmp_path):
    hub.chunk_delay_s = 0.05  # ~8 s for the weights: time to cancel mid-file
    win = make_window(model=None, wait_ready=False)
    welcome = win.welcome
    dest = tmp_path / "r1"
    def cancel_midway(done, total):
        if done > 12_000_000:
            welcome.cancel_download()

    welcome.download.progress.connect(cancel_midway)
    assert aio.run_until_complete(asyncio.wait_for(welcome.start_download(dest), 60)) is None
    welcome.download.progress.disconnect(cancel_midway)
    assert welcome.download_btn.text() == "Resume download" and welcome.download_btn.isEnabled()
    assert "resume" in welcome.download_status.text()
    assert not (dest / "model.safetensors").exists() and (dest / ".partial" / "model.safetensors.part").is_file()
    hub.chunk_delay_s = 0.0
    hub.requests.clear()
    with qtbot.waitSignal(win.engine_ready, timeout=120000):
        assert aio.run_until_complete(asyncio.wait_for(welcome.start_download(dest), 120)) == str(dest)
    _same_files(dest, tiny_model)
    ranges = [r[2] for r in hub.requests if r[0] == "GET" and r[1].endswith("model.safetensors")]
    assert ranges and ranges[0] and int(ranges[0].split("=")[1].rstrip("-")) > 1_000_000  # resumed, not restarted


def test_offline_download_says_so_and_the_other_choices_remain(qtbot, aio, make_window, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: no network
    win = make_window(model=None, wait_ready=False)
    welcome = win.welcome
    with qtbot.waitSignal(welcome.download.failed, timeout=60000) as blocker:
        aio.run_until_complete(asyncio.wait_for(welcome.start_download(tmp_path / "r1"), 60))
    assert blocker.args == ["offline", OFFLINE_MESSAGE]
    assert welcome.download_status.text() == OFFLINE_MESSAGE
    assert welcome.folder_btn.isEnabled() and welcome.download_btn.isEnabled() and welcome.found.isEnabled()
    assert win.stack.currentWidget() is welcome
