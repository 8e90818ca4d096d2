"""The first-run download, for real: huggingface_hub against a loopback fake hub (HF_ENDPOINT), driven by asyncio
code on a qasync loop as in the app. Covers progress, an interrupted transfer, cancel + resume, and offline."""

from __future__ import annotations

import asyncio
from pathlib import Path

from PySide6.QtWidgets import QApplication

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


def _cancelled_midway(aio, hub, make_window, tmp_path):
    """A download cancelled halfway through the weights: (window, welcome page, its folder)."""
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
    return win, welcome, dest


def test_cancel_then_resume_where_it_stopped(qtbot, aio, hub, make_window, tiny_model, tmp_path):
    win, welcome, dest = _cancelled_midway(aio, hub, make_window, tmp_path)
    assert welcome.download_btn.text() == "Resume download" and welcome.download_btn.isEnabled()
    assert "resume" in welcome.download_status.text()
    assert not (dest / "model.safetensors").exists()
    assert len(list((dest / ".partial").glob("*/model.safetensors.part"))) == 1
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


def test_a_file_of_another_size_than_listed_is_an_error_not_a_finished_download(qtbot, aio, hub, make_window, tmp_path):
    """More bytes than the repo lists were renamed into place as the finished file (a model that then failed to
    load, or loaded wrong); fewer were reported as "offline" and failed alike on every resume. Each is now an
    error naming the file, and no such file is put in place."""
    win = make_window(model=None, wait_ready=False)
    welcome = win.welcome
    for delta, said in ((+1000, "more bytes than"), (-1000, "of its")):
        hub.body_delta = {"model.safetensors": delta}
        dest = tmp_path / f"r1{delta}"
        with qtbot.waitSignal(welcome.download.failed, timeout=120000) as blocker:
            aio.run_until_complete(asyncio.wait_for(welcome.start_download(dest), 120))
        kind, message = blocker.args
        assert kind == "error" and "model.safetensors" in message and said in message, blocker.args
        assert not (dest / "model.safetensors").exists() and not list(dest.glob(".partial/*/model.safetensors.part"))
        assert welcome.download_btn.isEnabled() and win.stack.currentWidget() is welcome


def test_a_resume_after_the_repo_changed_starts_the_file_over(qtbot, aio, hub, make_window, tiny_model, tmp_path):
    """A part of the old revision continued with the new one's bytes made a file of neither, which loaded."""
    win, welcome, dest = _cancelled_midway(aio, hub, make_window, tmp_path)
    # a new revision: the same weights, every byte changed
    new = bytes(b ^ 0xFF for b in hub.files["model.safetensors"][8:])
    hub.files["model.safetensors"] = hub.files["model.safetensors"][:8] + new
    hub.sha = "f" * 40
    hub.chunk_delay_s = 0.0
    hub.requests.clear()
    aio.run_until_complete(asyncio.wait_for(welcome.start_download(dest), 120))
    assert (dest / "model.safetensors").read_bytes() == hub.files["model.safetensors"]
    ranges = [r[2] for r in hub.requests if r[0] == "GET" and r[1].endswith("model.safetensors")]
    assert ranges == ["bytes=0-"]  # from the start, not from the old part's length
    assert not (dest / ".partial").exists()


def test_a_cancel_before_the_download_process_started_is_kept(qtbot, aio, hub, make_window, tmp_path):
    """Cancel right after Download: the child did not exist yet, so there was nothing to stop, and the whole
    model then downloaded while the screen said "paused"."""
    win = make_window(model=None, wait_ready=False)
    welcome = win.welcome
    dest = tmp_path / "r1"
    task = welcome.start_download(dest)
    welcome.cancel_download()
    assert aio.run_until_complete(asyncio.wait_for(task, 60)) is None
    assert welcome.download_btn.isEnabled() and not (dest / "model.safetensors").exists()
    assert not [r for r in hub.requests if r[0] == "GET" and r[1].endswith("model.safetensors")]


def test_closing_the_window_stops_the_download(qtbot, aio, hub, make_window, tmp_path):
    """The child process downloaded on to the end after the app had closed."""
    hub.chunk_delay_s = 0.05
    win = make_window(model=None, wait_ready=False)
    welcome = win.welcome
    closed_during = []

    def close_midway(done, total):
        if done > 12_000_000 and not closed_during:
            closed_during.append(done)
            win.close()

    welcome.download.progress.connect(close_midway)
    app = QApplication.instance()
    app.setQuitOnLastWindowClosed(False)  # the test's loop goes on after the window (the app's would end)
    try:
        assert aio.run_until_complete(asyncio.wait_for(welcome.start_download(tmp_path / "r1"), 60)) is None
    finally:
        app.setQuitOnLastWindowClosed(True)
    assert closed_during and welcome.download.proc.returncode is not None  # ended with the window
    assert not (tmp_path / "r1" / "model.safetensors").exists()


def test_picking_another_model_during_a_download_pauses_it(qtbot, aio, hub, make_window, tiny_model, tmp_path):
    """The download's end used to replace the model the user had picked meanwhile (and saved that), or start a
    4-bit copy behind the chat. Picking a model pauses the download instead; it resumes from the welcome page."""
    hub.chunk_delay_s = 0.05
    win = make_window(model=None, wait_ready=False)
    welcome = win.welcome
    welcome.quantize_box.setChecked(True)

    def pick_midway(done, total):
        if done > 12_000_000 and not win.settings.model_path:
            welcome._choose(str(tiny_model))  # as a click on a found model or a chosen folder does

    welcome.download.progress.connect(pick_midway)
    assert aio.run_until_complete(asyncio.wait_for(welcome.start_download(tmp_path / "r1"), 60)) is None
    assert win.settings.model_path == str(tiny_model) and win.settings.precision != "awq"
    assert welcome.download_btn.text() == "Resume download" and not welcome.quantizing


def test_the_users_token_goes_to_the_hub_and_not_to_the_file_host_it_redirects_to(
    qtbot, aio, hub, make_window, tiny_model, tmp_path, monkeypatch
):
    """The hub answers a file request with a redirect to its CDN; urllib forwarded every header there, the
    user's Hugging Face token (HF_TOKEN, for gated repos) included."""
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token")
    hub.cdn_host = "localhost"  # another host name for the same loopback server
    win = make_window(model=None, wait_ready=False)
    dest = tmp_path / "r1"
    assert aio.run_until_complete(asyncio.wait_for(win.welcome.start_download(dest), 120)) == str(dest)
    _same_files(dest, tiny_model)
    to_hub = [a for p, a in hub.auth if "/resolve/" in p and not p.startswith("/cdn/")]
    to_cdn = [a for p, a in hub.auth if p.startswith("/cdn/")]
    assert to_cdn and to_hub and all(a == "Bearer hf_secret_token" for a in to_hub) and set(to_cdn) == {None}
