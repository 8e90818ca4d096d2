"""r1desk's entry point: QApplication + a qasync event loop, the main window, and the --self-test mode.

The window is shown before the engine starts: torch is imported by the worker on its own thread, so the user
sees the app at once instead of waiting seconds for a silent import. The Qt loop runs through qasync so that
asyncio code can live in the GUI process without blocking it.

Self-test (used by the packaging smoke test): open the real window, load --model, send --prompt, wait for the
reply, optionally save a screenshot, print one summary line, exit 0; exit non-zero with the reason otherwise.
It uses a throw-away data folder so it never touches the user's conversations or settings.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import hashlib
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from PySide6.QtCore import QSettings, QStandardPaths, QTimer
from PySide6.QtWidgets import QApplication

from desktop.live_figures import slow_kernels_notice

SELF_TEST_TIMEOUT_S = 600


SELF_TEST_SEED = 0


def _device_arg(value: str) -> str:
    if value in ("cuda", "cpu") or re.fullmatch(r"cuda:\d+", value):
        return value
    raise argparse.ArgumentTypeError(f"{value!r}: use cuda, cuda:N (N from 0) or cpu")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="r1desk", description="Chat with DeepSeek-R1 distills on your own GPU.")
    p.add_argument("--model", help="model folder or Hugging Face repo id (from the local cache)")
    p.add_argument(
        "--device",
        type=_device_arg,
        help="override the device setting for this run: cuda (the first GPU that works), cuda:N (that one) or cpu",
    )
    p.add_argument("--self-test", action="store_true", help="load, answer --prompt, print a summary and exit")
    p.add_argument("--prompt", default="What is 17 * 23? Reason step by step.", help="self-test prompt")
    p.add_argument(
        "--screenshot", help="self-test: save a PNG of the window, its live panel open, when the reply is done"
    )
    p.add_argument("--max-new-tokens", type=int, help="cap reply length for this run (self-test default 256)")
    p.add_argument(
        "--seed",
        type=int,
        help="sampling seed for every chat reply of this run (self-test default "
        f"{SELF_TEST_SEED}: two runs write the same reply, so their speeds compare)",
    )
    p.add_argument("--theme", choices=["system", "light", "dark"], help="override the theme for this run")
    p.add_argument(
        "--remote",
        metavar="URL",
        help="use --model NAME on this OpenAI-compatible server (e.g. http://gpu-box:8089/v1) for this run",
    )
    p.add_argument("--api-key-file", metavar="FILE", help="with --remote: the server's API key, read from this file")
    args = p.parse_args(argv)
    if args.remote and not args.model:
        p.error("--remote needs --model NAME: the model's id on that server")
    if args.api_key_file and not args.remote:
        p.error("--api-key-file goes with --remote")
    return args


def remote_of(args: argparse.Namespace) -> tuple[str, str, str | None] | None:
    """(base URL, model, key) for --remote, the key read from --api-key-file (its first line)."""
    if not args.remote:
        return None
    from desktop.servers import normalised_url

    key = None
    if args.api_key_file:
        try:
            key = Path(args.api_key_file).read_text(encoding="utf-8").strip().splitlines()[0].strip() or None
        except (OSError, IndexError) as err:
            raise SystemExit(f"r1desk: could not read the API key from {args.api_key_file}: {err}") from None
    return normalised_url(args.remote), args.model, key


def data_dir() -> Path:
    """Where conversations live: the platform's user data folder (R1DESK_DATA_DIR overrides, for tests)."""
    env = os.environ.get("R1DESK_DATA_DIR")
    if env:
        return Path(env)
    return Path(QStandardPaths.writableLocation(QStandardPaths.AppDataLocation))


def make_qsettings() -> QSettings:
    env = os.environ.get("R1DESK_CONFIG_DIR")
    if env:
        return QSettings(str(Path(env) / "r1desk.ini"), QSettings.IniFormat)
    return QSettings()


def build_window(args: argparse.Namespace, crash_log=None):
    """The main window over the user's conversations. A database that can't be opened or fails its check is
    moved aside (kept, never deleted) and a new one started; the window says where the old one went. With a
    crash log, a run that ended without closing is reported in a banner too."""
    import sqlite3

    from desktop.store import Store, open_store
    from desktop.window import MainWindow

    previous = crash_log.collect_previous() if crash_log is not None else None
    if crash_log is not None:
        crash_log.start()
    db_path = data_dir() / "conversations.sqlite3"
    try:
        store, moved_aside, unavailable = *open_store(db_path), None
    except (sqlite3.Error, OSError) as err:  # a read-only folder, a full disk, a file another program locks
        store, moved_aside, unavailable = Store(":memory:"), None, err  # the app still works; the file untouched
    qs = make_qsettings()
    if args.theme:
        qs.setValue("settings/theme", args.theme)
    max_new = args.max_new_tokens or (256 if args.self_test else None)
    seed = args.seed if args.seed is not None else (SELF_TEST_SEED if args.self_test else None)
    remote = remote_of(args)
    win = MainWindow(
        qs,
        store,
        model=None if remote else args.model,
        device=args.device,
        max_new_tokens=max_new,
        seed=seed,
        remote=remote,
    )
    win.crash_log = crash_log
    win.show_start_notices(previous, moved_aside, (db_path, unavailable) if unavailable else None)
    return win


def _gap_summary(gaps_ms: list[float]) -> str:
    """Where a reply's decode time went beyond the typical step: the median gap between tokens, the slowest,
    and the time spent in gaps over 5 ms (host stalls: the GUI thread holding the GIL, a garbage collection)."""
    if not gaps_ms:
        return ""
    ordered = sorted(gaps_ms)
    median = ordered[len(ordered) // 2]
    stalls = [g for g in gaps_ms if g > 5.0]
    return (
        f" gap_ms_p50={median:.2f} gap_ms_max={ordered[-1]:.1f} "
        f"stalls_over_5ms={len(stalls)} stall_ms={sum(g - median for g in stalls):.0f}"
    )


class SelfTest:
    def __init__(self, win, args):
        self.win, self.args = win, args
        self.code: int | None = None
        self.reply_digest = ""  # the reply's text, hashed: two runs with one seed write the same
        self.t0 = time.monotonic()
        win.engine_ready.connect(self._ready)
        win.reply_finished.connect(self._finished)
        win.engine_failed.connect(lambda kind, msg: self._fail(f"model did not load ({kind}): {msg}"))
        win.reply_failed.connect(lambda kind, msg: self._fail(f"reply failed ({kind}): {msg}"))
        QTimer.singleShot(SELF_TEST_TIMEOUT_S * 1000, lambda: self._fail(f"timed out after {SELF_TEST_TIMEOUT_S} s", 2))

    def _ready(self, _info) -> None:
        if not self.win.send(self.args.prompt):
            self._fail("could not send the prompt")

    def _finished(self, msg: dict) -> None:
        s = msg.get("stats") or {}
        self.reply_digest = hashlib.sha1((msg.get("content") or "").encode()).hexdigest()[:12]
        if self.args.screenshot:
            self.win.topbar.live_btn.setChecked(True)  # the picture shows the run's figures and any notice
            QTimer.singleShot(100, lambda: self._shoot_and_exit(s))  # let the last frame paint
        else:
            self._exit_ok(s)

    def _shoot_and_exit(self, s: dict) -> None:
        Path(self.args.screenshot).parent.mkdir(parents=True, exist_ok=True)
        if not self.win.grab().save(self.args.screenshot):
            return self._fail(f"could not save the screenshot to {self.args.screenshot}")
        self._exit_ok(s)

    def _exit_ok(self, s: dict) -> None:
        info = self.win.engine_info or {}
        print(
            f"r1desk self-test ok: model={info.get('model_name')} device={info.get('device')} "
            f"tokens={s.get('completion_tokens')} ttft_ms={s.get('ttft_ms', 0):.0f} "
            f"tok_s={s.get('decode_tok_s', 0):.1f} finish={s.get('finish_reason')} seed={s.get('seed')} "
            f"reply={self.reply_digest} kernels={info.get('kernels')} graphs={bool(info.get('cuda_graphs'))} "
            f"wall_s={time.monotonic() - self.t0:.1f}{_gap_summary(s.get('token_latencies_ms') or [])}",
            flush=True,
        )
        notice = slow_kernels_notice(info)
        if notice:  # what the live panel shows the user: the packaged app's fallback is checked by it
            print(f"r1desk self-test notice: {notice}", flush=True)
        self._quit(0)

    def _fail(self, reason: str, code: int = 1) -> None:
        if self.code is None:
            print(f"r1desk self-test FAILED: {reason}", file=sys.stderr, flush=True)
            self._quit(code)

    def _quit(self, code: int) -> None:
        if self.code is None:
            self.code = code
            self.win.close()
            QApplication.instance().quit()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--download-worker"]:  # the frozen app re-runs itself as the download child process
        from desktop.download import worker_main

        return worker_main(argv[1:])
    args = parse_args(argv)
    if args.self_test and not args.model:
        print("r1desk self-test FAILED: --self-test needs --model", file=sys.stderr)
        return 2
    if args.self_test:  # a throw-away profile: never touch the user's history or settings
        tmp = tempfile.mkdtemp(prefix="r1desk-selftest-")
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # and leave none behind in the temp folder
        os.environ.setdefault("R1DESK_DATA_DIR", tmp)
        os.environ.setdefault("R1DESK_CONFIG_DIR", tmp)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    if app.windowIcon().isNull():  # the bundle's launcher has set it already
        from desktop.appicon import install_app_icon

        install_app_icon(app)
    app.setApplicationName("r1desk")
    app.setOrganizationName("r1desk")
    app.setApplicationDisplayName("r1desk")

    from desktop.crashlog import CrashLog
    from desktop.fastloop import qt_event_loop
    from desktop.gcguard import GuiThreadGC
    from desktop.single_instance import SingleInstance

    instance = SingleInstance(data_dir() / "instance", parent=app)
    if not instance.acquire():
        print("r1desk is already running: its window was asked to come to the front", file=sys.stderr)
        return 0

    # The GUI thread holds the GIL for every Python line and every Qt call it makes; the engine thread needs it
    # for a moment between tokens, which a fast GPU makes far less than Python's switch interval (5 ms by
    # default) apart. Python hands the GIL over only after that interval of the other thread's bytecode: shorten
    # it so rendering can never hold the decode loop back by more than about a token.
    sys.setswitchinterval(0.0005)
    app._r1desk_gc = GuiThreadGC(parent=app)  # lives as long as the app: collects on the GUI thread
    crash_log = CrashLog(data_dir() / "logs")
    win = build_window(args, crash_log)
    win.hard_exit_on_stuck_thread = True
    instance.activated.connect(win.bring_to_front)
    win.show()
    test = SelfTest(win, args) if args.self_test else None
    QTimer.singleShot(0, win.start_engine)  # after the first paint: the user sees the window at once

    loop = qt_event_loop(app)  # qasync's, with asyncio's own callback/timer/socket bookkeeping (fastloop.py)
    asyncio.set_event_loop(loop)
    done = asyncio.Event()
    app.aboutToQuit.connect(done.set)
    with loop:
        loop.run_until_complete(done.wait())
        loop.run_until_complete(win.api.aclose())  # stop listening before the loop closes
    win.store.close()
    crash_log.stop()
    instance.release()
    if test is not None:
        return test.code if test.code is not None else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
