"""User settings (QSettings) and the settings dialog.

Defaults follow DeepSeek's advice for R1: temperature 0.6, top-p 0.95, and no system prompt.
Settings that change the loaded model (path, device, precision, context length) trigger a reload; sampling
settings apply to the next reply.

Precision covers 4-bit too: a 4-bit (AWQ) model is a separate folder, so picking "4-bit (AWQ)" switches the
model folder to the AWQ sibling of the current model, and picking a dense precision switches back. The worker
finds the siblings (model_loader.locate.find_variants) after each load; the list offers only what exists.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)


@dataclass
class AppSettings:
    model_path: str = ""
    # a model on a server instead (desktop.servers): its base URL and model id; empty: the model folder above
    remote_server: str = ""
    remote_model: str = ""
    servers: str = ""  # the servers the user added, as JSON (desktop.servers; their keys are not here)
    device: str = "cuda"  # "cuda" (the first GPU that works) | "cuda:N" | "cpu" (offered when no GPU is usable)
    precision: str = "auto"  # "auto" | "bf16" | "fp16" | "fp32" | "awq" (the model folder is the 4-bit one)
    context_length: int = 0  # 0 = auto: from the free VRAM at load, up to 32,768 (model_loader.context)
    kv_cache: str = "16-bit"  # "16-bit" | "8-bit" (model_loader.kv_cache)
    max_parallel: int = 1  # replies decoded together (model_loader.scheduler); 1: one at a time, the fastest alone
    vote_chains: int = 8  # Ask ×N: reasoning chains sampled for a majority answer (desktop.vote)
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 0
    max_new_tokens: int = 0  # 0 = auto: the context length (a long chain of thought is never cut short)
    system_prompt: str = ""
    theme: str = "system"  # "system" | "light" | "dark"
    font_size: int = 11
    api_enabled: bool = False  # the local OpenAI-compatible API server (desktop.apicontrol)
    api_port: int = 8089
    api_key: str = ""  # empty: no key asked (the server binds 127.0.0.1 only)
    api_origins: str = ""  # comma-separated web origins allowed through CORS; empty: none

    MODEL_KEYS = (
        "model_path",
        "remote_server",
        "remote_model",
        "device",
        "precision",
        "context_length",
        "kv_cache",
        "max_parallel",
    )
    # What the dialog allows; a value outside it (a hand-edited or older ini file) is read as the default.
    RANGES = {
        "context_length": (0, 131072),
        "max_parallel": (1, 32),
        "vote_chains": (2, 64),
        "temperature": (0.0, 2.0),
        "top_p": (0.05, 1.0),
        "top_k": (0, 1000),
        "max_new_tokens": (0, 131072),
        "font_size": (8, 24),
        "api_port": (1024, 65535),
    }
    CHOICES = {
        "precision": ("auto", "bf16", "fp16", "fp32", "awq"),
        "kv_cache": ("16-bit", "8-bit"),
        "theme": ("system", "light", "dark"),
    }
    VERSION = 2  # 2: context and max new tokens default to auto (0); version 1 stored 4096 for both

    @classmethod
    def load(cls, qs: QSettings) -> "AppSettings":
        s = cls()
        for f in fields(cls):
            raw = qs.value(f"settings/{f.name}")
            if raw is None:
                continue
            default = getattr(s, f.name)
            if isinstance(raw, list):  # an ini value with an unquoted comma comes back as a list of its parts
                raw = ", ".join(map(str, raw))
            try:
                if isinstance(default, bool):  # QSettings hands back "true"/"false" strings from an ini file
                    value = raw if isinstance(raw, bool) else str(raw).strip().lower() in ("true", "1", "yes")
                else:
                    value = type(default)(raw) if not isinstance(default, str) else str(raw)
            except (TypeError, ValueError):
                continue  # a hand-edited or corrupt value: keep the default
            if cls._allowed(f.name, value):
                setattr(s, f.name, value)
        if qs.value("settings/version") is None:
            # Settings saved before auto existed hold every field, defaults included: 4096 there was the old
            # default, not a choice. A user who did pick another number keeps it.
            if s.context_length == 4096:
                s.context_length = 0
            if s.max_new_tokens == 4096:
                s.max_new_tokens = 0
        return s

    @classmethod
    def _allowed(cls, name: str, value) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if name in cls.RANGES:
            lo, hi = cls.RANGES[name]
            return lo <= value <= hi
        if name in cls.CHOICES:
            return value in cls.CHOICES[name]
        if name == "device":
            return value in ("cuda", "cpu") or re.fullmatch(r"cuda:\d+", value) is not None
        return True

    def save(self, qs: QSettings) -> None:
        for k, v in asdict(self).items():
            qs.setValue(f"settings/{k}", v)
        qs.setValue("settings/version", self.VERSION)
        qs.sync()

    def sampling(self) -> dict:
        return dict(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, max_new_tokens=self.max_new_tokens
        )

    def server_list(self) -> list:
        from desktop.servers import servers_from_json

        return servers_from_json(self.servers)

    def remote(self):
        """The server whose model is in use (desktop.servers.Server), or None for the model folder."""
        if not self.remote_server or not self.remote_model:
            return None
        return next((s for s in self.server_list() if s.url == self.remote_server), None)

    def model_key(self) -> str:
        """The model in use as a model_choices key."""
        return f"{self.remote_server}\n{self.remote_model}" if self.remote() is not None else ""

    def model_choices(self) -> list[tuple[str, str]]:
        """Every model the settings know, as (label saying where it runs, key): the model folder on this computer
        ("" key) and each server's models ("URL\nMODEL")."""
        from pathlib import Path

        choices = []
        if self.model_path:
            choices.append((f"{Path(self.model_path).name} · this computer", ""))
        for server in self.server_list():
            choices += [(f"{model} · {server.name}", f"{server.url}\n{model}") for model in server.models]
        return choices

    def use_model_key(self, key: str) -> None:
        """Make the model of a model_choices key the one in use."""
        self.remote_server, _, self.remote_model = key.partition("\n") if key else ("", "", "")

    def dtype(self) -> str | None:
        return None if self.precision in ("auto", "awq") else self.precision  # AWQ: the engine picks


DENSE_PRECISIONS = [("Automatic", "auto"), ("bfloat16", "bf16"), ("float16", "fp16"), ("float32", "fp32")]
AWQ_PRECISION = ("4-bit (AWQ)", "awq")
KV_CACHE_FORMATS = [("16-bit (exact)", "16-bit"), ("8-bit (half the memory)", "8-bit")]


def device_choices(gpus: list[dict] | None, current: str) -> list[tuple[str, str]]:
    """The Device list: the GPU chosen automatically, each GPU by name where the machine has several (gpus: the
    worker's list, {"device": "cuda:N", "name", "supported"}), the CPU. A saved GPU that is not listed (none known
    before a model has loaded, or a card since removed) stays in the list, so opening the dialog changes nothing."""
    several = gpus is not None and len(gpus) > 1
    items = [("GPU (NVIDIA), the first that works" if several else "GPU (NVIDIA)", "cuda")]
    for gpu in gpus if several else []:
        note = "" if gpu["supported"] else " (not supported by this PyTorch)"
        items.append((f"GPU {gpu['device'].removeprefix('cuda:')}: {gpu['name']}{note}", gpu["device"]))
    if current.startswith("cuda:") and current not in [value for _, value in items]:
        items.append((f"GPU {current.removeprefix('cuda:')}", current))
    return items + [("CPU (slow)", "cpu")]


class SettingsDialog(QDialog):
    def __init__(
        self,
        settings: AppSettings,
        parent=None,
        variants: dict | None = None,
        quantized: bool = False,
        auto_context: int | None = None,
        gpus: list[dict] | None = None,
        keys_where: str = "",
    ):
        """variants: {"dense": folder | None, "awq": folder | None} for the loaded model (None: unknown);
        quantized: the loaded model is the 4-bit one; auto_context: the context "auto" chose at this load;
        gpus: the machine's NVIDIA GPUs (device_choices), None when not known yet; keys_where: where servers'
        keys are kept (desktop.servers.KeyStore.where)."""
        super().__init__(parent)
        self._variants = variants or {}
        self._quantized = quantized
        self.setWindowTitle("Settings")
        self.setAccessibleName("Settings")
        self.setMinimumWidth(520)
        R = AppSettings.RANGES  # noqa: N806 (the spin boxes' ranges, as load() checks them)
        form = QFormLayout()
        form.setVerticalSpacing(10)
        form.setHorizontalSpacing(16)

        # Where the model runs: the folder below on this computer, or a model of a server the user added.
        self.servers = settings.server_list()
        self.new_keys: dict[str, str] = {}  # keys of servers added in this dialog: stored on OK (window.apply_settings)
        self.removed_servers: list[str] = []  # their keys go on OK too
        self._keys_where = keys_where
        self.source = QComboBox()
        self.source.setAccessibleName("Model")
        self.source.setToolTip("The model folder on this computer, or a model on a server you added")
        add_server = QPushButton("Add server…")
        add_server.setAccessibleName("Add a model server")
        add_server.clicked.connect(self._add_server)
        self.remove_server = QPushButton("Remove server")
        self.remove_server.setAccessibleName("Remove this server")
        self.remove_server.clicked.connect(self._remove_server)
        form.addRow("Model", self.source)
        server_row = QHBoxLayout()
        server_row.setContentsMargins(0, 0, 0, 0)
        server_row.addWidget(add_server)
        server_row.addWidget(self.remove_server)
        server_row.addStretch(1)
        server_buttons = QWidget()
        server_buttons.setLayout(server_row)
        form.addRow("", server_buttons)
        self._fill_sources((settings.remote_server, settings.remote_model) if settings.remote() else None)
        self.source.currentIndexChanged.connect(self._on_source)

        self.model_path = QLineEdit(settings.model_path)
        self.model_path.setAccessibleName("Model folder")
        browse = QPushButton("Browse…")
        browse.setAccessibleName("Browse for model folder")
        browse.clicked.connect(self._browse)
        row = QHBoxLayout()
        row.addWidget(self.model_path, 1)
        row.addWidget(browse)
        holder = QWidget()
        holder.setLayout(row)
        row.setContentsMargins(0, 0, 0, 0)
        form.addRow("Model folder", holder)

        self.device = self._combo(device_choices(gpus, settings.device), settings.device, "Device")
        form.addRow("Device", self.device)
        self.precision = self._combo(
            self._precisions(variants, quantized, settings.precision),
            "awq" if quantized else settings.precision,
            "Precision",
        )
        self.precision.setToolTip(
            "4-bit (AWQ) needs about half the GPU memory and is faster on laptop GPUs; "
            "it is offered when a 4-bit copy of this model is on this computer"
        )
        self.precision.currentIndexChanged.connect(self._on_precision)
        form.addRow("Precision", self.precision)
        self.context = self._spin(
            QSpinBox(), *R["context_length"], settings.context_length, "Context length", step=1024
        )
        self.context.setSpecialValueText(f"Auto: {auto_context:,}" if auto_context else "Auto")
        self.context.setToolTip(
            "Auto: as much as the GPU has room for after the model, up to 32,768 tokens "
            "(DeepSeek advises allowing R1 that much)"
        )
        form.addRow("Context length (tokens)", self.context)
        self.kv_cache = self._combo(KV_CACHE_FORMATS, settings.kv_cache, "KV cache")  # unknown: the first
        self.kv_cache.setToolTip(
            "Where the model keeps the conversation it has read. 8-bit takes about half the "
            "GPU memory (Auto then fits twice the context, for larger models on small GPUs), "
            "at a small cost in accuracy (replies no longer match 16-bit exactly) and, for "
            "now, slower replies at long context. Needs an RTX 40-series or newer GPU"
        )
        form.addRow("KV cache", self.kv_cache)
        self.parallel = self._spin(QSpinBox(), *R["max_parallel"], settings.max_parallel, "Replies at once")
        self.parallel.setToolTip(
            "How many replies the model writes together: above 1, requests from other apps "
            "(the local API) and your own chats are decoded side by side instead of waiting "
            "in turn, for little more time than one. 1 writes one reply at a time, the "
            "fastest for a single reply"
        )
        form.addRow("Replies at once", self.parallel)
        self._local_rows = [holder, self.device, self.precision, self.context, self.kv_cache, self.parallel]
        self._on_source()
        self.vote = self._spin(QSpinBox(), *R["vote_chains"], settings.vote_chains, "Chains for Ask ×N")
        self.vote.setToolTip(
            "Ask ×N samples this many reasoning chains and answers with their majority (DeepSeek's "
            "R1 report: the 1.5B model scores 28.9% on AIME 2024 with one chain, 52.7% with a vote "
            "over 64). With Replies at once at least as large they are written together, in little "
            "more time than one; otherwise one after another"
        )
        form.addRow("Chains for Ask ×N", self.vote)
        self.temperature = self._spin(
            QDoubleSpinBox(), *R["temperature"], settings.temperature, "Temperature", step=0.05
        )
        form.addRow("Temperature", self.temperature)
        self.top_p = self._spin(QDoubleSpinBox(), *R["top_p"], settings.top_p, "Top-p", step=0.05)
        form.addRow("Top-p", self.top_p)
        self.top_k = self._spin(QSpinBox(), *R["top_k"], settings.top_k, "Top-k")
        self.top_k.setSpecialValueText("off")
        form.addRow("Top-k", self.top_k)
        self.max_new = self._spin(QSpinBox(), *R["max_new_tokens"], settings.max_new_tokens, "Max new tokens", step=256)
        self.max_new.setSpecialValueText("Auto (the context)")
        form.addRow("Max new tokens", self.max_new)
        self.system_prompt = QPlainTextEdit(settings.system_prompt)
        self.system_prompt.setAccessibleName("System prompt")
        self.system_prompt.setPlaceholderText("Empty (recommended for DeepSeek-R1: put instructions in your message)")
        self.system_prompt.setFixedHeight(80)
        form.addRow("System prompt", self.system_prompt)
        self.theme = self._combo(
            [("Follow system", "system"), ("Light", "light"), ("Dark", "dark")], settings.theme, "Theme"
        )
        form.addRow("Theme", self.theme)
        self.font_size = self._spin(QSpinBox(), *R["font_size"], settings.font_size, "Font size")
        form.addRow("Font size (pt)", self.font_size)

        self.api_enabled = QCheckBox("Serve to apps on this computer")
        self.api_enabled.setAccessibleName("Local API server")
        self.api_enabled.setToolTip(
            "An OpenAI-compatible API at http://127.0.0.1:PORT/v1 for editors, Open WebUI "
            "and scripts; only this computer can reach it"
        )
        self.api_enabled.setChecked(settings.api_enabled)
        form.addRow("Local API server", self.api_enabled)
        self.api_port = self._spin(QSpinBox(), *R["api_port"], settings.api_port, "API port")
        self.api_port.setGroupSeparatorShown(False)
        form.addRow("API port", self.api_port)
        self.api_key = QLineEdit(settings.api_key)
        self.api_key.setAccessibleName("API key")
        self.api_key.setPlaceholderText("Optional (a Bearer token)")
        form.addRow("API key", self.api_key)
        self.api_origins = QLineEdit(settings.api_origins)
        self.api_origins.setAccessibleName("Allowed web origins")
        self.api_origins.setPlaceholderText("None (e.g. http://localhost:3000)")
        form.addRow("Allowed web origins", self.api_origins)
        for w in (self.api_port, self.api_key, self.api_origins):
            w.setEnabled(settings.api_enabled)
            self.api_enabled.toggled.connect(w.setEnabled)

        note = QLabel(
            "Model folder, device, precision, context length, KV cache and replies at once take effect "
            "after the model reloads."
        )
        note.setObjectName("Meta")
        note.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel | QDialogButtonBox.RestoreDefaults)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.RestoreDefaults).clicked.connect(self._defaults)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(note)
        lay.addWidget(buttons)
        self._base = settings

    @staticmethod
    def _precisions(variants: dict | None, quantized: bool, current: str) -> list[tuple[str, str]]:
        if not variants:  # nothing known about siblings: the loaded model's own precisions only
            return [AWQ_PRECISION] if quantized or current == "awq" else list(DENSE_PRECISIONS)
        items = list(DENSE_PRECISIONS) if variants.get("dense") else []
        if variants.get("awq"):
            items.append(AWQ_PRECISION)
        return items

    def _on_precision(self) -> None:
        """Picking 4-bit (or back to a dense precision) switches the folder field to that variant, in view,
        unless the user has typed another folder."""
        path = self.model_path.text().strip()
        known = {self._base.model_path.strip()} | {v for v in self._variants.values() if v}
        if path not in known:
            return
        awq = self.precision.currentData() == "awq"
        if awq == self._quantized:  # the loaded model's own kind: its folder as configured
            self.model_path.setText(self._base.model_path)
        else:
            self.model_path.setText(self._variants.get("awq" if awq else "dense") or path)

    def _combo(self, items, current, name) -> QComboBox:
        c = QComboBox()
        c.setAccessibleName(name)
        for label, value in items:
            c.addItem(label, value)
        c.setCurrentIndex(max(0, c.findData(current)))
        return c

    def _spin(self, spin, lo, hi, value, name, step=1):
        spin.setRange(lo, hi)
        spin.setSingleStep(step)
        spin.setValue(value)
        spin.setAccessibleName(name)
        return spin

    def _browse(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Choose the model folder", self.model_path.text())
        if path:
            self.model_path.setText(path)

    # ------------------------------------------------------------------ model source
    def _fill_sources(self, current: tuple[str, str] | None) -> None:
        self.source.blockSignals(True)
        self.source.clear()
        self.source.addItem("This computer: the model folder below", "")
        for server in self.servers:
            for model in server.models:
                self.source.addItem(f"{server.name}: {model}", f"{server.url}\n{model}")  # a string: findData matches
        index = self.source.findData("\n".join(current)) if current else 0
        self.source.setCurrentIndex(max(0, index))
        self.source.blockSignals(False)

    def _on_source(self) -> None:
        """A server's model: the rows about running a model here don't apply (its server chose them)."""
        remote = self._picked() is not None
        for w in getattr(self, "_local_rows", []):
            w.setEnabled(not remote)
        self.remove_server.setEnabled(remote)

    def _picked(self) -> tuple[str, str] | None:
        """The server's URL and model picked, or None for the model folder."""
        data = self.source.currentData() or ""
        return tuple(data.split("\n", 1)) if data else None

    def _add_server(self) -> None:
        from desktop.server_dialog import AddServerDialog

        dlg = AddServerDialog(self, {s.name for s in self.servers}, self._keys_where)
        if dlg.exec() != QDialog.Accepted:
            return
        server = dlg.server()
        self.servers = [s for s in self.servers if s.url != server.url] + [server]
        if dlg.api_key():
            self.new_keys[server.url] = dlg.api_key()
        self._fill_sources((server.url, server.models[0]))
        self._on_source()

    def _remove_server(self) -> None:
        picked = self._picked()
        if picked is None:
            return
        url = picked[0]
        self.servers = [s for s in self.servers if s.url != url]
        self.new_keys.pop(url, None)
        self.removed_servers.append(url)
        self._fill_sources(None)
        self._on_source()

    def _defaults(self) -> None:
        d = AppSettings(model_path=self.model_path.text())
        self.device.setCurrentIndex(self.device.findData(d.device))
        if not self._quantized:  # restoring defaults never swaps the 4-bit model for the full-size one
            self.precision.setCurrentIndex(self.precision.findData(d.precision))
        self.context.setValue(d.context_length)
        self.kv_cache.setCurrentIndex(self.kv_cache.findData(d.kv_cache))
        self.parallel.setValue(d.max_parallel)
        self.vote.setValue(d.vote_chains)
        self.temperature.setValue(d.temperature)
        self.top_p.setValue(d.top_p)
        self.top_k.setValue(d.top_k)
        self.max_new.setValue(d.max_new_tokens)
        self.system_prompt.setPlainText(d.system_prompt)
        self.theme.setCurrentIndex(self.theme.findData(d.theme))
        self.font_size.setValue(d.font_size)
        self.api_enabled.setChecked(d.api_enabled)
        self.api_port.setValue(d.api_port)
        self.api_key.setText(d.api_key)
        self.api_origins.setText(d.api_origins)

    def result_settings(self) -> AppSettings:
        from desktop.servers import servers_to_json

        remote = self._picked()
        return AppSettings(
            model_path=self.model_path.text().strip(),
            remote_server=remote[0] if remote else "",
            remote_model=remote[1] if remote else "",
            servers=servers_to_json(self.servers),
            device=self.device.currentData(),
            precision=self.precision.currentData(),
            context_length=self.context.value(),
            kv_cache=self.kv_cache.currentData(),
            max_parallel=self.parallel.value(),
            vote_chains=self.vote.value(),
            temperature=round(self.temperature.value(), 3),
            top_p=round(self.top_p.value(), 3),
            top_k=self.top_k.value(),
            max_new_tokens=self.max_new.value(),
            system_prompt=self.system_prompt.toPlainText(),
            theme=self.theme.currentData(),
            font_size=self.font_size.value(),
            api_enabled=self.api_enabled.isChecked(),
            api_port=self.api_port.value(),
            api_key=self.api_key.text().strip(),
            api_origins=self.api_origins.text().strip(),
        )
