"""The main window: layout, conversation list, composer, engine state, settings and closing.

The engine belongs to an EngineService (desktop.service): the window asks it for replies like any other client
(the local API server is the other one) and never touches the worker. Its parts each have one job elsewhere:
a reply's life and its saving (desktop.replies), the live panel, which listens to the service so it counts every
request (desktop.livepanel), and the API server's switch and address (desktop.apicontrol).

See desktop.replies for a reply's lifecycle.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from PySide6.QtCore import QByteArray, QEvent, QSettings, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (QApplication, QFileDialog, QFrame, QHBoxLayout, QInputDialog, QLabel, QLineEdit,
                               QListWidget, QListWidgetItem, QMainWindow, QMenu, QMessageBox,
                               QProgressBar, QPushButton, QSplitter, QStackedWidget, QToolButton, QVBoxLayout,
                               QWidget)

from desktop import theme as themes
from desktop.elidedlabel import ElidedLabel
from desktop.apicontrol import ApiControl
from desktop.chatview import ChatView
from desktop.composer import Banner, Composer
from desktop.livepanel import LivePanel
from desktop.markdown import MarkdownRenderer
from desktop.settings import AppSettings, SettingsDialog
from desktop.store import Store, store_problem
from desktop.welcome import WelcomePage
from model_loader.chat import history_message  # plain text rules: no torch
from desktop.replies import ReplyController
from desktop.service import EngineService


MIN_WIDTH, MIN_HEIGHT = 760, 520  # the smallest window; wider while the live panel is open (_fit_minimum_size)


def device_title(info: dict) -> str:
    """The device a model runs on, for the status line: the GPU's name, and its number where the machine has
    several (two of the same card would read alike)."""
    device = info.get("device") or ""
    if device == "cpu":
        return "CPU"
    name = info.get("device_name", "GPU")
    return f"{name} (GPU {device.removeprefix('cuda:')})" if len(info.get("gpus") or []) > 1 else name


class MainWindow(QMainWindow):
    # for the self-test and tests: what happened, in GUI terms
    engine_ready = Signal(object)
    engine_failed = Signal(str, str)
    reply_finished = Signal(object)  # the saved assistant message
    reply_failed = Signal(str, str)

    def __init__(self, qsettings: QSettings, store: Store, model: str | None = None, device: str | None = None,
                 max_new_tokens: int | None = None, seed: int | None = None):
        super().__init__()
        self.qs = qsettings
        self.settings = AppSettings.load(qsettings)
        if model:
            self.settings.model_path = model
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
        self.engine_state = "none"  # none | loading | warming | ready | failed
        self._warmup_text = ""
        self._load_note = ""  # said after the load's progress (a first start compiling beside it)
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
        self.api.failed.connect(lambda why: self.banner.show_message("api", f"The local API server is off: {why}.",
                                                                     [("Settings…", self.open_settings)]))
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
        splitter = QSplitter(Qt.Horizontal)
        splitter.setHandleWidth(1)
        splitter.setChildrenCollapsible(False)
        self.splitter = splitter

        side = QWidget()
        side.setObjectName("Sidebar")
        side.setMinimumWidth(200)
        side.setMaximumWidth(360)
        s_lay = QVBoxLayout(side)
        s_lay.setContentsMargins(10, 12, 10, 10)
        s_lay.setSpacing(8)
        brand = QLabel("r1desk")
        themes.make_heading(brand, 1.25)
        s_lay.addWidget(brand)
        self.new_btn = QPushButton("＋  New chat")
        self.new_btn.setAccessibleName("New chat")
        self.new_btn.setToolTip("New chat (Ctrl+N)")
        self.new_btn.clicked.connect(self.new_chat)
        s_lay.addWidget(self.new_btn)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats  (Ctrl+K)")
        self.search.setAccessibleName("Search conversations")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(lambda _t: self.refresh_list())
        s_lay.addWidget(self.search)
        self.conv_list = QListWidget()
        self.conv_list.setAccessibleName("Conversations")
        self.conv_list.setToolTip("Double-click or F2 to rename; right-click for export and delete")
        self.conv_list.setContextMenuPolicy(Qt.CustomContextMenu)
        self.conv_list.customContextMenuRequested.connect(self._list_menu)
        self.conv_list.itemSelectionChanged.connect(self._on_list_selection)
        self.conv_list.itemDoubleClicked.connect(lambda item: self.rename_conversation(item.data(Qt.UserRole)))
        self.conv_list.setTextElideMode(Qt.ElideRight)
        self.conv_list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.conv_list.setWordWrap(False)
        self.conv_list.setUniformItemSizes(True)
        s_lay.addWidget(self.conv_list, 1)
        splitter.addWidget(side)

        center = QWidget()
        c_lay = QVBoxLayout(center)
        c_lay.setContentsMargins(0, 0, 0, 0)
        c_lay.setSpacing(0)
        top = QFrame()
        top.setObjectName("TopBar")
        t_lay = QHBoxLayout(top)
        t_lay.setContentsMargins(16, 8, 10, 8)
        # Both labels end in "…" when the bar is short of room (a long chat title, a long load or warm-up line)
        # rather than push the buttons over each other; the status takes the room left, its text on the right.
        self.title_label = ElidedLabel("New chat", widest=360)
        self.title_label.setObjectName("ChatTitle")
        t_lay.addWidget(self.title_label)
        self.status_label = ElidedLabel("No model")
        self.status_label.setObjectName("Meta")
        self.status_label.setAccessibleName("Model status")
        self.status_label.setAlignment(Qt.AlignRight | Qt.AlignVCenter)
        t_lay.addWidget(self.status_label, 1)
        t_lay.addWidget(self.api.label)
        self.progress = QProgressBar()
        self.progress.setAccessibleName("Loading progress")
        self.progress.setMinimumWidth(48)  # narrows in a narrow window rather than cover the buttons
        self.progress.setMaximumWidth(160)
        self.progress.setTextVisible(False)
        self.progress.hide()
        t_lay.addWidget(self.progress)
        self.menu_btn = QToolButton()
        self.menu_btn.setText("Export ▾")
        self.menu_btn.setAccessibleName("Export conversation")
        self.menu_btn.setPopupMode(QToolButton.InstantPopup)
        export_menu = QMenu(self.menu_btn)
        export_menu.addAction("Export as Markdown…", lambda: self.export_current("md"))
        export_menu.addAction("Export as JSON…", lambda: self.export_current("json"))
        self.menu_btn.setMenu(export_menu)
        t_lay.addWidget(self.menu_btn)
        self.live_btn = QToolButton()
        self.live_btn.setText("Live panel")
        self.live_btn.setCheckable(True)
        self.live_btn.setAccessibleName("Show live panel")
        self.live_btn.setToolTip("Timings, speed, context and GPU memory (Ctrl+I)")
        self.live_btn.toggled.connect(self.set_live_visible)
        t_lay.addWidget(self.live_btn)
        self.settings_btn = QToolButton()
        self.settings_btn.setText("Settings")
        self.settings_btn.setAccessibleName("Settings")
        self.settings_btn.setToolTip("Settings (Ctrl+,)")
        self.settings_btn.clicked.connect(self.open_settings)
        t_lay.addWidget(self.settings_btn)
        c_lay.addWidget(top)

        self.stack = QStackedWidget()
        self.welcome = WelcomePage()
        self.welcome.model_chosen.connect(self.use_model)
        self.welcome.quantize_requested.connect(self.quantize_model)
        self.welcome.quantize_cancel_requested.connect(self.cancel_quantize)
        self.stack.addWidget(self.welcome)
        chat_page = QWidget()
        chat_page.setObjectName("ChatPage")
        chat_page.setAttribute(Qt.WA_StyledBackground, True)
        p_lay = QVBoxLayout(chat_page)
        p_lay.setContentsMargins(0, 0, 0, 0)
        p_lay.setSpacing(0)
        self.banner = Banner()
        banner_wrap = QVBoxLayout()
        banner_wrap.setContentsMargins(16, 10, 16, 0)
        banner_wrap.addWidget(self.banner)
        p_lay.addLayout(banner_wrap)
        self.chat = ChatView(self.renderer, self.theme)
        self.chat.message_action.connect(self._on_message_action)
        p_lay.addWidget(self.chat, 1)
        self.composer = Composer()
        # Enter only ever sends (typing the next message during a reply must not stop it); the button toggles.
        self.composer.send_requested.connect(self.send)
        self.composer.send_btn.clicked.connect(self.send_or_stop)
        self.composer.stop_thinking_btn.clicked.connect(self.stop_thinking)
        self.composer.vote_btn.clicked.connect(lambda: self.send(chains=self.settings.vote_chains))
        self.composer.set_vote_chains(self.settings.vote_chains)
        comp_row = QHBoxLayout()
        comp_row.setContentsMargins(24, 8, 24, 16)
        comp_row.addStretch(1)
        comp_row.addWidget(self.composer, 100)
        self.composer.setMaximumWidth(900)
        comp_row.addStretch(1)
        p_lay.addLayout(comp_row)
        self.stack.addWidget(chat_page)
        self.chat_page = chat_page
        c_lay.addWidget(self.stack, 1)
        splitter.addWidget(center)

        self.live = LivePanel(self.theme)
        self.live.hide()
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
        sc("Ctrl+I", lambda: self.live_btn.toggle())
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
        self.live_btn.setChecked(self.qs.value("window/live_panel", "false") in (True, "true"))
        self.refresh_list()
        last = self.qs.value("window/last_conversation")
        try:
            last = int(last) if last is not None else None
        except (TypeError, ValueError):
            last = None
        if last is not None and self.store.conversation(last):
            self.open_conversation(last)
        else:
            self.new_chat()
        self.stack.setCurrentWidget(self.chat_page if self.settings.model_path else self.welcome)

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
    def host(self):
        """The engine worker's host (tests reach the worker's signals through it)."""
        return self.service.host if self.service is not None else None

    def start_engine(self) -> None:
        """Create the engine service (cheap) and load the configured model; torch is imported on its thread."""
        self._ensure_service()
        if not self.settings.model_path:
            self.stack.setCurrentWidget(self.welcome)
            self.welcome.scan()
            return
        self.stack.setCurrentWidget(self.chat_page)
        self.engine_state = "loading"
        self._set_status("Starting…", busy=True)
        self.service.max_parallel = self.settings.max_parallel
        self.service.load(self.settings.model_path, self.settings.device, self.settings.context_length,
                          self.settings.dtype(), self.settings.kv_cache)

    def _ensure_service(self) -> None:
        if self.service is None:
            svc = self.service = EngineService(self, engine_factory=self.engine_factory)
            svc.stage.connect(self._on_stage)
            svc.progress.connect(self._on_progress)
            svc.warmup_progress.connect(self._on_warmup_progress)
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
        self.settings.save(self.qs)
        self.welcome.show_error("")
        self.banner.hide()
        self.start_engine()

    STAGE_TEXT = {"importing": "Starting the engine…", "loading": "Loading model…", "warming": "Warming up…",
                  "preparing": "Preparing GPU kernels (first start only)…"}
    # a first start compiles the GPU kernels while the weights load: said beside the load's progress
    COMPILING_NOTE = " · preparing GPU kernels alongside (first start only)"

    def _on_stage(self, stage: str) -> None:
        if stage == "compiling":
            self._load_note = self.COMPILING_NOTE
            self.status_label.setText(self.STAGE_TEXT["loading"] + self._load_note)
            return
        if stage in ("importing", "loading"):
            self._load_note = ""
        self.engine_state = "warming" if stage in ("warming", "preparing") else "loading"
        self._warmup_text = self.STAGE_TEXT[stage]
        self._set_status(self.STAGE_TEXT[stage], busy=True)

    def _on_warmup_progress(self, done: int, total: int, what: str) -> None:
        # "Preparing GPU kernels (first start only)… 3/14: timing the attention kernels"
        if self.engine_state != "warming" or not total:
            return
        self.progress.setRange(0, total)
        self.progress.setValue(done)
        self.status_label.setText(f"{self._warmup_text} {min(done + 1, total)}/{total}: {what}")

    def _on_progress(self, done: int, total: int) -> None:
        self.progress.setRange(0, 1000)
        self.progress.setValue(int(1000 * done / total) if total else 0)
        self.status_label.setText(f"Loading model… {done / 2**30:.2f} / {total / 2**30:.2f} GB"
                                  + self._load_note)

    def _on_ready(self, info: dict) -> None:
        self.engine_state = "ready"
        self.engine_info = info
        quantized = bool(info.get("quantization"))
        if quantized != (self.settings.precision == "awq"):  # keep Precision true to the folder in use
            self.settings.precision = "awq" if quantized else "auto"
            self.settings.save(self.qs)
        self.chat.assistant_name = _model_title(info.get("model_name", "Assistant"))
        self._set_status(f"Ready · {self.chat.assistant_name} · {device_title(info)}", busy=False)
        self.live.set_engine(info)
        if self.banner.kind in ("load", "no_gpu", "gpu_missing", "oom_load"):
            self.banner.hide()
        if info.get("device") == "cpu" and self.settings.device == "cpu":
            self.banner.show_message("cpu", "Running on the CPU: replies will be much slower than on an NVIDIA GPU.")
        self._update_composer()
        self.engine_ready.emit(info)

    def _set_status(self, text: str, busy: bool) -> None:
        self.status_label.setText(text)
        self.progress.setVisible(busy)
        if busy:
            self.progress.setRange(0, 0)
        self._update_composer()

    # ------------------------------------------------------------------ conversations
    def refresh_list(self) -> None:
        self.menu_btn.setEnabled(self.conv_id is not None)  # nothing to export in an empty new chat
        query = self.search.text()
        self.conv_list.blockSignals(True)
        self.conv_list.clear()
        for c in self.store.conversations(query):
            item = QListWidgetItem(c["title"])
            item.setData(Qt.UserRole, c["id"])
            item.setToolTip(c["title"])
            self.conv_list.addItem(item)
            if c["id"] == self.conv_id:
                item.setSelected(True)
                self.conv_list.setCurrentItem(item)
        self.conv_list.blockSignals(False)

    def _on_list_selection(self) -> None:
        items = self.conv_list.selectedItems()
        if items:
            cid = items[0].data(Qt.UserRole)
            if cid != self.conv_id:
                self.open_conversation(cid)

    def new_chat(self) -> None:
        if self.stream is not None:
            return  # one reply at a time; Esc stops it first
        self.conv_id = None
        self._set_editing(None)  # an edit belongs to its chat (the text stays in the box)
        self.chat.clear()
        self.title_label.setText("New chat")
        self.conv_list.clearSelection()
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
        self.title_label.setText(conv["title"])
        self.chat.clear()
        for m in self.store.messages(conv_id):
            if m["role"] != "system":
                self.chat.add_message({**m, **self.replies.unsaved.get(m["id"], {})})
        if keep_scroll:
            QTimer.singleShot(0, lambda: self.chat.verticalScrollBar().setValue(pos))
        else:
            self.chat.scroll_to_bottom()
        self.qs.setValue("window/last_conversation", conv_id)
        if self.conv_list.currentItem() is None or self.conv_list.currentItem().data(Qt.UserRole) != conv_id:
            self.refresh_list()

    def rename_conversation(self, conv_id: int) -> None:
        conv = self.store.conversation(conv_id)
        if not conv:
            return
        title, ok = QInputDialog.getText(self, "Rename chat", "Title", text=conv["title"])
        if ok and title.strip():
            if not self._write("rename the chat", lambda: self.store.rename(conv_id, title)):
                return
            if conv_id == self.conv_id:
                self.title_label.setText(title.strip())
            self.refresh_list()

    def delete_conversation(self, conv_id: int, confirm: bool = True) -> None:
        if self.stream is not None and conv_id == self.conv_id:
            return
        if confirm and QMessageBox.question(self, "Delete chat", "Delete this chat? This cannot be undone.") \
                != QMessageBox.Yes:
            return
        if not self._write("delete the chat", lambda: self.store.delete_conversation(conv_id)):
            return
        if conv_id == self.conv_id:
            self.new_chat()
        self.refresh_list()

    def _list_menu(self, pos) -> None:
        item = self.conv_list.itemAt(pos)
        if item is None:
            return
        cid = item.data(Qt.UserRole)
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self.rename_conversation(cid))
        menu.addAction("Export as Markdown…", lambda: self.export_conversation(cid, "md"))
        menu.addAction("Export as JSON…", lambda: self.export_conversation(cid, "json"))
        menu.addSeparator()
        menu.addAction("Delete…", lambda: self.delete_conversation(cid))
        menu.exec(self.conv_list.mapToGlobal(pos))

    def export_current(self, fmt: str) -> None:
        if self.conv_id is not None:
            self.export_conversation(self.conv_id, fmt)

    def export_conversation(self, conv_id: int, fmt: str, path: str | None = None) -> str | None:
        conv = self.store.conversation(conv_id)
        if conv is None:
            return None
        if path is None:
            safe = "".join(c if c.isalnum() or c in " -_" else "_" for c in conv["title"]).strip() or "chat"
            filt = "Markdown (*.md)" if fmt == "md" else "JSON (*.json)"
            path, _ = QFileDialog.getSaveFileName(self, "Export chat", f"{safe}.{fmt}", filt)
            if not path:
                return None
        text = self.store.export_markdown(conv_id) if fmt == "md" else self.store.export_json(conv_id)
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as err:  # a read-only folder, a full disk: the chat itself is untouched
            self.banner.show_message("save_failed", f"Could not export the chat to {path}: {err.strerror or err}.")
            return None
        return path

    def focus_search(self) -> None:
        self.search.setFocus()
        self.search.selectAll()

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
            if not self._write("replace the edited message", lambda: self.store.delete_from(self.conv_id, edited)):
                return False
            self.chat.remove_from(edited)
            self._set_editing(None)
        try:
            if self.conv_id is None:
                title = " ".join(text.split())[:48] + ("…" if len(text) > 48 else "")
                self.conv_id = self.store.create_conversation(title)
                self.title_label.setText(title)
                self.qs.setValue("window/last_conversation", self.conv_id)
            msg_id = self.store.add_message(self.conv_id, "user", text)
        except sqlite3.Error as err:  # a full disk, a read-only folder: nothing is lost, nothing is sent
            self.banner.show_message("save_failed", f"Could not save your message, so it was not sent: "
                                                     f"{store_problem(err)} It is still in the box; send it again "
                                                     "once that is fixed.")
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
            self._update_composer()

    def stop(self) -> None:
        self.replies.stop()

    def stop_thinking(self) -> None:
        if self.replies.stop_thinking():
            self.composer.stop_thinking_btn.setEnabled(False)

    def escape(self) -> None:
        if self.search.hasFocus() and self.search.text():  # Esc in the search box clears it, as anywhere else:
            self.search.clear()  # it must not stop the reply being written
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
            self, "Close r1desk",
            f"{n} {'reply has' if n == 1 else 'replies have'} not been saved (the disk refused them) and "
            f"{'is' if n == 1 else 'are'} only in this window. Closing now loses {'it' if n == 1 else 'them'}.\n\n"
            "Keep the window open to copy them or free some space (r1desk keeps trying to save), or close anyway?",
            QMessageBox.Close | QMessageBox.Cancel, QMessageBox.Cancel)
        return answer == QMessageBox.Close

    def show_start_notices(self, crash=None, moved_aside: Path | None = None, unavailable=None) -> None:
        """What the start found, in one banner (it holds one message): the conversations database that could
        not be opened at all (unavailable: (its path, the error); the chats of this run are then not kept),
        the one that was damaged and moved aside, and a last run that ended without closing (desktop.crashlog)."""
        parts, actions = [], []
        if unavailable is not None:
            path, err = unavailable
            problem = store_problem(err) if isinstance(err, sqlite3.Error) else f"{err}."
            parts.append(f"Your conversations at {path} could not be opened: {problem} r1desk works, but keeps "
                         "nothing from this session; the file was not changed.")
            actions.append(("Open folder", lambda: QDesktopServices.openUrl(QUrl.fromLocalFile(str(path.parent)))))
        if moved_aside is not None:
            parts.append(f"The conversations database was damaged, so r1desk started a new one. The old file is "
                         f"kept at {moved_aside}.")
            actions.append(("Open folder",
                            lambda: QDesktopServices.openUrl(QUrl.fromLocalFile(str(moved_aside.parent)))))
        if crash is not None:
            how = "crashed" if crash.fatal else "closed unexpectedly"
            # (the store writes a reply as it grows: what was written survives)
            kept = "" if parts else " Your conversations were kept, including the reply that was being written."
            parts.append(f"r1desk {how} last time ({crash.when.strftime('%Y-%m-%d %H:%M')}).{kept} The crash "
                         f"log is at {crash.log_path}.")
            actions.append(("Open log folder",
                            lambda: QDesktopServices.openUrl(QUrl.fromLocalFile(str(crash.log_path.parent)))))
        if parts:
            kind = "database" if unavailable is not None or moved_aside is not None else "crash"
            self.banner.show_message(kind, " ".join(parts), actions)

    def context_full_banner(self, text: str) -> None:
        self.banner.show_message("context_full", text + " Start a new chat to continue.",
                                 [("New chat", self.new_chat)])

    def _on_reply_ended(self) -> None:
        self.composer.stop_thinking_btn.setEnabled(True)
        self._update_composer()
        self.refresh_list()
        if self._restyle_after_reply and self.conv_id is not None and not self._closing:
            self._restyle_after_reply = False
            self.open_conversation(self.conv_id, keep_scroll=True)
        if self._reload_pending and not self._closing:
            self._reload_pending = False
            self.start_engine()

    def _on_load_failed(self, kind: str, message: str) -> None:
        self.engine_state = "failed"
        self.live.clear_engine()  # the worker dropped the last model before this load
        self._set_status("Model not loaded", busy=False)
        if kind == "no_gpu":
            text = f"{message} r1desk can run on the CPU instead, but replies will be many times slower."
            self.banner.show_message("no_gpu", text, [("Use CPU (slow)", self.use_cpu),
                                                      ("Settings…", self.open_settings)])
        elif kind == "gpu_missing":
            self.banner.show_message("gpu_missing", message, [("Use the first GPU that works", self.use_any_gpu),
                                                              ("Settings…", self.open_settings)])
        elif kind == "oom":
            self.banner.show_message("oom_load", f"{message}.", [("Settings…", self.open_settings)])
        else:
            self.banner.show_message("load", f"Could not load the model: {message}",
                                     [("Choose another model…", self.show_welcome), ("Settings…", self.open_settings)])
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

    def _update_composer(self) -> None:
        generating = self.stream is not None
        thinking = generating and bool(self.stream.reasoning) and not self.stream.answer
        self.composer.set_generating(generating, thinking)
        self.composer.send_btn.setEnabled(generating or self.engine_state == "ready")
        self.composer.vote_btn.setEnabled(self.engine_state == "ready")
        self.new_btn.setEnabled(not generating)
        self.chat.set_history_actions(not generating)  # editing history mid-reply would change its prompt

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
            if not self._write("delete the message", lambda: self.store.delete_message(msg_id)):
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
                self.banner.show_message("generate", f"The reply could not start: {refusal}; the old reply is "
                                                     "kept.")
                return
            if not self._write("regenerate the reply", lambda: self.store.delete_from(self.conv_id, msg_id)):
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

    def _write(self, what: str, write) -> bool:
        """A change to the chat store from a user's action; where the store refuses it (a read-only folder, a
        full disk, another program holding the file), a banner says what was not done and why: False."""
        try:
            write()
            return True
        except sqlite3.Error as err:
            self.banner.show_message("save_failed", f"Could not {what}: {store_problem(err)}")
            return False

    def _set_editing(self, msg_id: int | None) -> None:
        self.editing_msg_id = msg_id
        self.editing_conv_id = self.conv_id if msg_id is not None else None
        self.composer.editing_label.setVisible(msg_id is not None)
        self.composer.editing_label.setText("Editing a message: sending replaces it and everything after it "
                                            "(Esc to cancel)")

    # ------------------------------------------------------------------ settings / panel
    def open_settings(self) -> None:
        info = self.engine_info or {}
        dlg = SettingsDialog(self.settings, self, variants=info.get("variants"),
                             quantized=bool(info.get("quantization")),
                             auto_context=info.get("context_length") if info.get("context_auto") else None,
                             gpus=info.get("gpus"))
        if dlg.exec() != SettingsDialog.Accepted:
            return
        self.apply_settings(dlg.result_settings())

    def apply_settings(self, new: AppSettings) -> None:
        old = self.settings
        self.settings = new
        new.save(self.qs)
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
        self._fit_minimum_size()
        self.live_btn.setAccessibleName("Hide live panel" if on else "Show live panel")
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


def _model_title(name: str) -> str:
    return name.replace("-", " ").replace("_", " ") if len(name) < 48 else name[:45] + "…"
