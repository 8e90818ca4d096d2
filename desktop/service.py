"""The engine's one owner: loads the model and runs generation requests from any client.

Every client that wants tokens (the chat view, the local API server) asks this service: `submit()` queues a
GenerationRequest (FIFO), the service hands waiting requests to the worker while fewer than `max_parallel` run,
and routes the worker's events for each back to that request's own signals. No client touches the worker. With
max_parallel 1 the engine decodes one reply at a time (but the samples of one prompt, Ask ×N's chains, together);
above 1 the worker's scheduler decodes that many together (continuous batching: model_loader.scheduler), each with
its own settings, cancel and events. Lives on the GUI
thread (or the headless server's main thread); QtCore only, no widgets, so `r1desk-cli serve` runs the same code
without a window.

Why a queue here rather than the worker's own event queue: a queued-up worker call can't be cancelled or
counted. Requests that wait here can be (a client that disconnects, "waiting for 1 API request").

The prefix cache stays correct when clients interleave: the engine compares each prompt's token ids with what
its KV cache holds and reuses only the common prefix, whoever wrote it (the scheduler: the common full blocks).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import deque

from PySide6.QtCore import QObject, Qt, Signal

from desktop.worker import EngineHost, LoadRequest
from model_loader.events import (  # plain dataclasses + threading: no torch
    Finished,
    GenerationControl,
    GenerationStats,
    Started,
    TokenLogprobs,
)

DEFAULT_MAX_WAITING = 16


class QueueFull(Exception):
    """submit() when `max_waiting` requests are already waiting."""


class NotReady(Exception):
    """submit() before a model is loaded (or while one is loading)."""


class GenerationRequest(QObject):
    """One client's generation: its events, its cancel. Signals are emitted on the service's thread."""

    queued = Signal(int)  # requests ahead of this one (sent when the number changes while it waits)
    started = Signal(object)  # model_loader.events.Started
    delta = Signal(str, str, int)  # text, "reasoning" | "answer", tokens so far in this reply
    finished = Signal(object)  # model_loader.events.Finished (token_ids empty)
    logprobs = Signal(object)  # a token's log-probabilities: model_loader.events.TokenLogprobs
    failed = Signal(str, str)  # kind (the worker's kinds, or "cancelled" before it started, "unloaded"), message

    def __init__(
        self, service: "EngineService", messages: list[dict], settings: dict, client: str, control, label: str = ""
    ):
        super().__init__(service)
        self.service = service
        self.id = next(_ids)
        self.messages = messages
        self.settings = settings
        self.client = client  # "chat" | "api"
        self.label = label  # who asked, for the request log ("127.0.0.1 · openai-python")
        self.control = control
        self.state = "waiting"  # waiting | running | done
        self.submitted_t = time.monotonic()
        self.started_t: float | None = None  # when the worker took it
        self.stats: GenerationStats | None = None  # once it has finished
        self.ahead = -1  # requests ahead of it, as last announced

    def cancel(self) -> None:
        """Waiting: dropped at once (failed "cancelled"). Running: the engine stops before its next token and
        the request finishes with finish_reason "cancelled" (what it wrote so far is kept)."""
        self.service._cancel(self)

    def stop_thinking(self) -> None:
        self.control.stop_thinking()


_ids = itertools.count(1)


def _release(req: GenerationRequest) -> None:
    """An ended request no longer belongs to the service: as its Qt child it (its messages, up to 4 MiB from
    the API, and whatever its signals' slots hold) would live as long as the service, one more per request. Its
    clients' own references still keep it while they need it."""
    req.setParent(None)


class EngineService(QObject):
    """Owner of the engine worker; see the module docstring."""

    stage = Signal(str)  # "importing", "loading", "compiling", "warming", "preparing": see EngineWorker.stage
    progress = Signal(object, object)  # bytes done, bytes total
    warmup_progress = Signal(int, int, str)  # step, steps, what
    ready = Signal(object)  # the worker's info dict
    load_failed = Signal(str, str)  # kind, message
    queue_changed = Signal()  # a request was queued, started or ended
    request_started = Signal(object)  # GenerationRequest, when the worker takes it (any client: the live panel)
    request_progress = Signal(object, str, int)  # request, kind, tokens so far
    request_first = Signal(object, object)  # request, model_loader.events.Started
    # request, model_loader.events.GenerationStats (None when it failed before finishing)
    request_ended = Signal(object, object)
    quantize_progress = Signal(int, int, str)
    quantized = Signal(str)
    quantize_failed = Signal(str, str)

    def __init__(
        self,
        parent=None,
        engine_factory=None,
        max_waiting: int = DEFAULT_MAX_WAITING,
        max_parallel: int = 1,
        max_tokens_cap: int | None = None,
    ):
        """max_parallel: replies decoded together (the load asks the worker for a scheduler above 1; 0: as many
        as the free GPU memory holds, Engine.parallel_that_fits);
        max_tokens_cap: the most new tokens any request may ask for (none: up to the context), so no client
        holds a slot for ever."""
        super().__init__(parent)
        self.max_waiting = max_waiting
        self.max_parallel = max_parallel
        self.max_tokens_cap = max_tokens_cap
        # none | loading | warming | ready | failed: the one record of where the engine is (the window and the API
        # read it here)
        self.state = "none"
        self.info: dict | None = None
        self.waiting: deque[GenerationRequest] = deque()
        self.active: dict[int, GenerationRequest] = {}  # generation id -> request the worker has, oldest first
        self.last: dict | None = None  # the last request's end: client, finish_reason, tokens (GET /health)
        # Loads asked for and not yet ended (ready or failed): the worker runs them in order, so only the last
        # one's end counts; the ones before it ended superseded (settings changed while a model loaded).
        self._loads_pending = 0
        self.host = EngineHost(self)
        self.host.worker.engine_factory = engine_factory
        w, q = self.host.worker, Qt.QueuedConnection  # explicit: these slots run on this (the service's) thread
        w.stage.connect(self._on_stage, q)
        w.progress.connect(self.progress, q)
        w.warmup_progress.connect(self.warmup_progress, q)
        w.ready.connect(self._on_ready, q)
        w.started.connect(self._on_started, q)
        w.delta.connect(self._on_delta, q)
        w.finished.connect(self._on_finished, q)
        w.logprobs.connect(self._on_logprobs, q)
        w.failed.connect(self._on_failed, q)
        w.quantize_progress.connect(self.quantize_progress, q)
        w.quantized.connect(self.quantized, q)
        w.quantize_failed.connect(self.quantize_failed, q)

    # ------------------------------------------------------------------ model
    @property
    def running(self) -> GenerationRequest | None:
        """The oldest request the worker has (None when idle)."""
        return next(iter(self.active.values()), None)

    @property
    def model_name(self) -> str | None:
        return (self.info or {}).get("model_name")

    def load(self, request: LoadRequest) -> None:
        """Load (or reload) a model (request.remote: one on a server). A reply already decoding one at a time
        finishes first (the worker is serial); replies decoding together end "unloaded" (the worker can't finish
        them before the load); requests still waiting fail with "unloaded": they were asked of the model being
        replaced."""
        self.state = "loading"
        self.info = None
        for req in list(self.waiting):
            self._drop(req, "unloaded", "the model is being reloaded; send the request again when it is ready")
        self._loads_pending += 1  # one under way stops at its next step (EngineHost.load)
        # how many replies at once is the service's to say (a server's model: one at a time, the server batches)
        self.host.load(dataclasses.replace(request, max_parallel=1 if request.remote else self.max_parallel))

    def quantize(self, src: str, out: str, **options) -> None:
        self.host.quantize(src, out, **options)

    def abort_quantize(self) -> None:
        self.host.worker.abort_quantize()  # a thread-safe flag: the worker's queue is busy quantizing

    def shutdown(self, timeout_ms: int = 1500) -> bool:
        """Cancel everything and join the worker thread; True if it stopped within the timeout."""
        for req in list(self.waiting):
            self._drop(req, "cancelled", "the app is closing")
        for req in self.active.values():
            req.control.cancel()
        return self.host.shutdown(timeout_ms)

    def deliver_pending(self) -> None:
        """After shutdown(): run the worker's already-queued events (a cancelled reply's last deltas and its
        Finished) so their clients can save them."""
        from PySide6.QtCore import QCoreApplication

        QCoreApplication.sendPostedEvents(None, 0)
        QCoreApplication.processEvents()

    # ------------------------------------------------------------------ requests
    def submit(
        self,
        messages: list[dict],
        settings: dict,
        client: str = "chat",
        label: str = "",
        control=None,
        samples_of: tuple[str, int] | None = None,
    ) -> GenerationRequest:
        """Queue a generation. Raises NotReady without a loaded model and QueueFull when `max_waiting`
        requests already wait. The request's signals fire on this thread, the first ones after this returns.
        samples_of: (a name, n) for each of n samples of one prompt submitted together: decoded together, all but
        the first reuse the first's prefill."""
        refusal = self.refusal()
        if refusal is not None:
            raise refusal
        if self.max_tokens_cap:
            settings = {
                **settings,
                "max_new_tokens": min(int(settings.get("max_new_tokens") or self.max_tokens_cap), self.max_tokens_cap),
            }
        if samples_of is not None:
            settings = {**settings, "samples_of": samples_of}
        req = GenerationRequest(self, messages, settings, client, control or GenerationControl(), label)
        self.waiting.append(req)
        self.queue_changed.emit()
        self._pump()
        return req

    def refusal(self) -> NotReady | QueueFull | None:
        """Why submit() would refuse a request now (the error it raises), or None: a client can ask before it
        undoes anything for the request (the window's Regenerate deletes the old reply only if not)."""
        if self.state != "ready":
            return NotReady("the model is not loaded yet" if self.state != "failed" else "no model is loaded")
        if len(self.waiting) >= self.max_waiting:
            return QueueFull(f"{len(self.waiting)} requests are already waiting")
        return None

    def ahead_of(self, req: GenerationRequest) -> list[GenerationRequest]:
        """The requests that run before `req` (the ones running first)."""
        if req.state != "waiting":
            return []
        ahead = list(self.active.values())
        for other in self.waiting:
            if other is req:
                break
            ahead.append(other)
        return ahead

    def _pump(self) -> None:
        """Hand waiting requests to the worker while fewer than max_parallel run, and with one at a time, a
        sample of the prompt whose samples are running (Ask ×N's chains) beside them: the worker decodes those
        together (the loaded model's samples_together; EngineWorker._samples_scheduler)."""
        while (
            self.waiting
            and self.state == "ready"
            and (len(self.active) < self.parallel or self._joins_its_samples(self.waiting[0]))
        ):
            req = self.waiting.popleft()
            req.state = "running"
            req.started_t = time.monotonic()
            gen_id = self.host.next_id()
            self.active[gen_id] = req
            # Everything this thread does for the request comes before the worker gets it: once it has it, the
            # engine needs the GIL for the prompt's template, tokens and prefill launches, and Python work here
            # (the live panel, the request log, the queue labels) would hold it back: time to first token.
            self.request_started.emit(req)
            self.queue_changed.emit()
            self._announce_positions()
            self.host.generate(req.messages, req.settings, req.control, gen_id=gen_id)
        self._announce_positions()

    def _joins_its_samples(self, req: GenerationRequest) -> bool:
        group = req.settings.get("samples_of")
        return (
            group is not None
            and bool((self.info or {}).get("samples_together"))
            and any(other.settings.get("samples_of") == group for other in self.active.values())
        )

    @property
    def parallel(self) -> int:
        """Replies the loaded engine decodes together (1 until a load says otherwise)."""
        return int((self.info or {}).get("max_parallel") or 1)

    def _announce_positions(self) -> None:
        ahead = len(self.active)
        for req in list(self.waiting):
            if req.ahead != ahead:
                req.ahead = ahead
                req.queued.emit(ahead)
            ahead += 1

    def _cancel(self, req: GenerationRequest) -> None:
        if req.state == "waiting":
            self._drop(req, "cancelled", "cancelled before it started")
            self._announce_positions()
        elif req.state == "running":
            req.control.cancel()

    def _drop(self, req: GenerationRequest, kind: str, message: str) -> None:
        try:
            self.waiting.remove(req)
        except ValueError:
            return
        req.state = "done"
        self.queue_changed.emit()
        req.failed.emit(kind, message)
        _release(req)

    def _end_running(self, gen_id: int) -> GenerationRequest:
        req = self.active.pop(gen_id)
        req.state = "done"
        return req

    # ------------------------------------------------------------------ worker events
    def _current(self, gen_id: int) -> GenerationRequest | None:
        return self.active.get(gen_id) if gen_id else None

    def _on_stage(self, stage: str) -> None:
        latest = self._loads_pending <= 1  # loads run in order: with more pending, this step is a superseded one's
        self.state = "warming" if latest and stage in ("warming", "preparing") else "loading"
        self.stage.emit(stage)

    def _load_ended(self) -> bool:
        """A load's last event arrived: True if it was the latest load's (else a newer load is on its way)."""
        self._loads_pending = max(0, self._loads_pending - 1)
        return self._loads_pending == 0

    def _on_ready(self, info: dict) -> None:
        if not self._load_ended():  # superseded: its engine is dropped as the next load starts
            return
        self.state = "ready"
        self.info = info
        self.ready.emit(info)
        self._pump()

    def _on_started(self, gen_id: int, started: Started) -> None:
        req = self._current(gen_id)
        if req is not None:
            self.request_first.emit(req, started)
            req.started.emit(started)

    def _on_delta(self, gen_id: int, text: str, kind: str, token_count: int) -> None:
        req = self._current(gen_id)
        if req is not None:
            req.delta.emit(text, kind, token_count)
            self.request_progress.emit(req, kind, token_count)

    def _on_logprobs(self, gen_id: int, scored: TokenLogprobs) -> None:
        req = self._current(gen_id)
        if req is not None:
            req.logprobs.emit(scored)

    def _on_finished(self, gen_id: int, result: Finished) -> None:
        req = self._current(gen_id)
        if req is None:
            return
        self._end_running(gen_id)
        req.stats = stats = result.stats
        self.last = {
            "client": req.client,
            "finish_reason": stats.finish_reason,
            "completion_tokens": stats.completion_tokens,
            "ttft_ms": stats.ttft_ms,
            "decode_tok_s": stats.decode_tok_s,
        }
        self.request_ended.emit(req, req.stats)
        self.queue_changed.emit()
        req.finished.emit(result)
        _release(req)
        self._pump()

    def _on_failed(self, gen_id: int, kind: str, message: str) -> None:
        if gen_id == 0:
            if not self._load_ended() or kind == "aborted":  # superseded, or the app is closing
                return
            self.state = "failed"
            self.load_failed.emit(kind, message)
            for req in list(self.waiting):
                self._drop(req, "unloaded", f"the model could not be loaded: {message}")
            return
        req = self._current(gen_id)
        if req is None:
            return
        self._end_running(gen_id)
        self.last = {"client": req.client, "finish_reason": "error", "error": kind}
        self.request_ended.emit(req, None)
        self.queue_changed.emit()
        req.failed.emit(kind, message)
        _release(req)
        self._pump()
