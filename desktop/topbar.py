"""The bar above the chat: the chat's title, the engine's status line and progress, the API's address, and the
Export, Live panel and Settings buttons. A widget only: what the status says is desktop.engine_status's."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QFrame, QHBoxLayout, QMenu, QProgressBar, QToolButton, QWidget

from desktop.elidedlabel import ElidedLabel


class TopBar(QFrame):
    export_requested = Signal(str)  # "md" | "json": the open chat
    settings_requested = Signal()
    model_picked = Signal(str)  # a model_choices key: "" the model folder, else "URL\nMODEL" on a server

    def __init__(self, api_label: QWidget, parent=None):
        super().__init__(parent)
        self.setObjectName("TopBar")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(16, 8, 10, 8)
        # Both labels end in "…" when the bar is short of room (a long chat title, a long load or warm-up line)
        # rather than push the buttons over each other; the status takes the room left, its text on the right.
        self.title_label = ElidedLabel("New chat", widest=360)
        self.title_label.setObjectName("ChatTitle")
        lay.addWidget(self.title_label)
        self.model_picker = QComboBox()
        self.model_picker.setAccessibleName("Model")
        self.model_picker.setToolTip("The model that answers, and where it runs (servers: Settings → Add server…)")
        self.model_picker.setSizeAdjustPolicy(QComboBox.AdjustToContents)
        self.model_picker.setMaximumWidth(360)
        self.model_picker.activated.connect(lambda i: self.model_picked.emit(self.model_picker.itemData(i) or ""))
        self.model_picker.hide()  # shown where there is a choice: a server added
        lay.addWidget(self.model_picker)
        self.status_label = ElidedLabel("No model")
        self.status_label.setObjectName("Meta")
        self.status_label.setAccessibleName("Model status")
        self.status_label.setAlignment(Qt.AlignRight | Qt.AlignVCenter)
        lay.addWidget(self.status_label, 1)
        lay.addWidget(api_label)
        self.progress = QProgressBar()
        self.progress.setAccessibleName("Loading progress")
        self.progress.setMinimumWidth(48)  # narrows in a narrow window rather than cover the buttons
        self.progress.setMaximumWidth(160)
        self.progress.setTextVisible(False)
        self.progress.hide()
        lay.addWidget(self.progress)
        self.menu_btn = QToolButton()
        self.menu_btn.setText("Export ▾")
        self.menu_btn.setAccessibleName("Export conversation")
        self.menu_btn.setPopupMode(QToolButton.InstantPopup)
        export_menu = QMenu(self.menu_btn)
        export_menu.addAction("Export as Markdown…", lambda: self.export_requested.emit("md"))
        export_menu.addAction("Export as JSON…", lambda: self.export_requested.emit("json"))
        self.menu_btn.setMenu(export_menu)
        lay.addWidget(self.menu_btn)
        self.live_btn = QToolButton()
        self.live_btn.setText("Live panel")
        self.live_btn.setCheckable(True)
        self.live_btn.setAccessibleName("Show live panel")
        self.live_btn.setToolTip("Timings, speed, context and GPU memory (Ctrl+I)")
        lay.addWidget(self.live_btn)
        self.settings_btn = QToolButton()
        self.settings_btn.setText("Settings")
        self.settings_btn.setAccessibleName("Settings")
        self.settings_btn.setToolTip("Settings (Ctrl+,)")
        self.settings_btn.clicked.connect(self.settings_requested)
        lay.addWidget(self.settings_btn)

    def set_models(self, choices: list[tuple[str, str]], current: str) -> None:
        """The picker's models (label, key) with `current` selected; hidden with fewer than two to pick from."""
        self.model_picker.blockSignals(True)
        self.model_picker.clear()
        for label, key in choices:
            self.model_picker.addItem(label, key)
        self.model_picker.setCurrentIndex(max(0, self.model_picker.findData(current)))
        self.model_picker.blockSignals(False)
        self.model_picker.setVisible(len(choices) > 1)

    def set_title(self, text: str) -> None:
        self.title_label.setText(text)

    def set_status(self, text: str, busy: bool | None = None) -> None:
        """The status line; busy True shows the progress bar (moving until set_progress), False hides it, None
        leaves it as it is."""
        self.status_label.setText(text)
        if busy is not None:
            self.progress.setVisible(busy)
            if busy:
                self.progress.setRange(0, 0)

    def set_progress(self, done: int, total: int) -> None:
        self.progress.setRange(0, total)
        self.progress.setValue(done)

    def set_live_shown(self, on: bool) -> None:
        self.live_btn.setAccessibleName("Hide live panel" if on else "Show live panel")
