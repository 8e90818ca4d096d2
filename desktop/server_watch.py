"""The load of the server a remote model runs on, for the live panel: its /metrics read every few seconds on a
background thread while the panel is open (a server that is slow or down must not freeze the window)."""

from __future__ import annotations

import threading
from pathlib import Path

from PySide6.QtCore import QObject, Signal

POLL_S = 2.0


class ServerWatch(QObject):
    figures = Signal(object)  # RemoteEngine.server_metrics()'s dict, or None (no /metrics, or unreachable)

    def __init__(self, parent=None):
        super().__init__(parent)
        self._stop: threading.Event | None = None
        self._active = threading.Event()  # the panel is open: poll; closed: wait

    def watch(self, url: str, model: str, key_dir: Path, insecure_tls: bool, key: str | None = None) -> None:
        """Poll this server from now on (the one watched before, if any, is let go); key: given for this run,
        else the keyring's."""
        self.stop()
        stop = self._stop = threading.Event()
        active, figures = self._active, self.figures

        def run() -> None:
            from model_loader.remote import RemoteEngine

            from desktop.servers import KeyStore

            api_key = key or KeyStore(key_dir).get(url)
            engine = RemoteEngine(url, model, api_key, timeout=5.0, verify_tls=not insecure_tls)
            while not stop.is_set():
                if active.wait(0.5) and not stop.is_set():
                    figures.emit(engine.server_metrics())
                    stop.wait(POLL_S)

        threading.Thread(target=run, name="r1desk-server-watch", daemon=True).start()

    def set_active(self, on: bool) -> None:
        (self._active.set if on else self._active.clear)()

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None
