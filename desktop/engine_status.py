"""What the top bar says about the engine: starting, loading (GB read), warming up (step n of m), ready on which
device, or not loaded. The engine's state itself is the EngineService's (desktop.service); this only words it.

The wording is plain functions (tested without a window); EngineStatus applies them to the top bar as the
service's events arrive.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

STAGE_TEXT = {
    "importing": "Starting the engine…",
    "loading": "Loading model…",
    "warming": "Warming up…",
    "preparing": "Preparing GPU kernels (first start only)…",
}
# a first start compiles the GPU kernels while the weights load: said beside the load's progress
COMPILING_NOTE = " · preparing GPU kernels alongside (first start only)"


def device_title(info: dict) -> str:
    """The device a model runs on, for the status line: the GPU's name, and its number where the machine has
    several (two of the same card would read alike)."""
    device = info.get("device") or ""
    if device == "cpu":
        return "CPU"
    name = info.get("device_name", "GPU")
    return f"{name} (GPU {device.removeprefix('cuda:')})" if len(info.get("gpus") or []) > 1 else name


def model_title(name: str) -> str:
    """A model folder's name as the chat shows it: words, not dashes; a long one cut with an ellipsis."""
    return name.replace("-", " ").replace("_", " ") if len(name) < 48 else name[:45] + "…"


def loading_text(done: int, total: int, note: str = "") -> str:
    return f"Loading model… {done / 2**30:.2f} / {total / 2**30:.2f} GB{note}"


def warmup_text(stage_text: str, done: int, total: int, what: str) -> str:
    """ "Preparing GPU kernels (first start only)… 3/14: timing the attention kernels": the step under way."""
    return f"{stage_text} {min(done + 1, total)}/{total}: {what}"


def ready_text(assistant: str | None, info: dict) -> str:
    """assistant None: the top bar's model picker names the model, and for a server's model where it runs."""
    if assistant:
        return f"Ready · {assistant} · {device_title(info)}"
    return "Ready" if info.get("device") == "remote" else f"Ready · {device_title(info)}"


class EngineStatus(QObject):
    """Keeps the top bar's status line and progress bar in step with an EngineService's load."""

    changed = Signal()  # the line changed with the engine's state: what the composer allows may have too

    def __init__(self, bar, parent=None):
        super().__init__(parent)
        self.bar = bar
        self.service = None
        self._stage_text = ""
        self._note = ""  # said after the load's progress (a first start compiling beside it)

    def attach(self, service) -> None:
        self.service = service
        service.stage.connect(self._on_stage)
        service.progress.connect(self._on_progress)
        service.warmup_progress.connect(self._on_warmup_progress)

    def starting(self) -> None:
        self._set("Starting…", busy=True)

    def ready(self, assistant: str | None, info: dict) -> None:
        self._set(ready_text(assistant, info), busy=False)

    def not_loaded(self) -> None:
        self._set("Model not loaded", busy=False)

    def _set(self, text: str, busy: bool) -> None:
        self.bar.set_status(text, busy)
        self.changed.emit()

    def _on_stage(self, stage: str) -> None:
        if stage == "compiling":
            self._note = COMPILING_NOTE
            self.bar.set_status(STAGE_TEXT["loading"] + self._note)
            return
        if stage in ("importing", "loading"):
            self._note = ""
        self._stage_text = STAGE_TEXT[stage]
        self._set(self._stage_text, busy=True)

    def _on_warmup_progress(self, done: int, total: int, what: str) -> None:
        if self.service is None or self.service.state != "warming" or not total:
            return
        self.bar.set_progress(done, total)
        self.bar.set_status(warmup_text(self._stage_text, done, total, what))

    def _on_progress(self, done: int, total: int) -> None:
        self.bar.set_progress(int(1000 * done / total) if total else 0, 1000)
        self.bar.set_status(loading_text(done, total, self._note))
