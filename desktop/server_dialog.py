"""Add a model server: its address, an optional API key, and a first contact that lists its models.

The contact runs on a background thread (a server that is slow or down must not freeze the window) and is the
only network traffic this dialog makes, after the user presses Connect.
"""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QVBoxLayout,
)

from desktop.servers import Server, normalised_url


class _Probe(QObject):
    """Carries a contact's result from its thread to the dialog (a queued signal to the dialog's own method)."""

    done = Signal(object, object)  # models (list) or None, error text or None


def list_models(url: str, key: str | None, insecure_tls: bool) -> list[str]:
    """The server's models (GET /models), or a RemoteError that says what went wrong."""
    from model_loader.remote import RemoteEngine

    return RemoteEngine(url, "", key or None, timeout=15.0, verify_tls=not insecure_tls).models()


class AddServerDialog(QDialog):
    def __init__(self, parent=None, taken_names: set[str] | None = None, keys_where: str = ""):
        """taken_names: the names of servers already added (a new one must differ); keys_where: where the key
        will be kept (KeyStore.where), said under the key field."""
        super().__init__(parent)
        self.setWindowTitle("Add a model server")
        self.setAccessibleName("Add a model server")
        self.setMinimumWidth(520)
        self._taken = taken_names or set()
        self.models: list[str] = []
        form = QFormLayout()
        self.url = QLineEdit()
        self.url.setAccessibleName("Server address")
        self.url.setPlaceholderText("http://gpu-box:8089/v1")
        form.addRow("Address", self.url)
        self.name = QLineEdit()
        self.name.setAccessibleName("Server name")
        self.name.setPlaceholderText("Shown in the model list, e.g. Lab server")
        form.addRow("Name", self.name)
        self.key = QLineEdit()
        self.key.setAccessibleName("API key")
        self.key.setEchoMode(QLineEdit.Password)
        self.key.setPlaceholderText("Optional")
        form.addRow("API key", self.key)
        where = QLabel(f"Kept in {keys_where}, never in the settings file." if keys_where else "")
        where.setObjectName("Meta")
        where.setWordWrap(True)
        form.addRow("", where)
        self.insecure = QCheckBox("Accept a self-signed certificate from this server")
        self.insecure.setToolTip("HTTPS is verified unless you tick this, for this server only")
        form.addRow("", self.insecure)
        self.connect_btn = QPushButton("Connect")
        self.connect_btn.setAccessibleName("Connect to the server")
        self.connect_btn.clicked.connect(self.check)
        self.status = QLabel("Nothing is sent until you press Connect: it asks the server for its models.")
        self.status.setObjectName("Meta")
        self.status.setWordWrap(True)
        self.model_list = QListWidget()
        self.model_list.setAccessibleName("The server's models")
        self.model_list.setFixedHeight(110)
        self.buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        self.buttons.button(QDialogButtonBox.Ok).setText("Add")
        self.buttons.button(QDialogButtonBox.Ok).setEnabled(False)  # once the server has listed its models
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(self.connect_btn)
        lay.addWidget(self.status)
        lay.addWidget(self.model_list)
        lay.addWidget(self.buttons)
        self._probe = _Probe()  # no parent: a check that answers after the dialog closed reaches no one
        self._probe.done.connect(self._on_checked)
        for field in (self.url, self.key):
            field.textChanged.connect(self._invalidate)
        self.insecure.toggled.connect(self._invalidate)

    def check(self) -> None:
        url = normalised_url(self.url.text())
        if not url:
            self.status.setText("Type the server's address first.")
            return
        self.url.setText(url)
        self.connect_btn.setEnabled(False)
        self.status.setText(f"Asking {url} for its models…")
        key, insecure, probe = self.key.text().strip(), self.insecure.isChecked(), self._probe

        def run() -> None:
            try:
                probe.done.emit(list_models(url, key, insecure), None)
            except Exception as err:  # RemoteError: down, refused key, not an OpenAI server
                probe.done.emit(None, str(err))

        threading.Thread(target=run, name="r1desk-server-check", daemon=True).start()

    def _on_checked(self, models, error) -> None:
        self.connect_btn.setEnabled(True)
        self.model_list.clear()
        if error is not None:
            self.models = []
            self.status.setText(f"Could not use this server: {error}")
        else:
            self.models = list(models)
            self.model_list.addItems(self.models)
            self.status.setText(
                f"The server lists {len(self.models)} model{'s' if len(self.models) != 1 else ''}."
                if self.models
                else "The server answered but lists no models."
            )
        self.buttons.button(QDialogButtonBox.Ok).setEnabled(bool(self.models))

    def _invalidate(self) -> None:
        """A changed address or key has not been checked: connect again before adding."""
        if self.models:
            self.models = []
            self.model_list.clear()
            self.status.setText("Changed: press Connect again.")
            self.buttons.button(QDialogButtonBox.Ok).setEnabled(False)

    def accept(self) -> None:
        name = self.name.text().strip() or self.url.text().split("://")[-1].split("/")[0]
        if name in self._taken:
            self.status.setText(f"A server named {name!r} is already added: choose another name.")
            return
        self.name.setText(name)
        super().accept()

    def server(self) -> Server:
        return Server(self.name.text().strip(), self.url.text(), self.insecure.isChecked(), list(self.models))

    def api_key(self) -> str:
        return self.key.text().strip()
