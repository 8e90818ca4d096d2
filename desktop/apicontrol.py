"""The window's side of the local API server: starts and stops desktop.api.server.ApiServer as Settings say
("Local API server", off by default), shows "API: 127.0.0.1:PORT" in the header while it runs, and reports a
port that can't be used. The server runs on the window's own asyncio loop (qasync), so it must be started from
inside that loop: attach() is called when the engine starts, which the app schedules inside the running loop.
"""

from __future__ import annotations

import asyncio

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QLabel


class ApiControl(QObject):
    running_changed = Signal(str)  # the base URL while serving, "" when stopped
    failed = Signal(str)  # why the server could not start

    def __init__(self, parent=None):
        super().__init__(parent)
        self.label = QLabel()
        self.label.setObjectName("ApiBadge")
        self.label.setAccessibleName("Local API server")
        self.label.hide()
        self.service = None
        self.server = None
        self.wanted: tuple | None = None  # (port, key, origins) the settings ask for; None = off
        self.defaults: dict = {}  # temperature/top_p for requests that leave them out: the app's settings
        self._task: asyncio.Task | None = None

    def attach(self, service) -> None:
        self.service = service
        self._sync()

    def apply(self, settings) -> None:
        """Follow the settings: start, restart on a new port/key/origins, or stop."""
        self.defaults.update(temperature=settings.temperature, top_p=settings.top_p)
        origins = tuple(o.strip() for o in settings.api_origins.split(",") if o.strip())
        self.wanted = (settings.api_port, settings.api_key.strip(), origins) if settings.api_enabled else None
        self._sync()

    @property
    def url(self) -> str:
        return self.server.url if self.server is not None and self.server.runner is not None else ""

    def _sync(self) -> None:
        if self.service is None:
            return  # started with the engine (attach)
        if self.server is None and self.wanted is None:
            return  # off and staying off: nothing to import (aiohttp) or compare
        from desktop.api.server import normalize_origins

        # the origins as the server holds them: "http://a.example/" or one listed twice is no change
        current = (
            None
            if self.server is None
            else (self.server.requested_port, self.server.api_key or "", self.server.allowed_origins)
        )
        wanted = None if self.wanted is None else (self.wanted[0], self.wanted[1], normalize_origins(self.wanted[2]))
        if current == wanted:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # only the app's qasync loop can host the server
            self.failed.emit("the local API server needs the app's event loop, which is not running")
            return
        previous, self._task = self._task, None
        self._task = loop.create_task(self._restart(previous))

    async def _restart(self, previous: asyncio.Task | None) -> None:
        from desktop.api.server import ApiServer

        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        if self.server is not None:
            server, self.server = self.server, None
            await server.stop()
            self._show("")
        if self.wanted is None:
            return
        port, key, origins = self.wanted
        server = ApiServer(
            self.service, "127.0.0.1", port, api_key=key or None, allowed_origins=origins, defaults=self.defaults
        )
        self.server = server
        try:
            await server.start()
        except OSError as err:
            self.server = None
            self.failed.emit(
                f"could not listen on 127.0.0.1:{port} ({err.strerror or err}); pick another port in Settings"
            )
            return
        self._show(server.url)

    def _show(self, url: str) -> None:
        if url:
            self.label.setText(f"API: 127.0.0.1:{self.server.port}")
            self.label.setToolTip(f"The local OpenAI-compatible API is on: base URL {url}")
            self.label.show()
        else:
            self.label.hide()
        self.running_changed.emit(url)

    def shutdown(self) -> None:
        """Closing the window: stop listening (requests in flight end with the engine's shutdown); app.main
        awaits aclose() before the loop closes."""
        self.wanted = None
        self._sync()

    async def aclose(self) -> None:
        self.wanted = None
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        if self.server is not None:
            server, self.server = self.server, None
            await server.stop()
