"""The live panel: where the time and the memory go, for this reply and for the session.

It is refreshed by its own timer a few times a second (never per token). While a reply streams, the numbers
come from what the GUI receives: the engine's Started event (prompt size, prefix reused, context length: known
as soon as the prompt is prefilled) and each delta's token count with its arrival time (a delta can carry
several tokens: one that ends mid-character yields no text of its own, so deltas are never counted as tokens).
What a new token reads from GPU memory comes from the engine's info (weight bytes, cache bytes a token) and
the context so far, its rate from those bytes times tokens/s. When the reply finishes, the engine's exact
GenerationStats replace them. VRAM is split into weights / KV cache /
other torch / free from the engine's MemoryStats (torch counters + NVML); GPU utilization and free memory are
polled from NVML here (pynvml, no torch) about once a second.
"""

from __future__ import annotations

import dataclasses
import html
import math
import time
from collections import deque

from PySide6.QtCore import QRectF, Qt, QTimer
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QFrame, QGridLayout, QLabel, QListWidget, QScrollArea, QSizePolicy, QVBoxLayout, QWidget

from desktop.gpu_monitor import NO_GPU_LIVE, GpuMonitor
from desktop.live_figures import (
    LiveReply,
    gib,
    kernel_choices_text,
    memory_read,
    slow_kernels_notice,
    ttft_breakdown,
)
from model_loader.events import GenerationStats, Started  # plain dataclasses: no torch
from model_loader.gpu_clocks import GpuClocks, steady  # pure Python, like the next
from model_loader.stats import (  # pure Python: importing it does not import torch
    decode_context,
    percentile,
    thinking_seconds,
)


class Sparkline(QWidget):
    """A tiny line (or bar) plot; painted from a list of numbers, scaled to its own maximum."""

    def __init__(self, title: str, unit: str, bars: bool = False):
        super().__init__()
        self.title, self.unit, self.bars = title, unit, bars
        self.values: list[float] = []
        self.color = QColor("#2f6fde")
        self.text_color = QColor("#59636e")
        self.grid_color = QColor("#d8dde3")
        self.setMinimumHeight(70)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.setAccessibleName(title)

    def set_values(self, values: list[float]) -> None:
        self.values = [v for v in values if v is not None and not math.isnan(v)][-120:]
        self.setAccessibleDescription(f"latest {self.values[-1]:.0f} {self.unit}" if self.values else "no data")
        self.update()

    def paintEvent(self, _event):
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        r = self.rect().adjusted(1, 16, -1, -2)
        p.setPen(self.text_color)
        f = p.font()
        f.setPointSizeF(max(7.0, f.pointSizeF() - 2))
        p.setFont(f)
        latest = f"{self.values[-1]:.0f} {self.unit}" if self.values else "—"
        p.drawText(QRectF(0, 0, self.width(), 14), Qt.AlignLeft | Qt.AlignVCenter, self.title)
        p.drawText(QRectF(0, 0, self.width(), 14), Qt.AlignRight | Qt.AlignVCenter, latest)
        p.setPen(QPen(self.grid_color, 1))
        p.drawLine(r.bottomLeft(), r.bottomRight())
        if not self.values:
            return
        top = max(self.values) * 1.1 or 1.0
        n = len(self.values)
        if self.bars:
            w = r.width() / max(n, 8)
            for i, v in enumerate(self.values):
                h = r.height() * v / top
                p.fillRect(QRectF(r.left() + i * w + 1, r.bottom() - h, max(1.0, w - 2), h), self.color)
            return
        path = QPainterPath()
        for i, v in enumerate(self.values):
            x = r.left() + (r.width() * i / (n - 1) if n > 1 else r.width())
            y = r.bottom() - r.height() * v / top
            path.moveTo(x, y) if i == 0 else path.lineTo(x, y)
        p.setPen(QPen(self.color, 1.6))
        p.drawPath(path)


class MemoryBar(QWidget):
    """One stacked bar: weights / KV cache / other torch / other processes / free."""

    def __init__(self):
        super().__init__()
        self.parts: list[tuple[str, float, QColor]] = []
        self.setMinimumHeight(14)
        self.setMaximumHeight(14)
        self.setAccessibleName("GPU memory")

    def set_parts(self, parts: list[tuple[str, float, QColor]]) -> None:
        self.parts = parts
        self.setAccessibleDescription(", ".join(f"{n} {gib(v)}" for n, v, _ in parts))
        self.update()

    def paintEvent(self, _event):
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        total = sum(v for _, v, _ in self.parts) or 1.0
        r = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        clip = QPainterPath()
        clip.addRoundedRect(r, 4, 4)
        p.setClipPath(clip)
        x = r.left()
        for _, v, color in self.parts:
            w = r.width() * v / total
            p.fillRect(QRectF(x, r.top(), w, r.height()), color)
            x += w


_UNSET = object()


class LivePanel(QScrollArea):
    LOG_LINES = 50
    ROWS = [
        (
            "reply",
            "This reply",
            [
                ("ttft", "First token"),
                ("tfat", "First answer token"),
                ("split", "Thinking / answering"),
                ("tokens", "Tokens think + answer"),
                ("rate", "Decode tok/s"),
                ("read", "Read a token"),
                ("read_rate", "Read rate"),
            ],
        ),
        ("session", "Session", [("ttft_p", "TTFT P50 / P95"), ("rate_p", "tok/s P50 / P95"), ("replies", "Replies")]),
        ("context", "Context", [("ctx", "Used / available"), ("reused", "Prefix reused")]),
        (
            "batch",
            "Replies at once",
            [("running", "Running / waiting"), ("all_rate", "tok/s, all replies"), ("blocks", "KV blocks used")],
        ),
        (
            "memory",
            "GPU",
            [
                ("weights", "Weights"),
                ("kv", "KV cache"),
                ("other", "Other torch"),
                ("free", "Free"),
                ("util", "GPU busy"),
                ("clock", "SM clock"),
                ("slowed", "Slowed by"),
            ],
        ),
    ]

    def __init__(self, theme, parent=None):
        super().__init__(parent)
        self.setObjectName("LivePanel")
        self.setAccessibleName("Live panel")
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        # Room for the vertical scroll bar too: when the panel's content is taller than the window the bar takes
        # its width from the content, which must not then be clipped on the right.
        bar = self.verticalScrollBar().sizeHint().width()
        self.setMinimumWidth(290 + bar)
        self.setMaximumWidth(360 + bar)
        inner = QWidget()
        inner.setObjectName("LivePanel")
        lay = QVBoxLayout(inner)
        lay.setContentsMargins(16, 12, 16, 12)
        lay.setSpacing(4)
        title = QLabel("Live")
        title.setObjectName("Role")
        lay.addWidget(title)
        self.values: dict[str, QLabel] = {}
        self.keys: dict[str, QLabel] = {}
        self.section_heads: dict[str, QLabel] = {}
        for key, section, rows in self.ROWS:
            head = QLabel(section)
            head.setProperty("role", "section")
            lay.addWidget(head)
            self.section_heads[key] = head
            grid = QGridLayout()
            grid.setHorizontalSpacing(10)
            grid.setVerticalSpacing(3)
            for i, (name, label) in enumerate(rows):
                k = QLabel(label)
                k.setProperty("role", "key")
                k.setMinimumWidth(k.sizeHint().width())
                v = QLabel("—")
                v.setProperty("role", "value")
                v.setAlignment(Qt.AlignRight | Qt.AlignVCenter)
                v.setAccessibleName(label)
                v.setTextInteractionFlags(Qt.TextSelectableByMouse)
                grid.addWidget(k, i, 0)
                grid.addWidget(v, i, 1)
                self.values[name] = v
                self.keys[name] = k
            lay.addLayout(grid)
            if key == "memory":
                self.device_label = QLabel("No model loaded")
                self.device_label.setProperty("role", "key")
                self.device_label.setWordWrap(True)
                self.device_label.setAccessibleName("Device")
                lay.insertWidget(lay.count() - 1, self.device_label)
                self.kernels_notice = QLabel()  # shown where the GPU runs without r1desk's kernels
                self.kernels_notice.setProperty("role", "notice")
                self.kernels_notice.setWordWrap(True)
                self.kernels_notice.setTextInteractionFlags(Qt.TextSelectableByMouse)
                self.kernels_notice.hide()
                lay.insertWidget(lay.count() - 1, self.kernels_notice)
                self.membar = MemoryBar()
                lay.insertWidget(lay.count() - 1, self.membar)
                self.legend = QLabel()
                self.legend.setProperty("role", "key")
                self.legend.setTextFormat(Qt.RichText)
                self.legend.setWordWrap(True)
                lay.insertWidget(lay.count() - 1, self.legend)
        for label in (self.keys["slowed"], self.values["slowed"]):  # shown while something slows the GPU down
            label.hide()
        self.values["all_rate"].setToolTip("Tokens per second of every reply being written, together")
        self.values["blocks"].setToolTip(
            "The paged KV cache: blocks of tokens held by the replies being written "
            "(free blocks may still hold a cached prefix, reused when its text "
            "comes back)"
        )
        self._show_batch(False)  # shown when the engine writes several replies at once
        self.log_head = QLabel("API requests")
        self.log_head.setProperty("role", "section")
        self.log = QListWidget()
        self.log.setAccessibleName("API request log")
        self.log.setToolTip(
            "Requests the local API server answered: time, tokens, time to first token, decode speed, client"
        )
        self.log.setFixedHeight(96)
        self.log.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.log.setWordWrap(True)
        # Long lines wrap inside the panel's width instead of widening the panel (which would clip its values).
        self.log.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Fixed)
        self.log_head.hide()
        self.log.hide()
        lay.addWidget(self.log_head)
        lay.addWidget(self.log)
        self.rate_plot = Sparkline("tok/s across this reply", "tok/s")
        self.latency_plot = Sparkline("TTFT per reply", "ms", bars=True)
        lay.addSpacing(10)
        lay.addWidget(self.rate_plot)
        lay.addSpacing(6)
        lay.addWidget(self.latency_plot)
        lay.addStretch(1)
        self.setWidget(inner)

        self.reply: LiveReply | None = None  # the reply the panel shows: the newest request's
        self.replies: dict[int, LiveReply] = {}  # every request in flight, by request id
        self.all_tokens: deque[tuple[float, int]] = deque()  # (time, tokens) any reply made, over the last second
        self.service = None
        self.session_ttft: list[float] = []
        self.session_rate: list[float] = []
        self.info: dict | None = None
        self.memory: dict | None = None
        self.server_figures: dict | None = None  # a remote model's server load (show_server)
        self.gpu = GpuMonitor()
        self._gpu_live = NO_GPU_LIVE
        self._raw_clocks: GpuClocks | None = None  # the last poll's, before steady()
        self._clocks_shown: object = _UNSET  # the GpuClocks (or None) the clock row shows
        self._ticks = 0
        self.timer = QTimer(self)
        self.timer.setInterval(250)  # 4 Hz: live enough to read, far cheaper than per token
        self.timer.timeout.connect(self.refresh)
        self.timer.start()
        self.set_theme(theme)

    def set_theme(self, theme) -> None:
        self.theme = theme
        self._clocks_shown = _UNSET  # its colour is the theme's
        for plot, color in ((self.rate_plot, theme.plot_a), (self.latency_plot, theme.plot_b)):
            plot.color, plot.text_color, plot.grid_color = QColor(color), QColor(theme.muted), QColor(theme.border)
            plot.update()
        self.refresh()

    def _show_clocks(self, clocks: GpuClocks | None) -> None:
        """The SM clock row, and under it what holds the clock down (a power cap, heat) in the danger colour
        while something does, with the reason in the tooltips. Restyled only when the reading changes (a style
        sheet is not free)."""
        if clocks == self._clocks_shown:
            return
        self._clocks_shown = clocks
        row, why = self.values["clock"], self.values["slowed"]
        slowed = clocks is not None and bool(clocks.slowdowns)
        row.setText(clocks.text() if clocks is not None else "—")
        tip = clocks.explanation() if clocks is not None else ""
        for label in (row, why, self.keys["clock"], self.keys["slowed"]):
            label.setToolTip(tip)
        why.setText(clocks.reason() if slowed else "")
        style = f"color: {self.theme.danger};" if slowed else ""
        row.setStyleSheet(style)
        why.setStyleSheet(style)
        why.setVisible(slowed)
        self.keys["slowed"].setVisible(slowed)

    # ---- inputs
    def attach(self, service) -> None:
        """Count every request the engine runs, whoever asked (the chat, the local API). With several replies at
        once each has its own timings; "This reply" shows the newest."""
        self.service = service
        service.request_started.connect(self._on_request_started)
        service.request_first.connect(self._on_request_first)
        service.request_progress.connect(self._on_request_progress)
        service.request_ended.connect(self._on_request_ended)

    def _on_request_started(self, req) -> None:
        self.replies[req.id] = self.start_reply()

    def _on_request_first(self, req, started: Started) -> None:
        reply = self.replies.get(req.id)
        if reply is not None:
            reply.on_started(started)
            if reply is self.reply:
                self.refresh()  # show context use now, not at the next tick

    def _on_request_progress(self, req, kind: str, token_count: int) -> None:
        reply = self.replies.get(req.id)
        if reply is not None:
            before = reply.count
            reply.on_delta(kind, token_count)
            self.all_tokens.append((time.monotonic(), reply.count - before))

    def _on_request_ended(self, req, stats: GenerationStats | None) -> None:
        reply = self.replies.pop(req.id, None)
        if reply is not None:
            self.finish_reply(stats, reply)
        if req.client == "api":
            self.log_request(req.label, stats)

    def log_request(self, client: str, stats: GenerationStats | None) -> None:
        """One line per API request, newest first (the last LOG_LINES)."""
        when = time.strftime("%H:%M:%S")
        if stats is not None:
            line = (
                f"{when} · {stats.completion_tokens} tok · TTFT {stats.ttft_ms:.0f} ms · "
                f"{stats.decode_tok_s:.0f} tok/s · {client}"
            )
        else:
            line = f"{when} · failed · {client}"
        self.log.insertItem(0, line)
        while self.log.count() > self.LOG_LINES:
            self.log.takeItem(self.log.count() - 1)
        self.log_head.show()
        self.log.show()

    def clear_engine(self) -> None:
        """No model loaded (a load under way or failed: the worker dropped the last one first)."""
        self.server_figures = None
        self.info = None
        self.memory = None
        self.device_label.setText("No model loaded")
        self.device_label.setToolTip("")
        self.kernels_notice.hide()
        for key in ("weights", "kv", "other"):
            self.values[key].setText("—")
        self.refresh()

    def set_engine(self, info: dict) -> None:
        self.server_figures = None  # a server's figures come from its watch, after this
        self.info = info
        self.memory = info.get("memory")
        notice = slow_kernels_notice(info)
        self.kernels_notice.setText(notice or "")
        self.kernels_notice.setVisible(notice is not None)
        if info.get("device") == "remote":  # its memory and GPU are the server's: nothing here measures them
            for key in ("weights", "kv", "other", "free", "util"):
                self.values[key].setText("on the server")
            self.membar.set_parts([])
            self.legend.setText("")
        self.gpu.select(info.get("gpu_uuid"))
        self._gpu_live = NO_GPU_LIVE  # a previous GPU's figures are not this one's
        self._raw_clocks = None
        self.refresh()

    def start_reply(self) -> LiveReply:
        self.reply = LiveReply()
        return self.reply

    def finish_reply(self, stats: GenerationStats | None, reply: LiveReply | None = None) -> None:
        """A reply ended (stats None: it failed); `reply`: which one (default: the one shown)."""
        reply = reply or self.reply
        if reply is None:
            return
        reply.done_stats = stats
        reply.failed = stats is None
        if stats is not None:
            self.session_ttft.append(stats.ttft_ms)
            if stats.decode_tok_s:
                self.session_rate.append(stats.decode_tok_s)
            if stats.memory is not None:  # kept in the form the engine's info brings it in (set_engine): a dict
                self.memory = dataclasses.asdict(stats.memory)
            lat = stats.token_latencies_ms
            if lat:  # tok/s over windows of 16 tokens: the shape of the reply's speed
                w = 16
                reply.rate_series = [
                    1000.0 * len(lat[i : i + w]) / max(sum(lat[i : i + w]), 1e-6) for i in range(0, len(lat), w)
                ]
        self.refresh()

    # ---- painting
    def refresh(self) -> None:
        if not self.isVisible():
            return
        self._ticks += 1
        v = self.values
        r = self.reply
        if r is not None:
            s = r.done_stats
            if s is not None:
                v["ttft"].setText(f"{s.ttft_ms:.0f} ms")
                v["ttft"].setToolTip(ttft_breakdown(s))
                v["tfat"].setText(f"{s.first_answer_ms:.0f} ms" if s.first_answer_ms is not None else "—")
                think = thinking_seconds(s)
                answer = s.total_s - think - s.ttft_ms / 1000
                v["split"].setText(f"{think:.1f} s / {max(answer, 0):.1f} s")
                v["tokens"].setText(f"{s.reasoning_tokens} + {s.completion_tokens - s.reasoning_tokens}")
                v["rate"].setText(f"{s.decode_tok_s:.0f} avg")
                self._show_read(*memory_read(s.decode_read_bytes, s.decode_cache_read_bytes, s.decode_tok_s))
                used, ctx = s.prompt_tokens + s.completion_tokens, s.context_length
                # a server's context is not known (the OpenAI API doesn't say): the tokens used alone
                v["ctx"].setText(f"{used:,} / {ctx:,} ({100 * used / ctx:.0f}%)" if ctx else f"{used:,}")
                v["reused"].setText(f"{s.prefix_reused_tokens:,} of {s.prompt_tokens:,}")
            elif r.failed:  # frozen where it stopped: no clock runs on for a reply that ended in an error
                if not r.first_t:
                    v["ttft"].setText("failed")
            else:
                now = time.monotonic()
                read = ("—", "—", "")
                v["ttft"].setText(f"{(r.first_t - r.start) * 1000:.0f} ms" if r.first_t else "waiting…")
                v["tfat"].setText(f"{(r.first_answer_t - r.start) * 1000:.0f} ms" if r.first_answer_t else "—")
                if r.first_t:
                    think_end = r.first_answer_t or now
                    answering = now - r.first_answer_t if r.first_answer_t else 0.0
                    v["split"].setText(f"{think_end - r.first_t:.1f} s / {answering:.1f} s")
                v["tokens"].setText(f"{r.reasoning_n} + {r.answer_n}")
                rate = r.rate_now()
                v["rate"].setText(f"{rate:.0f}")
                if r.first_t:
                    r.rate_series.append(rate)
                if r.started is not None:
                    st = r.started
                    used, ctx = st.prompt_tokens + r.count, st.context_length
                    v["ctx"].setText(f"{used:,} / {ctx:,} ({100 * used / ctx:.0f}%)" if ctx else f"{used:,}")
                    v["reused"].setText(f"{st.prefix_reused_tokens:,} of {st.prompt_tokens:,}")
                    context = decode_context(st.prompt_tokens, r.count)  # the steps so far, on average
                    if self.info and self.info.get("decode_weight_bytes") and context:
                        cache = self.info["kv_bytes_per_token"] * context
                        read = memory_read(self.info["decode_weight_bytes"] + cache, cache, rate)
                self._show_read(*read)
            self.rate_plot.set_values(r.rate_series)
        p50, p95 = percentile(self.session_ttft, 50), percentile(self.session_ttft, 95)
        v["ttft_p"].setText(f"{p50:.0f} / {p95:.0f} ms" if self.session_ttft else "—")
        q50, q95 = percentile(self.session_rate, 50), percentile(self.session_rate, 95)
        v["rate_p"].setText(f"{q50:.0f} / {q95:.0f}" if self.session_rate else "—")
        v["replies"].setText(str(len(self.session_ttft)))
        self.latency_plot.set_values(self.session_ttft)
        self._refresh_batch()
        self._refresh_memory()

    def _show_batch(self, shown: bool) -> None:
        self.section_heads["batch"].setVisible(shown)
        for name in ("running", "all_rate", "blocks"):
            self.keys[name].setVisible(shown)
            self.values[name].setVisible(shown)

    def show_server(self, figures: dict | None) -> None:
        """A remote model's server load (desktop.server_watch): shown in place of Replies at once."""
        self.server_figures = figures
        self._refresh_batch()

    def _refresh_server(self) -> None:
        f = self.server_figures
        self._show_batch(f is not None)
        if f is None:
            return
        self.section_heads["batch"].setText("Server")
        self.keys["all_rate"].hide()  # the server's other replies' speed: not in its metrics
        self.values["all_rate"].hide()
        self.keys["blocks"].setText("KV cache used")
        v = self.values
        slots = f" of {f['slots']}" if f.get("slots") else ""
        v["running"].setText(f"{f['running']}{slots} / {f['waiting']}")
        usage = f.get("kv_cache_usage")
        v["blocks"].setText(f"{100 * usage:.0f}%" if usage is not None else "—")
        v["blocks"].setToolTip("The server's KV cache in use (its /metrics)")

    def _refresh_batch(self) -> None:
        """Replies at once: how many run and wait, their tokens per second together, the KV blocks they hold
        (the worker's scheduler: plain counts, read on this thread). For a remote model: the server's."""
        if self.info and self.info.get("device") == "remote":
            self._refresh_server()
            return
        self.section_heads["batch"].setText("Replies at once")
        self.keys["blocks"].setText("KV blocks used")
        self.values["blocks"].setToolTip("")
        service = self.service
        parallel = service.parallel if service is not None else 1
        self._show_batch(parallel > 1)
        if parallel <= 1:
            return
        v, now = self.values, time.monotonic()
        while self.all_tokens and now - self.all_tokens[0][0] > 1.0:
            self.all_tokens.popleft()
        v["running"].setText(f"{len(service.active)} of {parallel} / {len(service.waiting)}")
        v["all_rate"].setText(f"{sum(n for _, n in self.all_tokens):,.0f}" if service.active else "—")
        scheduler = getattr(service.host.worker, "scheduler", None)
        if scheduler is not None:
            snap = scheduler.snapshot()
            total = snap["kv_blocks_used"] + snap["kv_blocks_free"]
            v["blocks"].setText(
                f"{snap['kv_blocks_used']:,} / {total:,} ({100 * snap['kv_blocks_used'] / total:.0f}%)"
                if total
                else "—"
            )

    def _show_read(self, read: str, rate: str, tip: str) -> None:
        for key, text in (("read", read), ("read_rate", rate)):
            self.values[key].setText(text)
            self.values[key].setToolTip(tip)

    def _refresh_memory(self) -> None:
        v, m, t = self.values, self.memory, self.theme
        if self.info and self.info.get("device") == "remote":
            i = self.info
            self.device_label.setText(f"{i.get('model_name', '?')} · {i.get('device_name', '')}")
            self.device_label.setToolTip(
                f"A model on {i.get('server', 'a server')}: the times and rates here are measured by r1desk as the "
                "reply arrives; its memory, GPU and kernels are the server's."
            )
            return
        if self.info:
            i = self.info
            quant = f" · 4-bit {i['quantization']}" if i.get("quantization") else ""  # which AWQ path runs
            ctx = i.get("context_length")
            context = f" · context {'Auto: ' if i.get('context_auto') else ''}{ctx:,}" if ctx else ""
            if i.get("kv_cache") == "8-bit":
                context += " (8-bit KV cache)"
            self.device_label.setText(
                f"{i.get('device_name', '?')} · {i.get('dtype', '')}{quant} · "
                f"{i.get('kernels', '')}{' + CUDA graphs' if i.get('cuda_graphs') else ''}"
                f"{context}"
            )
            # unwrapped lines: Qt wraps a plain-text tooltip at its own width, mid-entry
            self.device_label.setToolTip(f"<p style='white-space:pre'>{html.escape(kernel_choices_text(i))}</p>")
        if not m:
            return
        weights, kv = m.get("weights_bytes", 0), m.get("kv_cache_bytes", 0)
        other = max(0, m.get("torch_reserved_bytes", 0) - weights - kv)
        v["weights"].setText(gib(weights))
        v["kv"].setText(gib(kv))
        v["other"].setText(gib(other))
        on_gpu = str(m.get("device", "")).startswith("cuda")
        if on_gpu and self._ticks % 4 == 1:
            live = self.gpu.poll()
            # a slowdown shows once two polls in a row report it (NVML flags some for a moment)
            self._gpu_live = live._replace(clocks=steady(live.clocks, self._raw_clocks))
            self._raw_clocks = live.clocks
        util, free, total, clocks = self._gpu_live
        free = free if free is not None else m.get("device_free_bytes", 0)
        total = total if total is not None else m.get("device_total_bytes", 0)
        util = util if util is not None else m.get("gpu_utilization_pct")
        v["util"].setText(f"{util} %" if util is not None else "—")
        self._show_clocks(clocks)
        if on_gpu and total:
            v["free"].setText(f"{free / 2**30:.2f} / {total / 2**30:.1f} GiB")
            outside = max(0, total - free - weights - kv - other)  # other processes, CUDA context
            parts = [
                ("Weights", weights, QColor(t.plot_a)),
                ("KV cache", kv, QColor(t.plot_b)),
                ("Other torch", other, QColor("#8e6cd8")),
                ("Other", outside, QColor(t.faint)),
                ("Free", free, QColor(t.border)),
            ]
        else:
            v["free"].setText("— (CPU)")
            parts = [
                ("Weights", weights, QColor(t.plot_a)),
                ("KV cache", kv, QColor(t.plot_b)),
                ("Other torch", other, QColor("#8e6cd8")),
            ]
        self.membar.set_parts(parts)
        self.legend.setText("&nbsp;&nbsp;".join(f'<span style="color:{c.name()}">■</span> {n}' for n, _, c in parts))
