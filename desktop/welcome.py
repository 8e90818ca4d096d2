"""First run: no model configured (or the configured one failed). Pick a folder or a model found locally.

Finding models scans r1desk's models folder and the Hugging Face cache (model_loader.locate, which never
touches the network and never imports torch); it runs on a pool thread so a large cache can't freeze the
window, and reports back through a queued signal.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QRunnable, Qt, QThreadPool, Signal
from PySide6.QtWidgets import (QFileDialog, QFrame, QHBoxLayout, QLabel, QListWidget, QListWidgetItem, QPushButton,
                               QVBoxLayout, QWidget)


class _ScanSignals(QObject):
    done = Signal(object)  # list of (path, label)


class _Scan(QRunnable):
    def __init__(self, signals: _ScanSignals):
        super().__init__()
        self.signals = signals

    def run(self) -> None:
        found = []
        try:
            from model_loader.locate import find_local_models

            for m in find_local_models():
                cfg = m.config
                size = sum(s.stat().st_size for s in m.shards) / 2**30
                layers = getattr(cfg, "num_hidden_layers", "?")
                found.append((str(m.path), f"{_pretty_name(m.path)}  ·  {layers} layers  ·  {size:.1f} GB",))
        except Exception:  # an unreadable cache is "nothing found", not a crash
            pass
        self.signals.done.emit(found)


def _pretty_name(path) -> str:
    # HF cache snapshots live in .../models--owner--name/snapshots/<hash>: show owner/name.
    for part in path.parts:
        if part.startswith("models--"):
            return part[len("models--"):].replace("--", "/")
    return path.name


class WelcomePage(QWidget):
    model_chosen = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setAccessibleName("Welcome")
        self.setObjectName("Welcome")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(40, 40, 40, 40)
        outer.addStretch(1)
        card = QFrame()
        card.setMaximumWidth(640)
        lay = QVBoxLayout(card)
        lay.setSpacing(12)
        title = QLabel("Welcome to r1desk")
        f = title.font()
        f.setPointSizeF(f.pointSizeF() * 1.6)
        f.setBold(True)
        title.setFont(f)
        lay.addWidget(title)
        self.message = QLabel("r1desk runs DeepSeek-R1-Distill-Qwen (and other Qwen2 models) on your own GPU, "
                              "offline. Choose the model to use.")
        self.message.setWordWrap(True)
        lay.addWidget(self.message)
        self.error = QLabel()
        self.error.setObjectName("Banner")
        self.error.setWordWrap(True)
        self.error.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.error.setContentsMargins(10, 8, 10, 8)
        self.error.hide()
        lay.addWidget(self.error)

        found_label = QLabel("Compatible models found on this computer")
        found_label.setObjectName("Role")
        lay.addWidget(found_label)
        self.found = QListWidget()
        self.found.setAccessibleName("Models found on this computer")
        self.found.setMinimumHeight(120)
        self.found.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.found.setWordWrap(True)
        self.found.setTextElideMode(Qt.ElideMiddle)
        self.found.itemActivated.connect(self._use_item)
        self.found.itemSelectionChanged.connect(lambda: self.use_btn.setEnabled(bool(self.found.selectedItems())))
        lay.addWidget(self.found)
        row = QHBoxLayout()
        self.use_btn = QPushButton("Use selected model")
        self.use_btn.setProperty("primary", True)
        self.use_btn.setAccessibleName("Use selected model")
        self.use_btn.setEnabled(False)
        self.use_btn.clicked.connect(lambda: self._use_item(self.found.currentItem()))
        self.folder_btn = QPushButton("Choose a model folder…")
        self.folder_btn.setAccessibleName("Choose a model folder")
        self.folder_btn.clicked.connect(self._pick_folder)
        self.rescan_btn = QPushButton("Search again")
        self.rescan_btn.setAccessibleName("Search again for models")
        self.rescan_btn.clicked.connect(self.scan)
        row.addWidget(self.use_btn)
        row.addWidget(self.folder_btn)
        row.addStretch(1)
        row.addWidget(self.rescan_btn)
        lay.addLayout(row)
        hint = QLabel("A model folder holds config.json, tokenizer.json and *.safetensors files — for example "
                      "a download of deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B.")
        hint.setObjectName("Meta")
        hint.setWordWrap(True)
        lay.addWidget(hint)
        h = QHBoxLayout()
        h.addStretch(1)
        h.addWidget(card, 10)
        h.addStretch(1)
        outer.addLayout(h)
        outer.addStretch(2)
        self._signals = _ScanSignals()
        self._signals.done.connect(self._on_found)
        self.scanning = False

    def show_error(self, text: str) -> None:
        self.error.setText(text)
        self.error.setVisible(bool(text))

    def scan(self) -> None:
        if self.scanning:
            return
        self.scanning = True
        self.found.clear()
        placeholder = QListWidgetItem("Searching…")
        placeholder.setFlags(Qt.NoItemFlags)
        self.found.addItem(placeholder)
        QThreadPool.globalInstance().start(_Scan(self._signals))

    def _on_found(self, found: list) -> None:
        self.scanning = False
        self.found.clear()
        for path, label in found:
            item = QListWidgetItem(label)
            item.setData(Qt.UserRole, path)
            item.setToolTip(path)
            self.found.addItem(item)
        if not found:
            item = QListWidgetItem("No compatible models found in the Hugging Face cache or r1desk's models folder.")
            item.setFlags(Qt.NoItemFlags)
            self.found.addItem(item)
        else:
            self.found.setCurrentRow(0)

    def _use_item(self, item) -> None:
        if item is not None and item.data(Qt.UserRole):
            self.model_chosen.emit(item.data(Qt.UserRole))

    def _pick_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Choose the model folder")
        if path:
            self.model_chosen.emit(path)
