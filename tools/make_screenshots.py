"""Regenerate docs/screenshot-*.png: the real window, a scripted R1-style reply (fake engine), offscreen.

    QT_QPA_PLATFORM=offscreen python -m tools.make_screenshots docs

Shots: light and dark mid-reply (reasoning folded above an answer with code, a table and math; live panel
open), the reasoning streaming live (light and dark), the first-run screen, the notice shown after a crash, and
the local API server at work (real requests from the openai client; a chat reply waiting behind one) with its
settings, the first start preparing GPU kernels, a GPU the installed torch has no code for, the Device list
of a machine with two GPUs, and the live panel of a laptop GPU held at its power cap (`--only live-clock`
makes that one alone).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from PySide6.QtCore import QEventLoop, QSettings, QTimer
from PySide6.QtWidgets import QApplication

from tests.desktop.fakes import FakeEngine, factory  # the scripted engine the window's tests use


def wait_until(pred, timeout_ms=30000):
    loop = QEventLoop()
    timer = QTimer()
    timer.timeout.connect(lambda: loop.quit() if pred() else None)
    timer.start(10)
    QTimer.singleShot(timeout_ms, loop.quit)
    loop.exec()
    timer.stop()
    if not pred():
        raise TimeoutError("condition not reached")


def make_window(theme: str, tmp: Path, engine: FakeEngine | None, with_model=True, live=True, model=None, **settings):
    """engine None: the real engine, loading `model` (a folder)."""
    from desktop.store import Store
    from desktop.window import MainWindow

    qs = QSettings(str(tmp / f"{theme}.ini"), QSettings.IniFormat)
    qs.setValue("settings/theme", theme)
    qs.setValue("window/live_panel", "true" if live else "false")
    for key, value in settings.items():
        qs.setValue(f"settings/{key}", value)
    store = Store(tmp / f"{theme}.sqlite3")
    win = MainWindow(qs, store, model=model or ("/models/DeepSeek-R1-Distill-Qwen-1.5B" if with_model else None))
    win.engine_factory = factory(engine) if engine is not None else None
    win.resize(1440, 900)
    win.show()
    return win


def shoot(win, path: Path) -> None:
    from desktop.mathimg import wait_math_idle

    wait_math_idle(30)  # formulas are drawn on the math thread: let them arrive and be painted
    for _ in range(3):
        QApplication.processEvents()
    win.grab().save(str(path))
    print("saved", path)


def main(out: str, only: str | None = None) -> None:
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    _app = QApplication.instance() or QApplication(sys.argv[:1])  # noqa: F841
    tmp = Path(tempfile.mkdtemp())
    if only is not None:
        {
            "live-clock": live_clock_shot,
            "gpus": gpu_choice_shot,
            "api": api_shots,
            "batch": batch_shot,
            "vote": vote_shots,
            "remote": remote_shots,
            "no-triton": no_triton_shot,
        }[only](out_dir, tmp)
        return
    for theme in ("light", "dark"):
        engine = FakeEngine(token_s=0.002)
        win = make_window(theme, tmp, engine)
        win.start_engine()
        wait_until(lambda: win.engine_state == "ready")
        win.send("What is 1 + 2?")  # an earlier, finished exchange above the one being captured
        wait_until(lambda: win.stream is None)
        engine.token_s = 0.02
        win.send("Prove that the sum of the first n odd numbers is n², and give me Python to check it.")
        wait_until(lambda: win.stream is not None and len(win.stream.reasoning) > 330)
        wait_until(lambda: win.stream.frames > 0)
        shoot(win, out_dir / f"screenshot-thinking-{theme}.png")
        wait_until(lambda: win.stream is not None and "So for" in win.stream.answer, 60000)
        win.stream.flush()
        win.chat.scroll_to_bottom()
        wait_until(lambda: win.live.reply is not None and len(win.live.reply.rate_series) > 8)
        shoot(win, out_dir / f"screenshot-{theme}.png")
        win.stop()
        wait_until(lambda: win.stream is None)
        if theme == "light":  # the notice after a crash, over the conversation it kept
            import datetime

            from desktop.crashlog import PreviousCrash

            log = Path.home() / ".local/share/r1desk/r1desk/logs/crash-20261203-101542.log"
            win.show_start_notices(PreviousCrash(log, datetime.datetime(2026, 12, 3, 10, 15), fatal=True))
            win.topbar.live_btn.setChecked(False)
            shoot(win, out_dir / "screenshot-crash-notice.png")
        win.close()
    for var in ("R1DESK_DATA_DIR",):
        os.environ.pop(var, None)
    win = make_window("light", tmp / "first", FakeEngine(), with_model=False, live=False)
    (tmp / "first").mkdir(exist_ok=True)
    win.start_engine()
    wait_until(lambda: not win.welcome.scanning)
    shoot(win, out_dir / "screenshot-welcome.png")
    win.close()
    first_start_shot(out_dir, tmp)
    api_shots(out_dir, tmp)
    remote_shots(out_dir, tmp)
    unsupported_gpu_shot(out_dir, tmp)
    gpu_choice_shot(out_dir, tmp)
    live_clock_shot(out_dir, tmp)
    no_triton_shot(out_dir, tmp)


def no_triton_shot(out_dir: Path, tmp: Path) -> None:
    """The live panel of a laptop GPU on which r1desk's Triton kernels can't be built (the bundle's launcher found
    no C compiler): the notice that says what the user loses and how to get the kernels back."""
    from tests.desktop.fakes import FakeInfo

    from model_loader.kernels import COMPILER_HINT

    note = f"no C compiler was found, which Triton needs to build its kernels' launchers. {COMPILER_HINT}"
    engine = FakeEngine(token_s=0.01, info=FakeInfo(kernels="pytorch", kernels_note=note))
    (tmp / "no-triton").mkdir(exist_ok=True)
    win = make_window("light", tmp / "no-triton", engine)
    win.start_engine()
    wait_until(lambda: win.engine_state == "ready")
    win.send("What is 1 + 2?")
    wait_until(lambda: win.stream is None, 60000)
    win.live.refresh()
    shoot(win.live, out_dir / "screenshot-live-no-triton.png")
    win.close()


def live_clock_shot(out_dir: Path, tmp: Path) -> None:
    """The live panel after a reply on a laptop RTX 4070 that its power cap holds at 1,605 of 2,175 MHz: NVML
    set to report what such a driver does (the SM clock row in the danger colour, the reason in its tooltip)."""
    import types
    from types import SimpleNamespace

    from tests.desktop.fakes import FakeInfo

    nvml = types.ModuleType("pynvml")
    nvml.NVML_CLOCK_SM = 1
    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetHandleByUUID = lambda uuid: "h"
    nvml.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=98)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(free=int(3.4 * 2**30), total=8 * 2**30)
    nvml.nvmlDeviceGetClockInfo = lambda h, kind: 1605
    nvml.nvmlDeviceGetMaxClockInfo = lambda h, kind: 2175
    nvml.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x4  # the software power cap
    real = sys.modules.get("pynvml")
    sys.modules["pynvml"] = nvml
    try:
        (tmp / "clock").mkdir(exist_ok=True)
        # ~70 tok/s: what such a GPU's ~256 GB/s of memory allows the 1.5B in bf16 (3.1 GB a token), so the
        # panel's memory-read row shows a rate the card could deliver
        win = make_window("light", tmp / "clock", FakeEngine(token_s=0.014, info=FakeInfo(gpu_uuid="GPU-laptop")))
        win.start_engine()
        wait_until(lambda: win.engine_state == "ready")
        win.send("What is 1 + 2?")
        wait_until(lambda: win.stream is None)
        wait_until(lambda: win.live.values["slowed"].text() == "power cap", 10000)
        for _ in range(3):
            QApplication.processEvents()
        win.live.grab().save(str(out_dir / "screenshot-live-power-cap.png"))
        print("saved", out_dir / "screenshot-live-power-cap.png")
        win.close()
    finally:
        if real is not None:
            sys.modules["pynvml"] = real
        else:
            sys.modules.pop("pynvml", None)


def gpu_choice_shot(out_dir: Path, tmp: Path) -> None:
    """Settings > Device on a machine with two GPUs (an old GTX 1060 beside an RTX 4070), its list open. The
    list is a separate window that an offscreen grab of the dialog leaves out: drawn in below its box."""
    from dataclasses import replace

    from PySide6.QtCore import QPoint
    from PySide6.QtGui import QImage, QPainter

    from desktop.settings import SettingsDialog

    (tmp / "gpus").mkdir(exist_ok=True)
    win = make_window("light", tmp / "gpus", FakeEngine(), live=False)
    gpus = [
        {"device": "cuda:0", "name": "NVIDIA GeForce GTX 1060 6GB", "supported": False},
        {"device": "cuda:1", "name": "NVIDIA GeForce RTX 4070", "supported": True},
    ]
    dlg = SettingsDialog(replace(win.settings, device="cuda:1"), win, gpus=gpus)
    dlg.show()
    dlg.device.showPopup()
    for _ in range(5):
        QApplication.processEvents()
    popup = dlg.device.view().window()
    shot = dlg.grab()
    at = dlg.device.mapTo(dlg, QPoint(0, dlg.device.height()))
    height = dlg.kv_cache.mapTo(dlg, QPoint(0, dlg.kv_cache.height())).y() + 12  # the rows around the list
    img = QImage(max(shot.width(), at.x() + popup.width() + 12), height, QImage.Format_ARGB32)
    img.fill(dlg.palette().window().color())
    painter = QPainter(img)
    painter.drawPixmap(0, 0, shot)
    painter.drawPixmap(at, popup.grab())
    painter.end()
    img.save(str(out_dir / "screenshot-settings-gpus.png"))
    print("saved", out_dir / "screenshot-settings-gpus.png")
    dlg.device.hidePopup()
    dlg.close()
    win.close()


def unsupported_gpu_shot(out_dir: Path, tmp: Path) -> None:
    """A GTX 1060 under a torch built for CUDA 13: the loader's message (model_loader.gpu_support, the text a
    real load gives) and the CPU offered instead."""
    from model_loader.errors import GpuUnsupportedError
    from model_loader.gpu_support import unsupported_gpu_reason

    reason = unsupported_gpu_reason(
        (6, 1), ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"], "NVIDIA GeForce GTX 1060 6GB", "2.13.0+cu130"
    )
    win = make_window("light", tmp / "gpu", FakeEngine(), live=False)
    (tmp / "gpu").mkdir(exist_ok=True)
    win.engine_factory = factory(FakeEngine(), fail_load=GpuUnsupportedError(reason))
    win.start_engine()
    wait_until(lambda: win.engine_state == "failed")
    shoot(win, out_dir / "screenshot-gpu-unsupported.png")
    win.close()


def first_start_shot(out_dir: Path, tmp: Path) -> None:
    """The first start on a machine: the warm-up compiling GPU kernels, its steps as progress."""
    import threading

    class CompilingEngine(FakeEngine):
        first_start = True
        release = threading.Event()

        def warm_up(self, progress=None):
            progress(0, 16, "compiling every kernel at once (16 worker processes)")  # Engine.warm_up's first step
            self.release.wait(30)

    engine = CompilingEngine()
    win = make_window("dark", tmp / "first-start", engine, live=False)
    # the weights load slowly enough to be seen, the kernels compiling beside them (Engine.load's on_compiling)
    win.engine_factory = factory(engine, chunk_s=0.02, chunks=200, compiling=True)
    (tmp / "first-start").mkdir(exist_ok=True)
    win.start_engine()

    def loaded(text: str) -> float:  # "Loading model… 1.20 / 3.31 GB · …" -> 0.36
        try:
            done, total = text.split("… ", 1)[1].split(" GB", 1)[0].split(" / ")
            return float(done) / float(total)
        except (IndexError, ValueError, ZeroDivisionError):
            return 0.0

    wait_until(lambda: "alongside" in win.topbar.status_label.text() and loaded(win.topbar.status_label.text()) > 0.4)
    shoot(win, out_dir / "screenshot-first-start-loading.png")
    wait_until(lambda: "1/16" in win.topbar.status_label.text())
    shoot(win, out_dir / "screenshot-first-start.png")
    engine.release.set()
    wait_until(lambda: win.engine_state == "ready")
    win.close()


def api_shots(out_dir: Path, tmp: Path) -> None:
    """The API server serving real openai-client requests, a chat reply waiting behind one, and its settings."""
    import asyncio
    import threading

    import openai
    import qasync

    from desktop.settings import SettingsDialog

    loop = qasync.QEventLoop(QApplication.instance(), already_running=True)  # as app.main's loop: aiohttp needs it
    asyncio.set_event_loop(loop)
    engine = FakeEngine(token_s=0.001)
    (tmp / "api").mkdir(exist_ok=True)
    win = make_window("dark", tmp / "api", engine, api_enabled="true", api_port=8089)
    win.start_engine()
    wait_until(lambda: win.engine_state == "ready" and win.api.label.isVisible())
    client = openai.OpenAI(base_url=win.api.url, api_key="none", max_retries=0)
    done = []

    def requests():
        for q in ("Summarize this commit message.", "Is 2027 prime?", "Write a haiku about lighthouses."):
            client.chat.completions.create(model=win.service.model_name, messages=[{"role": "user", "content": q}])
        done.append(1)
        engine.token_s = 0.02  # a slow one, for the chat reply to wait behind
        list(
            client.chat.completions.create(
                model=win.service.model_name, stream=True, messages=[{"role": "user", "content": "Explain GQA."}]
            )
        )

    threading.Thread(target=requests, daemon=True).start()
    wait_until(lambda: done and win.service.running is not None and win.service.running.client == "api")
    win.send("What is the sum of the first n odd numbers?")
    wait_until(lambda: win.stream is not None and "waiting" in win.stream.widget.meta.text())
    shoot(win, out_dir / "screenshot-api.png")
    dlg = SettingsDialog(win.settings, win)
    dlg.show()
    shoot(dlg, out_dir / "screenshot-settings-api.png")
    dlg.close()
    win.stop()
    win.close()


def remote_shots(out_dir: Path, tmp: Path) -> None:
    """A second r1desk as the client of the first one's API (the shared box): the Add server dialog once it has
    listed the server's models, Settings with the server's model picked, and a reply from it with the live panel."""
    import asyncio

    import keyring
    import qasync
    from keyring.backend import KeyringBackend

    from desktop.server_dialog import AddServerDialog
    from desktop.servers import Server, servers_to_json
    from desktop.settings import SettingsDialog

    class Ring(KeyringBackend):  # the system keyring's part in the dialog's text, without touching the real one
        priority = 1

        def get_password(self, service, username):
            return None

        def set_password(self, service, username, password):
            pass

        def delete_password(self, service, username):
            pass

    keyring.set_keyring(Ring())
    loop = qasync.QEventLoop(QApplication.instance(), already_running=True)
    asyncio.set_event_loop(loop)
    (tmp / "box").mkdir(exist_ok=True)
    box = make_window("dark", tmp / "box", FakeEngine(token_s=0.004), api_enabled="true", api_port=8090, live=False)
    box.start_engine()
    wait_until(lambda: box.engine_state == "ready" and box.api.label.isVisible())
    model = box.service.model_name
    (tmp / "client").mkdir(exist_ok=True)
    servers = servers_to_json([Server("Lab server", box.api.url, False, [model])])
    win = make_window(
        "light",
        tmp / "client",
        None,
        with_model=False,
        servers=servers,
        remote_server=box.api.url,
        remote_model=model,
        model_path="/models/DeepSeek-R1-Distill-Qwen-1.5B",  # a local model too: the top bar's picker shows both
    )
    dlg = AddServerDialog(win, keys_where="the system keyring (Ring)")
    dlg.url.setText(box.api.url)
    dlg.name.setText("Lab server")
    dlg.key.setText("sk-lab-0042")
    dlg.check()
    wait_until(lambda: bool(dlg.models))
    dlg.show()
    shoot(dlg, out_dir / "screenshot-add-server.png")
    dlg.close()
    win.start_engine()
    wait_until(lambda: win.engine_state in ("ready", "failed"))
    assert win.engine_state == "ready", win.banner.label.text()
    settings = SettingsDialog(win.settings, win, keys_where="the system keyring")
    settings.show()
    shoot(settings, out_dir / "screenshot-settings-remote.png")
    settings.close()
    win.send("Prove that the sum of the first n odd numbers is n², and give me Python to check it.")
    wait_until(lambda: win.stream is None, 60000)  # the whole reply: the panel shows its final numbers
    win.chat.scroll_to_bottom()
    shoot(win, out_dir / "screenshot-remote.png")
    win.close()
    box.close()


def vote_shots(out_dir: Path, tmp: Path) -> None:
    """Ask ×8: a reply that is the majority of eight chains (one in four of the scripted chains slips to another
    answer), and its chains."""
    from dataclasses import dataclass

    from desktop.vote import ChainsDialog

    @dataclass
    class Slipping(FakeEngine):
        def generate(self, messages, settings=None, control=None, tools=None, continue_final=False):
            slip = settings is not None and settings.seed % 4 == 3
            self.answer = ANSWER.replace("\\boxed{10000}", "\\boxed{9999}") if slip else ANSWER
            yield from super().generate(messages, settings, control)

    from tests.desktop.fakes import ANSWER

    engine = Slipping(token_s=0.0005)
    (tmp / "vote").mkdir(exist_ok=True)
    win = make_window("light", tmp / "vote", engine, vote_chains=8, seed=1)
    win.start_engine()
    wait_until(lambda: win.engine_state == "ready")
    win.seed_override = 1
    win.composer.set_text("What is the sum of the first 100 odd numbers? Put the answer in \\boxed{}.")
    win.composer.vote_btn.click()
    wait_until(lambda: win.stream is None and win.engine_state == "ready", 60000)
    win.chat.scroll_to_bottom()
    shoot(win, out_dir / "screenshot-vote.png")
    msg = win.store.messages(win.conv_id)[-1]
    dlg = ChainsDialog(msg["stats"]["vote"], win)
    dlg.show()
    dlg.list.setCurrentRow(3)
    shoot(dlg, out_dir / "screenshot-vote-chains.png")
    dlg.close()
    win.close()


def batch_shot(out_dir: Path, tmp: Path) -> None:
    """The live panel while the real engine (the tiny random model, on the CPU) writes four replies at once: three
    API requests and a chat reply (Settings → Replies at once 4)."""
    import asyncio
    import threading

    import openai
    import qasync

    from model_loader.testmodel import make_test_model

    loop = qasync.QEventLoop(QApplication.instance(), already_running=True)
    asyncio.set_event_loop(loop)
    model = make_test_model(tmp / "tiny-r1", preset="tiny", seed=0)
    (tmp / "batch").mkdir(exist_ok=True)
    win = make_window(
        "dark",
        tmp / "batch",
        None,
        model=str(model),
        api_enabled="true",
        api_port=0,
        device="cpu",
        max_parallel=4,
        context_length=2048,
        max_new_tokens=1500,
    )
    win.start_engine()
    wait_until(lambda: win.engine_state == "ready" and win.api.label.isVisible(), 60000)
    client = openai.OpenAI(base_url=win.api.url, api_key="none", max_retries=0)

    def request(q):
        list(
            client.chat.completions.create(
                model=win.service.model_name, stream=True, max_tokens=1500, messages=[{"role": "user", "content": q}]
            )
        )

    for q in ("Summarize this commit message.", "Is 2027 prime?", "Write a haiku about lighthouses."):
        threading.Thread(target=request, args=(q,), daemon=True).start()
    wait_until(lambda: len(win.service.active) == 3)
    win.send("What is the sum of the first n odd numbers?")
    wait_until(
        lambda: (
            len(win.service.active) == 4
            and win.live.reply is not None
            and win.live.reply.count > 200
            and len(win.live.all_tokens) > 20
        ),
        60000,
    )
    win.live.refresh()
    shoot(win.live, out_dir / "screenshot-live-batch.png")
    win.stop()
    win.close()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Regenerate docs/screenshot-*.png")
    parser.add_argument("out", nargs="?", default="docs")
    parser.add_argument(
        "--only",
        choices=["live-clock", "gpus", "api", "batch", "vote", "remote", "no-triton"],
        help="make these shots alone",
    )
    cli = parser.parse_args()
    main(cli.out, cli.only)
