"""First run: no model configured (or the configured one failed). Pick a folder or a model found locally.

The download can be followed by a 4-bit copy (AWQ): the window runs model_loader.quantize on the engine
worker's thread (it needs torch) and reports progress back here; Cancel stops it between layers.

Finding models scans r1desk's models folder and the Hugging Face cache (model_loader.locate, which never
touches the network and never imports torch); it runs on a pool thread so a large cache can't freeze the
window, and reports back through a queued signal. It is a plain Python thread, not a QThreadPool job: a pool
thread runs Python only inside short-lived thread states (see desktop/worker.py for why that is dangerous).
"""

from __future__ import annotations

from pathlib import Path

import threading

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from desktop.download import ModelDownload, default_destination
from desktop.theme import make_heading

DOWNLOAD_REPO = "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"  # == model_loader.locate.DEFAULT_REPO


class _ScanSignals(QObject):
    done = Signal(object)  # list of (path, label)


def _scan(signals: _ScanSignals) -> None:
    """Runs on its own thread; the result reaches the GUI through the queued `done` signal."""
    found = []
    try:
        from model_loader.locate import find_local_models

        for m in find_local_models():
            cfg = m.config
            size = sum(s.stat().st_size for s in m.shards) / 2**30
            layers = getattr(cfg, "num_hidden_layers", "?")
            found.append(
                (
                    str(m.path),
                    f"{_pretty_name(m.path)}  ·  {layers} layers  ·  {size:.1f} GB",
                )
            )
    except Exception:  # an unreadable cache is "nothing found", not a crash
        pass
    signals.done.emit(found)


def _pretty_name(path) -> str:
    # HF cache snapshots live in .../models--owner--name/snapshots/<hash>: show owner/name.
    for part in path.parts:
        if part.startswith("models--"):
            return part[len("models--") :].replace("--", "/")
    return path.name


class WelcomePage(QWidget):
    model_chosen = Signal(str)
    quantize_requested = Signal(str)  # a downloaded dense folder to make a 4-bit copy of
    quantize_cancel_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setAccessibleName("Welcome")
        self.setObjectName("Welcome")
        self.setAttribute(Qt.WA_StyledBackground, True)  # let the stylesheet paint this QWidget's background
        outer = QVBoxLayout(self)
        outer.setContentsMargins(40, 40, 40, 40)
        outer.addStretch(1)
        self.card = card = QFrame()
        lay = QVBoxLayout(card)
        lay.setSpacing(12)
        title = QLabel("Welcome to r1desk")
        make_heading(title, 1.6)
        lay.addWidget(title)
        self.message = QLabel(
            "r1desk runs DeepSeek-R1-Distill-Qwen (and other Qwen2 models) on your own GPU, "
            "offline. Choose the model to use."
        )
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
        found_row = QHBoxLayout()  # the list's heading, with its refresh action at the right
        found_row.addWidget(found_label)
        found_row.addStretch(1)
        lay.addLayout(found_row)
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
        found_row.addWidget(self.rescan_btn)
        row.addWidget(self.use_btn)
        row.addWidget(self.folder_btn)
        row.addStretch(1)
        lay.addLayout(row)
        dl_label = QLabel("Or download it")
        dl_label.setObjectName("Role")
        lay.addWidget(dl_label)
        dl_row = QHBoxLayout()
        self.download_btn = QPushButton(f"Download {DOWNLOAD_REPO.split('/')[1]} (3.5 GB)")
        self.download_btn.setAccessibleName("Download the model")
        self.download_btn.clicked.connect(self.start_download)
        self.download_progress = QProgressBar()
        self.download_progress.setAccessibleName("Download progress")
        self.download_progress.setRange(0, 1000)
        self.download_progress.hide()
        self.cancel_btn = QPushButton("Cancel")
        self.cancel_btn.setAccessibleName("Cancel download")
        self.cancel_btn.clicked.connect(self.cancel_download)
        self.cancel_btn.hide()
        dl_row.addWidget(self.download_btn, 0)
        dl_row.addWidget(self.download_progress, 4)
        dl_row.addWidget(self.cancel_btn)
        self.download_btn.setSizePolicy(QSizePolicy.Maximum, QSizePolicy.Fixed)
        dl_row.addStretch(1)
        lay.addLayout(dl_row)
        # A checkbox's text does not wrap: kept short enough for the card at the window's smallest size.
        self.quantize_box = QCheckBox("…and make a 4-bit copy (AWQ: ~1.2 GB, half the VRAM)")
        self.quantize_box.setAccessibleName("Also make a 4-bit copy")
        self.quantize_box.setToolTip(
            "After the download, quantize the model to 4-bit AWQ on this computer "
            "(a few minutes on a GPU) and use that copy: half the VRAM, and faster on "
            "laptop GPUs"
        )
        lay.addWidget(self.quantize_box)
        self.quantizing = False
        self.download_status = QLabel(
            f"From huggingface.co/{DOWNLOAD_REPO}, into r1desk's models folder. "
            "An interrupted download resumes where it stopped."
        )
        self.download_status.setObjectName("Meta")
        self.download_status.setWordWrap(True)
        self.download_status.setAccessibleName("Download status")
        lay.addWidget(self.download_status)
        self.download = ModelDownload(self)
        self.download.progress.connect(self._on_download_progress)
        self.download.finished.connect(self._on_download_finished)
        self.download.failed.connect(self._on_download_failed)
        self.download_dest: Path | None = None

        hint = QLabel(
            "A model folder holds config.json, tokenizer.json and *.safetensors files — for example "
            "a download of deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B."
        )
        hint.setObjectName("Meta")
        hint.setWordWrap(True)
        lay.addWidget(hint)
        h = QHBoxLayout()
        h.addStretch(1)
        h.addWidget(card)
        h.addStretch(1)
        outer.addLayout(h)
        outer.addStretch(2)
        self._signals = _ScanSignals()
        self._signals.done.connect(self._on_found)
        self.scanning = False

    CARD_WIDTH = 640  # the card's width where there is room; narrower windows give it all they have

    def resizeEvent(self, event) -> None:
        # Stretches beside the card would take their share even when the window is narrow and squeeze the
        # card's buttons below their text (cut-off labels at the smallest window): the card takes all the width
        # there is, up to CARD_WIDTH, and the margins shrink first (the top and bottom ones too in a short window).
        side = 40 if event.size().width() >= self.CARD_WIDTH + 80 else 16
        top = 40 if event.size().height() >= 640 else 12  # the smallest window needs every line for the card
        margins = self.layout().contentsMargins()
        if (margins.left(), margins.top()) != (side, top):
            self.layout().setContentsMargins(side, top, side, top)
        self.card.setFixedWidth(max(0, min(self.CARD_WIDTH, event.size().width() - 2 * side)))
        super().resizeEvent(event)

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
        threading.Thread(target=_scan, args=(self._signals,), name="r1desk-model-scan", daemon=True).start()

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

    # ---- download (asyncio, run by the qasync loop; see desktop/download.py)
    def start_download(self, dest: Path | None = None):
        self.download_dest = Path(dest) if dest else default_destination(DOWNLOAD_REPO)
        self.download_btn.setEnabled(False)
        self.download_progress.show()
        self.download_progress.setValue(0)
        self.cancel_btn.show()
        self.download_status.setText("Connecting to huggingface.co…")
        return self.download.start(DOWNLOAD_REPO, self.download_dest)

    def cancel_download(self) -> None:
        if self.quantizing:
            self.cancel_btn.setEnabled(False)  # stops at the next layer step
            self.download_status.setText("Cancelling…")
            self.quantize_cancel_requested.emit()
        else:
            self.download.cancel()

    def _on_download_progress(self, done: int, total: int) -> None:
        self.download_progress.setValue(int(1000 * done / total) if total else 0)
        self.download_status.setText(f"Downloading… {done / 2**30:.2f} of {total / 2**30:.2f} GB")

    def _on_download_finished(self, path: str) -> None:
        if self.quantize_box.isChecked():
            self.quantize_requested.emit(path)
            return
        self._download_idle("Download complete.")
        self.model_chosen.emit(path)

    # ---- the 4-bit copy (run by the engine worker; the window relays its signals here)
    def quantize_started(self) -> None:
        self.quantizing = True
        # One job at a time on the engine thread: a model picked now would load only after the copy anyway.
        for w in (self.download_btn, self.quantize_box, self.use_btn, self.folder_btn, self.found):
            w.setEnabled(False)
        self.download_progress.show()
        self.download_progress.setValue(0)
        self.cancel_btn.show()
        self.cancel_btn.setEnabled(True)
        self.cancel_btn.setAccessibleName("Cancel the 4-bit copy")
        self.download_status.setText("Making the 4-bit copy: starting the engine…")

    def on_quantize_progress(self, index: int, layers: int, what: str) -> None:
        self.download_progress.setValue(int(1000 * index / layers) if layers else 0)
        if index < layers:
            self.download_status.setText(f"Making the 4-bit copy: layer {index + 1}/{layers} ({what})…")
        else:
            self.download_status.setText(f"Making the 4-bit copy: {layers}/{layers} layers done.")

    def quantize_finished(self, message: str) -> None:
        self.quantizing = False
        for w in (self.quantize_box, self.folder_btn, self.found):
            w.setEnabled(True)
        self.use_btn.setEnabled(bool(self.found.selectedItems()))
        self.cancel_btn.setAccessibleName("Cancel download")
        self.cancel_btn.setEnabled(True)
        self._download_idle(message)
        self.download_progress.hide()

    def _on_download_failed(self, kind: str, message: str) -> None:
        self._download_idle(message)
        if kind in ("cancelled", "offline", "error") and self.download_progress.value() > 0:
            self.download_btn.setText("Resume download")
        self.download_progress.setVisible(self.download_progress.value() > 0)

    def _download_idle(self, text: str) -> None:
        self.download_btn.setEnabled(True)
        self.cancel_btn.hide()
        self.download_status.setText(text)

    def _use_item(self, item) -> None:
        if item is not None and item.data(Qt.UserRole):
            self._choose(item.data(Qt.UserRole))

    def _pick_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Choose the model folder")
        if path:
            self._choose(path)

    def _choose(self, path: str) -> None:
        """The user picked a model: a download still running pauses (it can resume later from here), or its
        end would replace the user's choice with the downloaded model (and start a 4-bit copy behind the chat)."""
        if self.download.running:
            self.download.cancel()
        self.model_chosen.emit(path)
