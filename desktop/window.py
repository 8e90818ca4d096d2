"""The main window: layout, conversation list, composer, engine state, settings and closing.

The window composes its parts and decides what a user's action does; each part has one job elsewhere: the
sidebar and its conversation list (desktop.sidebar), renaming, deleting and exporting a chat
(desktop.conversations), the top bar (desktop.topbar) and what it says about the engine (desktop.engine_status),
the chat page (desktop.chatpage), a reply's life and its saving (desktop.replies), the live panel, which listens to
the service so it counts every request (desktop.livepanel), the API server's switch and address
(desktop.apicontrol), and what a start found (desktop.start_notices).

The engine belongs to an EngineService (desktop.service), which also keeps its state: the window asks it for
replies like any other client (the local API server is the other one) and never touches the worker.

See desktop.replies for a reply's lifecycle.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
from pathlib import Path

from PySide6.QtCore import QByteArray, QEvent, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import QApplication, QMainWindow, QMessageBox, QSplitter, QStackedWidget, QVBoxLayout, QWidget

from desktop import theme as themes
from desktop.apicontrol import ApiControl
from desktop.chatpage import ChatPage
from desktop.conversations import ConversationActions
from desktop.engine_status import EngineStatus, model_title
from desktop.livepanel import LivePanel
from desktop.markdown import MarkdownRenderer
from desktop.replies import ReplyController
from desktop.server_watch import ServerWatch
from desktop.servers import KeyStore, Server, servers_to_json
from desktop.service import EngineService
from desktop.settings import AppSettings, SettingsDialog
from desktop.sidebar import Sidebar
from desktop.start_notices import start_notice
from desktop.store import Store, store_problem
from desktop.topbar import TopBar
from desktop.welcome import WelcomePage
from desktop.worker import LoadRequest
from model_loader.chat import history_message  # plain text rules: no torch


MIN_WIDTH, MIN_HEIGHT = 760, 520  # the smallest window; wider while the live panel is open (_fit_minimum_size)


class MainWindow(QMainWindow):
    # for the self-test and tests: what happened, in GUI terms
    engine_ready = Signal(object)
    engine_failed = Signal(str, str)
    reply_finished = Signal(object)  # the saved assistant message
    reply_failed = Signal(str, str)

    def __init__(
        self,
        qsettings: QSettings,
        store: Store,
        model: str | None = None,
        device: str | None = None,
        max_new_tokens: int | None = None,
        seed: int | None = None,
        remote: tuple[str, str, str | None] | None = None,
    ):
        """model: a folder to use for this run; remote: (base URL, model, key) of a server's model to use for
        this run instead (`r1desk --remote`; its key is kept for this run only)."""
        super().__init__()
        self.qs = qsettings
        self.settings = AppSettings.load(qsettings)
        self.remote_key: str | None = None
        if model:
            self.settings.model_path = model
            self.settings.remote_server = ""  # a folder named at the start is the model to use
        if remote:
            url, name, self.remote_key = remote
            servers = [s for s in self.settings.server_list() if s.url != url]
            self.settings.servers = servers_to_json([*servers, Server(url, url, False, [name])])
            self.settings.remote_server, self.settings.remote_model = url, name
        if device:
            self.settings.device = device
        self.max_new_override = max_new_tokens
        self.seed_override = seed  # every reply of this run samples from this seed (the self-test's runs compare)
        self.store = store
        self.theme = themes.resolve(self.settings.theme)
        themes.apply(QApplication.instance(), self.theme, self.settings.font_size)  # before widgets exist
        self.renderer = self._make_renderer()
        self.setWindowTitle("r1desk")
        self.setAccessibleName("r1desk")
        self.setMinimumSize(MIN_WIDTH, MIN_HEIGHT)

        self.service: EngineService | None = None
        self.engine_factory = None  # tests: a callable(request, progress, on_compiling) -> engine, not Engine.load
        self.quantize_options = dict(group_size=128)  # the 4-bit copy; tests use 32 (the tiny model is 64 wide)
        self.engine_info: dict | None = None
        self.conv_id: int | None = None
        self.editing_msg_id: int | None = None
        self.editing_conv_id: int | None = None  # the chat of the message being edited
        self._closing = False
        self._restyle_after_reply = False  # the theme or font changed while a reply streamed (apply_theme)
        self._reload_pending = False
        self.hard_exit_on_stuck_thread = False  # app.main sets it: a stuck load must not keep a zombie window
        self.crash_log = None  # app.main's CrashLog: stopped (a clean exit) before a hard exit too

        from desktop.markdown import prewarm_rendering

        prewarm_rendering()
        self.api = ApiControl(self)
        self.api.failed.connect(
            lambda why: self.banner.show_message(
                "api", f"The local API server is off: {why}.", [("Settings…", self.open_settings)]
            )
        )
        self.api.apply(self.settings)
        self._build()
        self._shortcuts()
        self.replies = ReplyController(self)
        self.replies.finished.connect(self.reply_finished)
        self.replies.failed.connect(self.reply_failed)
        self.replies.ended.connect(self._on_reply_ended)
        self.apply_theme()
        hints = QGuiApplication.styleHints()
        if hasattr(hints, "colorSchemeChanged"):
            # A bound method, not a lambda: Qt drops the connection when this window is destroyed.
            hints.colorSchemeChanged.connect(self._on_color_scheme)
        self._restore()

    # ------------------------------------------------------------------ layout
    def _build(self) -> None:
        """Sidebar | top bar over the welcome page or the chat page | live panel, in a splitter."""
        splitter = QSplitter(Qt.Horizontal)
        splitter.setHandleWidth(1)
        splitter.setChildrenCollapsible(False)
        self.splitter = splitter

        self.sidebar = Sidebar()
        self.sidebar.new_chat_requested.connect(self.new_chat)
        self.sidebar.query_changed.connect(lambda _q: self.refresh_list())
        self.sidebar.opened.connect(self._on_list_opened)
        self.sidebar.rename_requested.connect(self.rename_conversation)
        self.sidebar.export_requested.connect(self.export_conversation)
        self.sidebar.delete_requested.connect(self.delete_conversation)
        splitter.addWidget(self.sidebar)

        center = QWidget()
        c_lay = QVBoxLayout(center)
        c_lay.setContentsMargins(0, 0, 0, 0)
        c_lay.setSpacing(0)
        self.topbar = TopBar(self.api.label)
        self.topbar.export_requested.connect(self.export_current)
        self.topbar.live_btn.toggled.connect(self.set_live_visible)
        self.topbar.settings_requested.connect(self.open_settings)
        self.topbar.model_picked.connect(self.pick_model)
        c_lay.addWidget(self.topbar)
        self.engine_status = EngineStatus(self.topbar, self)
        self.engine_status.changed.connect(self.update_composer)

        self.stack = QStackedWidget()
        self.welcome = WelcomePage()
        self.welcome.model_chosen.connect(self.use_model)
        self.welcome.quantize_requested.connect(self.quantize_model)
        self.welcome.quantize_cancel_requested.connect(self.cancel_quantize)
        self.stack.addWidget(self.welcome)
        self.chat_page = ChatPage(self.renderer, self.theme, self.settings.vote_chains)
        self.banner, self.chat, self.composer = self.chat_page.banner, self.chat_page.chat, self.chat_page.composer
        self.chat.message_action.connect(self._on_message_action)
        # Enter only ever sends (typing the next message during a reply must not stop it); the button toggles.
        self.composer.send_requested.connect(self.send)
        self.composer.send_btn.clicked.connect(self.send_or_stop)
        self.composer.stop_thinking_btn.clicked.connect(self.stop_thinking)
        self.composer.vote_btn.clicked.connect(lambda: self.send(chains=self.settings.vote_chains))
        self.stack.addWidget(self.chat_page)
        c_lay.addWidget(self.stack, 1)
        splitter.addWidget(center)
        self.conversations = ConversationActions(self.store, self, self.banner.show_message)

        self.live = LivePanel(self.theme)
        self.live.hide()
        self.server_watch = ServerWatch(self)  # a remote model's server load, for the live panel
        self.server_watch.figures.connect(self.live.show_server)
        splitter.addWidget(self.live)
        splitter.setStretchFactor(0, 0)
        splitter.setStretchFactor(1, 1)
        splitter.setStretchFactor(2, 0)
        splitter.setSizes([250, 800, 300])
        self.setCentralWidget(splitter)
        splitter.installEventFilter(self)  # its columns' minimum widths change: _fit_minimum_size
        self.statusBar().setSizeGripEnabled(True)
        self.statusBar().hide()

    def _shortcuts(self) -> None:
        def sc(keys, fn):
            s = QShortcut(QKeySequence(keys), self)
            s.setContext(Qt.WindowShortcut)
            s.activated.connect(fn)
            return s

        sc("Ctrl+N", self.new_chat)
        sc("Ctrl+K", self.focus_search)
        sc("Ctrl+F", self.focus_search)
        sc("Ctrl+,", self.open_settings)
        sc("Ctrl+I", lambda: self.topbar.live_btn.toggle())
        sc("F2", lambda: self.rename_conversation(self.conv_id) if self.conv_id is not None else None)
        sc("Escape", self.escape)

    def _make_renderer(self) -> MarkdownRenderer:
        px = self.settings.font_size * 96 / 72  # point size -> logical pixels for math images
        dpr = QGuiApplication.primaryScreen().devicePixelRatio() if QGuiApplication.primaryScreen() else 1.0
        mono = "'JetBrains Mono', 'Cascadia Code', Consolas, 'DejaVu Sans Mono', monospace"
        return MarkdownRenderer(self.theme, px, dpr, mono, math_wait=False)  # formulas drawn on the math thread

    # ------------------------------------------------------------------ state restore / theme
    def _restore(self) -> None:
        geo = self.qs.value("window/geometry")
        if isinstance(geo, (QByteArray, bytes)):
            self.restoreGeometry(QByteArray(geo))
        else:
            self.resize(1280, 820)
        self.topbar.live_btn.setChecked(self.qs.value("window/live_panel", "false") in (True, "true"))
        self.refresh_list()
        self._refresh_models()
        last = self.qs.value("window/last_conversation")
        try:
            last = int(last) if last is not None else None
        except (TypeError, ValueError):
            last = None
        if last is not None and self.store.conversation(last):
            self.open_conversation(last)
        else:
            self.new_chat()
        has_model = self.settings.model_path or self.settings.remote() is not None
        self.stack.setCurrentWidget(self.chat_page if has_model else self.welcome)

    def apply_theme(self) -> None:
        self.theme = themes.resolve(self.settings.theme)
        themes.apply(QApplication.instance(), self.theme, self.settings.font_size)
        self.renderer = self._make_renderer()
        self.chat.set_renderer(self.renderer, self.theme)
        self.live.set_theme(self.theme)
        if self.conv_id is not None and self.stream is None:
            self.open_conversation(self.conv_id, keep_scroll=True)
        elif self.stream is not None:
            self._restyle_after_reply = True  # the chat is drawn again in the new look when the reply ends

    def _on_color_scheme(self, _scheme) -> None:
        if self.settings.theme == "system" and not self._closing:
            self.apply_theme()

    # ------------------------------------------------------------------ engine
    # The reply in flight and replies not yet saved (desktop.replies); tests and the self-test read these.
    @property
    def stream(self):
        return self.replies.stream

    @property
    def reply_msg_id(self):
        return self.replies.msg_id

    @property
    def unsaved(self) -> dict:
        return self.replies.unsaved

    @property
    def key_dir(self) -> Path:
        """Where the servers' keys go where the system has no keyring: beside the settings file."""
        return Path(self.qs.fileName()).parent / "r1desk-keys"

    @property
    def engine_state(self) -> str:
        """none | loading | warming | ready | failed: the service's (none before the first load or 4-bit copy)."""
        return self.service.state if self.service is not None else "none"

    @property
    def host(self):
        """The engine worker's host (tests reach the worker's signals through it)."""
        return self.service.host if self.service is not None else None

    def start_engine(self) -> None:
        """Create the engine service (cheap) and load the configured model; torch is imported on its thread."""
        self._ensure_service()
        server = self.settings.remote()
        if server is not None:
            self.stack.setCurrentWidget(self.chat_page)
            remote = dict(
                url=server.url,
                model=self.settings.remote_model,
                insecure_tls=server.insecure_tls,
                key_dir=str(self.key_dir),
                api_key=self.remote_key,  # `--api-key-file`'s, for this run; else the keyring's (the worker reads it)
            )
            self.service.load(LoadRequest(f"{self.settings.remote_model} on {server.url}", "remote", remote=remote))
            self.engine_status.starting()
            return
        if not self.settings.model_path:
            self.stack.setCurrentWidget(self.welcome)
            self.welcome.scan()
            return
        self.stack.setCurrentWidget(self.chat_page)
        self.service.max_parallel = self.settings.max_parallel
        s = self.settings
        self.service.load(LoadRequest(s.model_path, s.device, s.context_length, s.dtype(), s.kv_cache))
        self.engine_status.starting()

    def _ensure_service(self) -> None:
        if self.service is None:
            svc = self.service = EngineService(self, engine_factory=self.engine_factory)
            self.engine_status.attach(svc)
            svc.ready.connect(self._on_ready)
            svc.load_failed.connect(self._on_load_failed)
            svc.quantize_progress.connect(self.welcome.on_quantize_progress)
            svc.quantized.connect(self._on_quantized)
            svc.quantize_failed.connect(self._on_quantize_failed)
            self.live.attach(svc)
            self.api.attach(svc)

    # ------------------------------------------------------------------ 4-bit copy (first run)
    def quantize_model(self, src: str) -> None:
        """Make a 4-bit AWQ copy of `src` in r1desk's models folder on the engine thread, then load it."""
        from model_loader.locate import user_models_dir  # plain paths: no torch

        self._ensure_service()
        out = user_models_dir() / f"{Path(src).name}-AWQ"  # the -AWQ name is how find_variants pairs them
        self.welcome.quantize_started()
        self.service.quantize(src, str(out), device=self.settings.device, **self.quantize_options)

    def cancel_quantize(self) -> None:
        if self.service is not None:
            self.service.abort_quantize()

    def _on_quantized(self, path: str) -> None:
        self.welcome.quantize_finished("4-bit copy made.")
        self.settings.precision = "awq"
        self.use_model(path)

    def _on_quantize_failed(self, kind: str, message: str) -> None:
        if kind == "cancelled":
            text = "Cancelled: no 4-bit copy was made. The downloaded model is listed above, ready to use."
        else:
            text = f"Could not make the 4-bit copy: {message}. The downloaded model is listed above, ready to use."
        self.welcome.quantize_finished(text)
        self.welcome.scan()

    def use_model(self, path: str) -> None:
        self.settings.model_path = path
        self.settings.remote_server = ""
        self.settings.save(self.qs)
        self._refresh_models()
        self.welcome.show_error("")
        self.banner.hide()
        self.start_engine()

    def _on_ready(self, info: dict) -> None:
        self.engine_info = info
        quantized = bool(info.get("quantization"))
        if info.get("device") != "remote" and quantized != (
            self.settings.precision == "awq"
        ):  # keep Precision true to the folder in use
            self.settings.precision = "awq" if quantized else "auto"
            self.settings.save(self.qs)
        self.chat.assistant_name = model_title(info.get("model_name", "Assistant"))
        picker_names_it = not self.topbar.model_picker.isHidden()
        self.engine_status.ready(None if picker_names_it else self.chat.assistant_name, info)
        self.live.set_engine(info)
        server = self.settings.remote() if info.get("device") == "remote" else None
        if server is not None:
            self.server_watch.watch(
                server.url, self.settings.remote_model, self.key_dir, server.insecure_tls, self.remote_key
            )
        else:
            self.server_watch.stop()
        if self.banner.kind in ("load", "no_gpu", "gpu_missing", "oom_load"):
            self.banner.hide()
        if info.get("device") == "cpu" and self.settings.device == "cpu":
            self.banner.show_message("cpu", "Running on the CPU: replies will be much slower than on an NVIDIA GPU.")
        if self.conv_id is not None:
            self._offer_chat_model(self.store.messages(self.conv_id))  # the chat's own model loaded: its notice goes
        self.engine_ready.emit(info)

    # ------------------------------------------------------------------ conversations
    def refresh_list(self) -> None:
        self.topbar.menu_btn.setEnabled(self.conv_id is not None)  # nothing to export in an empty new chat
        self.sidebar.show_conversations(self.store.conversations(self.sidebar.query()), self.conv_id)

    def _on_list_opened(self, conv_id: int) -> None:
        if conv_id != self.conv_id:
            self.open_conversation(conv_id)

    def new_chat(self) -> None:
        if self.stream is not None:
            return  # one reply at a time; Esc stops it first
        self.conv_id = None
        self._set_editing(None)  # an edit belongs to its chat (the text stays in the box)
        self.chat.clear()
        self.topbar.set_title("New chat")
        self.sidebar.clear_selection()
        if self.banner.kind == "context_full":  # a new chat is the answer to a full context
            self.banner.hide()
        self.composer.edit.setFocus()

    def open_conversation(self, conv_id: int, keep_scroll: bool = False) -> None:
        if self.stream is not None and conv_id != self.conv_id:
            self.refresh_list()  # keep the selection on the conversation that is replying
            return
        conv = self.store.conversation(conv_id)
        if conv is None:
            return
        pos = self.chat.verticalScrollBar().value()
        if conv_id != self.conv_id:
            self._set_editing(None)  # an edit belongs to its chat (the text stays in the box)
        self.conv_id = conv_id
        self.topbar.set_title(conv["title"])
        self.chat.clear()
        messages = self.store.messages(conv_id)
        for m in messages:
            if m["role"] != "system":
                self.chat.add_message({**m, **self.replies.unsaved.get(m["id"], {})})
        if keep_scroll:
            QTimer.singleShot(0, lambda: self.chat.verticalScrollBar().setValue(pos))
        else:
            self.chat.scroll_to_bottom()
        self._offer_chat_model(messages)
        self.qs.setValue("window/last_conversation", conv_id)
        if self.sidebar.current_id() != conv_id:
            self.refresh_list()

    # ------------------------------------------------------------------ which model answers
    def _refresh_models(self) -> None:
        self.topbar.set_models(self.settings.model_choices(), self.settings.model_key())

    def pick_model(self, key: str) -> None:
        """Use the model of a model_choices key (the top bar's picker, or a chat's own): a reload, now or once
        the reply in flight has ended."""
        if key == self.settings.model_key():
            return
        new = dataclasses.replace(self.settings)
        new.use_model_key(key)
        self.apply_settings(new)

    def chat_model(self, messages: list[dict]) -> str | None:
        """The model_choices key of the model that last answered in a chat's messages, where the settings still
        know it (its stats name the model, and the server for a server's)."""
        for msg in reversed(messages):
            stats = msg.get("stats") or {}
            if msg["role"] == "assistant" and stats.get("model"):
                if stats.get("server"):
                    key = f"{stats['server']}\n{stats['model']}"
                else:
                    key = "" if Path(self.settings.model_path).name == stats["model"] else None
                return key if key in {k for _, k in self.settings.model_choices()} else None
        return None

    def _offer_chat_model(self, messages: list[dict]) -> None:
        """A chat answered by another model than the one in use: say so, and offer to switch (a load takes
        seconds, so it is never done unasked)."""
        key, current = self.chat_model(messages), self.settings.model_key()
        if key is None or key == current:
            if self.banner.kind == "chat_model":
                self.banner.hide()
            return
        labels = {k: label for label, k in self.settings.model_choices()}
        self.banner.show_message(
            "chat_model",
            f"This chat was answered by {labels[key]}; the model now is {labels.get(current, 'another')}.",
            [(f"Use {labels[key].split(' · ')[0]}", lambda: self.pick_model(key))],
        )

    def rename_conversation(self, conv_id: int) -> None:
        title = self.conversations.rename(conv_id)
        if title is None:
            return
        if conv_id == self.conv_id:
            self.topbar.set_title(title)
        self.refresh_list()

    def delete_conversation(self, conv_id: int, confirm: bool = True) -> None:
        if self.stream is not None and conv_id == self.conv_id:
            return
        if not self.conversations.delete(conv_id, confirm):
            return
        if conv_id == self.conv_id:
            self.new_chat()
        self.refresh_list()

    def export_current(self, fmt: str) -> None:
        if self.conv_id is not None:
            self.export_conversation(self.conv_id, fmt)

    def export_conversation(self, conv_id: int, fmt: str, path: str | None = None) -> str | None:
        return self.conversations.export(conv_id, fmt, path)

    def focus_search(self) -> None:
        self.sidebar.focus_search()

    # ------------------------------------------------------------------ sending
    def send_or_stop(self) -> None:
        if self.stream is not None:
            self.stop()
        else:
            self.send()

    def send(self, text: str | None = None, chains: int = 1) -> bool:
        """Send the composer's text (or `text`); chains > 1: Ask ×N, the reply is the majority of that many."""
        text = (self.composer.text() if text is None else text).strip()
        if not text or self.stream is not None:
            return False
        if not self._can_reply(" Your message is kept in the box."):
            return False
        if self.editing_msg_id is not None and self.store.message(self.editing_msg_id) is None:
            self._set_editing(None)  # deleted since (a regenerate before it): this is a new message
        if self.editing_msg_id is not None and self.conv_id is not None and self.editing_conv_id == self.conv_id:
            edited = self.editing_msg_id  # edit & resend replaces it and everything after it
            if not self.conversations.write(
                "replace the edited message", lambda: self.store.delete_from(self.conv_id, edited)
            ):
                return False
            self.chat.remove_from(edited)
            self._set_editing(None)
        try:
            if self.conv_id is None:
                title = " ".join(text.split())[:48] + ("…" if len(text) > 48 else "")
                self.conv_id = self.store.create_conversation(title)
                self.topbar.set_title(title)
                self.qs.setValue("window/last_conversation", self.conv_id)
            msg_id = self.store.add_message(self.conv_id, "user", text)
        except sqlite3.Error as err:  # a full disk, a read-only folder: nothing is lost, nothing is sent
            self.banner.show_message(
                "save_failed",
                f"Could not save your message, so it was not sent: "
                f"{store_problem(err)} It is still in the box; send it again "
                "once that is fixed.",
            )
            return False
        self.chat.add_message(self.store.message(msg_id))
        self.composer.edit.clear()
        self.refresh_list()
        self._start_reply(chains)
        return True

    def _history(self) -> list[dict]:
        msgs = []
        if self.settings.system_prompt.strip():
            msgs.append({"role": "system", "content": self.settings.system_prompt.strip()})
        for m in self.store.messages(self.conv_id):
            if m["role"] == "user":
                msgs.append({"role": "user", "content": m["content"]})
            elif m["role"] == "assistant":  # only the answer goes back into the prompt, as DeepSeek advises
                msgs.append(history_message(m["content"], m["reasoning"], m["answer"]))
        return msgs

    def sampling(self) -> dict:
        s = self.settings.sampling()
        if self.max_new_override:
            s["max_new_tokens"] = self.max_new_override
        elif not s["max_new_tokens"]:  # auto: the whole context (SamplingSettings' None)
            s["max_new_tokens"] = None
        if self.seed_override is not None:
            s["seed"] = self.seed_override
        return s

    def _start_reply(self, chains: int = 1) -> None:
        if self.replies.start(self.conv_id, self._history(), self.sampling(), chains):
            self.update_composer()

    def stop(self) -> None:
        self.replies.stop()

    def stop_thinking(self) -> None:
        if self.replies.stop_thinking():
            self.composer.stop_thinking_btn.setEnabled(False)

    def escape(self) -> None:
        if self.sidebar.clear_search_if_focused():
            return
        if self.stream is not None:
            self.stop()
        elif self.editing_msg_id is not None:
            self._set_editing(None)
            self.composer.edit.clear()

    def bring_to_front(self) -> None:
        """Another start of r1desk asked for this window (desktop.single_instance)."""
        if self.isMinimized():
            self.showNormal()
        self.show()
        self.raise_()
        self.activateWindow()

    def _close_losing_unsaved(self) -> bool:
        """Replies that the store refused (a full disk) exist only in this window: closing loses them. Ask."""
        n = len(self.replies.unsaved)
        answer = QMessageBox.warning(
            self,
            "Close r1desk",
            f"{n} {'reply has' if n == 1 else 'replies have'} not been saved (the disk refused them) and "
            f"{'is' if n == 1 else 'are'} only in this window. Closing now loses {'it' if n == 1 else 'them'}.\n\n"
            "Keep the window open to copy them or free some space (r1desk keeps trying to save), or close anyway?",
            QMessageBox.Close | QMessageBox.Cancel,
            QMessageBox.Cancel,
        )
        return answer == QMessageBox.Close

    def show_start_notices(self, crash=None, moved_aside: Path | None = None, unavailable=None) -> None:
        """What the start found, in the banner (desktop.start_notices)."""
        notice = start_notice(crash, moved_aside, unavailable)
        if notice is not None:
            self.banner.show_message(*notice)

    def context_full_banner(self, text: str) -> None:
        self.banner.show_message("context_full", text + " Start a new chat to continue.", [("New chat", self.new_chat)])

    def _on_reply_ended(self) -> None:
        self.composer.stop_thinking_btn.setEnabled(True)
        self.update_composer()
        self.refresh_list()
        if self._restyle_after_reply and self.conv_id is not None and not self._closing:
            self._restyle_after_reply = False
            self.open_conversation(self.conv_id, keep_scroll=True)
        if self._reload_pending and not self._closing:
            self._reload_pending = False
            self.start_engine()

    def _on_load_failed(self, kind: str, message: str) -> None:
        self.server_watch.stop()
        self.live.clear_engine()  # the worker dropped the last model before this load
        self.engine_status.not_loaded()
        if kind == "no_gpu":
            text = f"{message} r1desk can run on the CPU instead, but replies will be many times slower."
            self.banner.show_message(
                "no_gpu", text, [("Use CPU (slow)", self.use_cpu), ("Settings…", self.open_settings)]
            )
        elif kind == "gpu_missing":
            self.banner.show_message(
                "gpu_missing",
                message,
                [("Use the first GPU that works", self.use_any_gpu), ("Settings…", self.open_settings)],
            )
        elif kind == "oom":
            self.banner.show_message("oom_load", f"{message}.", [("Settings…", self.open_settings)])
        elif kind == "remote":
            self.banner.show_message(
                "load",
                f"Could not use the server's model: {message}.",
                [("Try again", self.start_engine), ("Settings…", self.open_settings)],
            )
        else:
            self.banner.show_message(
                "load",
                f"Could not load the model: {message}",
                [("Choose another model…", self.show_welcome), ("Settings…", self.open_settings)],
            )
            self.welcome.show_error(f"Could not load the model: {message}")
        self.engine_failed.emit(kind, message)

    def use_any_gpu(self) -> None:
        self.settings.device = "cuda"
        self.settings.save(self.qs)
        self.banner.hide()
        self.start_engine()

    def use_cpu(self) -> None:
        self.settings.device = "cpu"
        self.settings.save(self.qs)
        self.banner.hide()
        self.start_engine()

    def show_welcome(self) -> None:
        self.stack.setCurrentWidget(self.welcome)
        self.welcome.scan()

    def update_composer(self) -> None:
        """Buttons as the engine and the reply in flight allow (a reply's stages call it too: desktop.replies)."""
        generating = self.stream is not None
        thinking = generating and bool(self.stream.reasoning) and not self.stream.answer
        self.chat_page.show_state(generating, thinking, ready=self.engine_state == "ready")
        self.sidebar.new_btn.setEnabled(not generating)
        info = self.engine_info or {}
        button = self.composer.stop_thinking_btn
        if info.get("device") == "remote" and not info.get("continues"):  # say why, rather than a dead button
            button.setEnabled(False)
            button.setToolTip(
                "This server can't continue a reply with its reasoning closed (r1desk's server can): "
                "stop the reply instead"
            )
        elif not button.isEnabled() and self.stream is None:
            button.setEnabled(True)  # a local model again (a reply's own stop-thinking disables it till it ends)
            button.setToolTip("Close the reasoning and make the model answer now")

    # ------------------------------------------------------------------ per-message actions
    def _on_message_action(self, action: str, msg_id: int) -> None:
        msg = self.store.message(msg_id)
        if msg is None:
            return
        if action == "copy":
            w = self.chat.widget_for(msg_id)
            QGuiApplication.clipboard().setText(w.text_for_copy() if w else msg["content"])
            return
        if self.stream is not None:
            return  # editing history mid-reply would change the reply's prompt under it
        if action == "delete":
            if not self.conversations.write("delete the message", lambda: self.store.delete_message(msg_id)):
                return
            self.chat.remove(msg_id)
            if msg_id == self.editing_msg_id:
                self._set_editing(None)
        elif action == "edit":
            self._set_editing(msg_id)
            self.composer.set_text(msg["content"])
            self.composer.edit.setFocus()
        elif action == "regenerate":
            if not self._can_reply():
                return
            # the old reply goes only once the new one can start: a full queue (API requests) would lose it
            refusal = self.service.refusal() if self.service is not None else None
            if refusal is not None:
                self.banner.show_message("generate", f"The reply could not start: {refusal}; the old reply is kept.")
                return
            if not self.conversations.write(
                "regenerate the reply", lambda: self.store.delete_from(self.conv_id, msg_id)
            ):
                return
            self.chat.remove_from(msg_id)
            if self.editing_msg_id is not None and self.editing_msg_id >= msg_id:
                self._set_editing(None)  # the message being edited went with the rest
            self._start_reply()

    def _can_reply(self, kept: str = "") -> bool:
        """Whether a reply can start now; if not, say why, but leave a failed load's banner (with its ways out:
        another model, Settings, the CPU) where it is."""
        if self.engine_state == "ready":
            return True
        if self.engine_state == "failed" and self.banner.isVisible() and self.banner.kind != "not_ready":
            return False
        self.banner.show_message("not_ready", "The model is not ready yet." + kept)
        return False

    def _set_editing(self, msg_id: int | None) -> None:
        self.editing_msg_id = msg_id
        self.editing_conv_id = self.conv_id if msg_id is not None else None
        self.chat_page.show_editing(msg_id is not None)

    # ------------------------------------------------------------------ settings / panel
    def open_settings(self) -> None:
        info = self.engine_info or {}
        keys = KeyStore(self.key_dir)
        dlg = SettingsDialog(
            self.settings,
            self,
            variants=info.get("variants"),
            quantized=bool(info.get("quantization")),
            auto_context=info.get("context_length") if info.get("context_auto") else None,
            gpus=info.get("gpus"),
            keys_where=keys.where(),
        )
        if dlg.exec() != SettingsDialog.Accepted:
            return
        try:  # servers' keys: never in the settings file
            for url in dlg.removed_servers:
                keys.delete(url)
            for url, key in dlg.new_keys.items():
                keys.set(url, key)
        except Exception as err:  # a keyring that refuses (locked, no permission): said, and the rest applies
            self.banner.show_message("settings", f"Could not store the server's API key: {err}.")
        self.apply_settings(dlg.result_settings())

    def apply_settings(self, new: AppSettings) -> None:
        old = self.settings
        self.settings = new
        new.save(self.qs)
        self._refresh_models()
        self.composer.set_vote_chains(new.vote_chains)
        if (new.theme, new.font_size) != (old.theme, old.font_size):
            self.apply_theme()
        self.api.apply(new)
        if any(getattr(new, k) != getattr(old, k) for k in AppSettings.MODEL_KEYS):
            if self.stream is None:
                self.start_engine()
            else:
                self._reload_pending = True  # reload when the reply in flight has finished

    def eventFilter(self, obj, event) -> bool:
        if obj is self.splitter and event.type() == QEvent.LayoutRequest:
            QTimer.singleShot(0, self._fit_minimum_size)  # once the splitter has taken the new size hints
        return super().eventFilter(obj, event)

    def _fit_minimum_size(self) -> None:
        # An explicit minimum size keeps Qt from growing the window to what its layout needs, so a narrow window
        # with the live panel open overflowed: the panel's right side and the top bar's buttons were cut off.
        # The minimum is what the visible columns need, and never below the window's own minimum.
        need = self.splitter.minimumSizeHint().width()
        screen = self.screen()
        if screen is not None:  # never wider than the screen (there the columns still overlap, as before)
            need = min(need, screen.availableGeometry().width())
        self.setMinimumSize(max(MIN_WIDTH, need), MIN_HEIGHT)

    def set_live_visible(self, on: bool) -> None:
        self.live.setVisible(on)
        self.server_watch.set_active(on)
        self._fit_minimum_size()
        self.topbar.set_live_shown(on)
        self.qs.setValue("window/live_panel", "true" if on else "false")
        if on:
            self.live.refresh()

    # ------------------------------------------------------------------ closing
    def closeEvent(self, event) -> None:
        """Stop the reply, save it, join the engine thread; all within about two seconds."""
        if self._closing:
            event.accept()
            return
        self.replies.retry_unsaved()
        if self.replies.unsaved and not self._close_losing_unsaved():
            event.ignore()  # the user keeps the window, and the replies in it, to copy them or free space
            return
        self._closing = True
        try:
            QGuiApplication.styleHints().colorSchemeChanged.disconnect(self._on_color_scheme)
        except (RuntimeError, TypeError):
            pass
        self.qs.setValue("window/geometry", self.saveGeometry())
        if self.conv_id is not None:
            self.qs.setValue("window/last_conversation", self.conv_id)
        self.qs.sync()
        self.api.shutdown()
        self.server_watch.stop()
        if self.welcome.download.running:  # the child would download on after the app is gone
            self.welcome.download.cancel()
        self.replies.save_partial()
        joined = True
        if self.service is not None:
            joined = self.service.shutdown(1500)  # cancels the reply in flight and every API request
            # The worker finished (cancelled) before its thread stopped: deliver its queued
            # deltas and Finished now, so the final text and stats are saved.
            self.service.deliver_pending()
        self.replies.save_on_close()
        self.live.timer.stop()
        event.accept()
        if not joined and self.hard_exit_on_stuck_thread:
            # A load that can't be interrupted (a slow disk read, a warm-up) must not keep the process alive:
            # everything is saved, so leave now rather than hang.
            self.store.close()
            if self.crash_log is not None:
                self.crash_log.stop()  # this is a deliberate exit, not a crash
            os._exit(0)
