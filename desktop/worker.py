"""The engine worker: one long-lived QObject on its own QThread that owns model_loader's Engine.

Why a single thread: CUDA graphs are captured per thread, so load, warm-up and every generate run here.
Why only queued signals: the GUI thread owns all widgets and the SQLite connection; the worker owns torch.
The worker imports model_loader (and so torch) lazily inside its slots, on its own thread, so the window is
on screen before the multi-second torch import starts.

Why the thread's event loop is started from Python (EngineThread.run): a plain QThread runs its loop in C++, so
every queued slot call enters Python through PyGILState_Ensure and leaves through PyGILState_Release, which
creates a Python thread state before the call and frees it after. Anything that keeps that thread state between
calls then holds a dangling pointer. pybind11 without its PR #5870 (the one bundled with torch 2.11) does exactly
that: the thread whose thread state first initialises pybind11's internals (here `import torch`, inside the first
load) has it stored in pybind11's thread-local slot, and every later gil_scoped_acquire on that thread (torch
releasing a tensor's Python object, among many) uses the freed thread state: heap corruption ("double free or
corruption", "smallbin double linked list corrupted") at random places in both threads (pybind11 issue #2888,
fixed by PR #5870). Python-level thread-locals were also wiped between jobs. A run() written in Python holds one
thread state for the thread's whole life; queued slot calls then nest inside it. run() also pins that thread
state past its own return, because C++ thread-local destructors (torch's) may still take the GIL through the
stored pointer while the thread exits.

Deltas are coalesced here (DeltaCoalescer): at a fast GPU's rate one queued signal per token costs both threads
GIL time for nothing, since the window paints at most once a frame.

Cancel and stop-thinking do not go through the event queue (the worker is busy in the decode loop and would
never see a queued call): the GUI calls GenerationControl.cancel()/stop_thinking() directly; both are
thread-safe flags the engine checks before every token.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
import traceback
from pathlib import Path

from PySide6.QtCore import QObject, QThread, QTimer, Qt, Signal, Slot

log = logging.getLogger(__name__)

DELTA_INTERVAL_S = 1 / 240  # the worker joins deltas arriving closer than this into one signal


class EngineThread(QThread):
    """The engine's QThread, its event loop run from Python so that one Python thread state lives as long as
    the thread (see the module docstring: pybind11 keeps a pointer to it)."""

    def run(self) -> None:
        _pin_thread_state()
        self.exec()
        if self.on_exit is not None:  # still on this thread, after the loop: end what runs (EngineWorker.drain)
            self.on_exit()

    on_exit = None  # called on the thread once its event loop has stopped


def _pin_thread_state() -> None:
    """Take this thread's GIL state once more without ever giving it back, so Python does not free the thread
    state when run() returns: it outlives the thread's C++ thread-local destructors, which may still use it.
    Costs one thread state (a few KB) per engine thread, freed when the interpreter exits."""
    import ctypes

    ctypes.pythonapi.PyGILState_Ensure.restype = ctypes.c_int
    ctypes.pythonapi.PyGILState_Ensure()


class DeltaCoalescer:
    """Joins consecutive text deltas of one kind so the GUI gets at most one signal per `interval_s`.

    The first delta of a reply goes out at once (time to first token is visible), a change of kind flushes
    (the GUI folds reasoning when the answer starts), and flush() sends whatever is left before Finished or
    an error, so no text is ever held back or lost."""

    def __init__(self, emit, interval_s: float = DELTA_INTERVAL_S, clock=time.monotonic):
        self.emit = emit  # emit(text, kind, token_count)
        self.interval_s = interval_s
        self.clock = clock
        self.parts: list[str] = []
        self.kind: str | None = None
        self.token_count = 0
        self.last = float("-inf")

    def add(self, text: str, kind: str, token_count: int) -> None:
        if self.parts and kind != self.kind:
            self.flush()
        self.parts.append(text)
        self.kind = kind
        self.token_count = token_count
        now = self.clock()
        if now - self.last >= self.interval_s:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        if self.parts:
            text = self.parts[0] if len(self.parts) == 1 else "".join(self.parts)
            self.parts = []
            self.emit(text, self.kind, self.token_count)
            self.last = self.clock() if now is None else now


class LoadAborted(Exception):
    """Raised from the load progress callback when the window closes mid-load."""


class QuantizeCancelled(Exception):
    """Raised from quantize's progress callback: model_loader.quantize stops at the next layer step."""


# What model_loader.quantize writes into its output folder (config.json last): a folder holding only these
# is an unfinished copy and may be removed.
_QUANTIZE_WRITES = {
    "model.safetensors",
    "model.safetensors.partial",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "LICENSE",
}


def _asdict(obj):
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj


@dataclasses.dataclass(frozen=True)
class LoadRequest:
    """What to load: one shape from the window (or `serve`) through the service and the host to the worker."""

    spec: str  # a model folder or a Hugging Face repo id in the local cache
    device: str = "cuda"  # "cuda" (the first GPU that works) | "cuda:N" | "cpu"
    context_length: int | str = 4096  # 0 or "auto": as much as the free memory holds (model_loader.loading)
    dtype: str | None = None  # None: automatic
    kv_cache: str = "16-bit"  # "16-bit" | "8-bit" (model_loader.kv_cache)
    max_parallel: int = 1  # replies decoded together: above 1 through the engine's scheduler; 0: as many as fit
    use_triton: bool | None = None  # None: r1desk's kernels where they work; False: plain PyTorch operations
    remote: dict | None = None  # a model on a server instead (EngineWorker._load_remote)
    seq: int = 0  # EngineHost.load's number: a newer load stops this one


class EngineWorker(QObject):
    """Lives on the engine thread. Every public signal is delivered to the GUI queued."""

    # "importing", "loading", "compiling" (a first start: loading, GPU kernels compiling beside it), "warming",
    # "preparing" (warming that compiles GPU kernels)
    stage = Signal(str)
    progress = Signal(object, object)  # bytes done, bytes total (Python ints: shards exceed 2**31)
    warmup_progress = Signal(int, int, str)  # step, steps, what
    ready = Signal(object)  # dict: EngineInfo fields + "memory"
    # The engine's events go out as they are (typed, the same objects: it keeps none it has yielded, so the GUI
    # thread is their only reader from then on).
    started = Signal(int, object)  # generation id, model_loader.events.Started
    delta = Signal(int, str, str, int)  # generation id, text, "reasoning" | "answer", tokens so far in this reply
    finished = Signal(int, object)  # generation id, model_loader.events.Finished (token_ids emptied: a small payload)
    logprobs = Signal(int, object)  # generation id, model_loader.events.TokenLogprobs (a request that asked for them)
    failed = Signal(int, str, str)  # generation id (0 = load), error kind, one-line message
    quantize_progress = Signal(int, int, str)  # layer index, layers, what ("searching scales", ...)
    quantized = Signal(str)  # the new 4-bit model folder
    quantize_failed = Signal(str, str)  # kind ("cancelled" | "error"), one-line message

    def __init__(self):
        super().__init__()
        self.engine = None
        self.engine_factory = None  # tests/screenshots: callable(request, progress, on_compiling) -> engine-like
        self.delta_interval_s = DELTA_INTERVAL_S  # 0: one signal per engine delta (the stress test's setting)
        self._abort_load = threading.Event()
        # The newest load asked for (EngineHost.load sets it on the GUI thread as it queues one): a load that
        # is not the newest stops at its next step, since the settings it was asked for have changed.
        self.latest_load = 0
        self._abort_quantize = threading.Event()
        self.scheduler = None  # with max_parallel > 1: the engine's scheduler (model_loader.scheduler)
        # With one reply at a time (no scheduler): a scheduler made for the samples of one prompt (Ask ×N's chains)
        # beside the engine's own cache, so they decode together; dropped, with its KV cache, when they have ended.
        self._together = None
        self._together_failed = False  # making one failed (not for memory): samples then take the engine in turn
        self._samples: dict[str, object] = {}  # samples of one prompt: name -> the first's Sequence, while it runs
        self._step_timer: QTimer | None = None  # steps the scheduler while it has work (made on this thread)

    # ------------------------------------------------------------------ load
    @Slot(object)
    def load(self, request: LoadRequest) -> None:
        self._abort_load.clear()
        seq = request.seq

        def stop_here() -> bool:  # the app is closing, or a newer load was asked for
            return self._abort_load.is_set() or (seq and seq != self.latest_load)

        if request.remote:
            self._load_remote(request.remote, stop_here)
            return
        self.stage.emit("importing")
        try:
            from model_loader.engine import Engine  # torch import happens here, off the GUI thread
            from model_loader.errors import GpuMissingError, GpuUnsupportedError, ModelError, OutOfMemoryError
            from model_loader.kernels import kernels_failure
        except Exception as err:  # a broken torch install must not take the window down
            self.failed.emit(0, "import", f"could not import the model engine: {err}")
            return
        self._drop_engine()  # before loading the next
        device = request.device or "cuda"
        if self.engine_factory is None and device.startswith("cuda") and not self._cuda_available():
            self.failed.emit(0, "no_gpu", self._no_gpu_message())
            return
        last = [0.0]

        def on_progress(done: int, total: int) -> None:
            if stop_here():
                raise LoadAborted()
            now = time.monotonic()
            if now - last[0] > 0.05 or done >= total:  # ~20 updates/s is plenty for a progress bar
                last[0] = now
                self.progress.emit(int(done), int(total))

        self.stage.emit("loading")

        def on_compiling() -> None:
            self.stage.emit("compiling")

        def on_warmup(done: int, total: int, what: str) -> None:
            if stop_here():
                raise LoadAborted()
            self.warmup_progress.emit(done, total, what)

        def attempt(request: LoadRequest):
            engine = None
            try:
                if self.engine_factory is not None:
                    engine = self.engine_factory(request, on_progress, on_compiling)
                else:
                    engine = Engine.load(
                        request.spec,
                        device=device,
                        context_length=request.context_length,
                        dtype=request.dtype or None,
                        progress=on_progress,
                        on_compiling=on_compiling,
                        kv_cache=request.kv_cache or "16-bit",
                        use_triton=request.use_triton,
                    )
                # The first start on a machine compiles our GPU kernels (seconds to tens of seconds): say so.
                self.stage.emit("preparing" if getattr(engine, "first_start", False) else "warming")
                engine.warm_up(progress=on_warmup)
                return engine
            except BaseException:
                if engine is not None and hasattr(engine, "close"):  # loaded, then failed to warm up: VRAM back now
                    engine.close()
                raise

        engine, scheduler, failure = None, None, None
        auto = request.max_parallel == 0  # as many as the free memory holds (Engine.parallel_that_fits)
        parallel = 1 if auto else int(request.max_parallel or 1)
        try:
            problem = None
            try:
                engine = attempt(request)
                parallel = engine.parallel_that_fits() if auto else parallel
                scheduler = engine.serve_batched(parallel) if parallel > 1 else None  # the paged kernels start here
            except Exception as err:
                problem = kernels_failure(err)
                if problem is None or request.use_triton is False:
                    raise
                if engine is not None:  # warmed up, then its paged kernels failed: its memory back first
                    engine.close()
                    engine = None
            if engine is None:
                # r1desk's kernels passed their check at load but failed later (a C module the kernel store lacks,
                # with no compiler to build it; a kernel this GPU's compiler rejects): the same model again on
                # plain PyTorch operations (out of the except block: the failed load's frames are gone, and
                # with them its memory), and the live panel says why.
                log.warning("r1desk's kernels failed to start (%s); loading again without them", problem)
                self._free_device_memory()
                engine = attempt(dataclasses.replace(request, use_triton=False))
                engine.info.kernels_note = problem
                parallel = engine.parallel_that_fits() if auto else parallel  # this engine's own memory
                scheduler = engine.serve_batched(parallel) if parallel > 1 else None
        except BaseException as err:
            if engine is not None and hasattr(engine, "close"):  # warmed up, then failed to batch: VRAM back now
                engine.close()
            engine = None
            if isinstance(err, LoadAborted):  # a newer load replaced it, or the app is closing: this load ended
                failure = ("aborted", "the model load was stopped")
            elif isinstance(err, OutOfMemoryError):
                failure = ("oom", str(err))
            elif isinstance(err, GpuMissingError):  # chosen in Settings, gone since (a card out, an eGPU off)
                failure = (
                    "gpu_missing",
                    f"GPU {err.index}, chosen in Settings, is not on this computer now: it has "
                    f"{err.count} NVIDIA GPU{'s' if err.count != 1 else ''} (numbered from 0).",
                )
            elif isinstance(err, GpuUnsupportedError):  # this torch can't use the GPU: offer the CPU, as with none
                failure = ("no_gpu", str(err))
            elif isinstance(err, ModelError):
                failure = ("model", str(err))
            elif isinstance(err, Exception):  # anything else is a bug; say so plainly rather than hang on "Loading"
                traceback.print_exc()
                failure = ("model", f"could not load the model: {type(err).__name__}: {err}")
            else:
                raise  # KeyboardInterrupt, SystemExit
        if failure is not None:
            # Out of the except block: the error is gone, and with its traceback the failed load's frames and the
            # half-loaded weights they held, so their memory goes back to the driver here (inside the block it
            # only went to torch's cache, where other programs can't have it).
            self._free_device_memory()
            self.failed.emit(0, *failure)
            return
        self.engine = engine
        self.scheduler = scheduler
        self._together_failed = False
        info = _asdict(engine.info)
        info["max_parallel"] = parallel
        info["samples_together"] = self._samples_together()
        info["memory"] = _asdict(engine.memory())
        info["variants"] = self._variants(info.get("model_path"))
        info["gpus"] = self._gpus()
        self.ready.emit(info)

    def _drop_engine(self) -> None:
        """The old model goes (replies still decoding on it end now, said why), and with it its VRAM."""
        for scheduler in (self.scheduler, self._together):
            if scheduler is not None:
                scheduler.end_all("unloaded", "the model is being reloaded; send the request again when it is ready")
        self.scheduler = self._together = None
        self.engine = None
        if "torch" in sys.modules:  # a remote model never imports it
            self._free_device_memory()

    def _load_remote(self, remote: dict, stop_here) -> None:
        """remote: url, model, insecure_tls, key_dir (desktop.servers.KeyStore's fallback folder). The key is read
        here, off the GUI thread (a keyring may ask the system). No torch: the model runs on the server."""
        from model_loader.errors import ModelError
        from model_loader.remote import RemoteEngine

        from desktop.servers import KeyStore

        self._drop_engine()
        self.stage.emit("warming")
        try:
            key = remote.get("api_key") or (
                KeyStore(Path(remote["key_dir"])).get(remote["url"]) if remote.get("key_dir") else None
            )
            engine = RemoteEngine(remote["url"], remote["model"], key, verify_tls=not remote.get("insecure_tls"))
            engine.warm_up(progress=lambda done, total, what: self.warmup_progress.emit(done, total, what))
        except ModelError as err:
            self.failed.emit(0, "remote", str(err))
            return
        if stop_here():
            self.failed.emit(0, "aborted", "the model load was stopped")
            return
        self.engine, self.scheduler = engine, None
        info = _asdict(engine.info)
        info.update(max_parallel=1, memory=None, variants=None, gpus=None)
        self.ready.emit(info)

    @staticmethod
    def _gpus() -> list[dict]:
        """This machine's NVIDIA GPUs, for the settings' Device list (torch is imported on this thread; the
        GUI thread never imports it)."""
        try:
            from model_loader.gpu_support import list_gpus

            return list_gpus()
        except Exception:  # a driver that fails to answer: the list offers the automatic choice
            return []

    @staticmethod
    def _variants(model_path) -> dict | None:
        """The same model in the other precision (dense / AWQ), for the settings' Precision list. Scans the
        models folder and the HF cache, so it runs here rather than on the GUI thread."""
        try:
            from model_loader.locate import find_variants

            return {k: str(v) if v else None for k, v in find_variants(model_path).items()}
        except Exception:  # not a local folder (a scripted engine), an unreadable cache: offer no variants
            return None

    def abort_load(self) -> None:
        """Thread-safe: make a load in progress stop at its next progress callback."""
        self._abort_load.set()

    # ------------------------------------------------------------------ quantize
    @Slot(object)
    def quantize(self, request: dict) -> None:
        """request: src (a dense model folder), out (the new folder), group_size. Makes a 4-bit AWQ copy with
        model_loader.quantize (torch, hence this thread), on the GPU when there is one.
        A cancelled or failed run removes what it wrote, so no half-made model is ever listed."""
        import shutil
        from pathlib import Path

        self._abort_quantize.clear()
        out = Path(request["out"])
        if (out / "config.json").is_file():  # made by an earlier run (config.json is written last): reuse it
            self.quantized.emit(str(out))
            return
        if out.is_dir() and all(p.is_file() and p.name in _QUANTIZE_WRITES for p in out.iterdir()):
            shutil.rmtree(out, ignore_errors=True)  # debris of a run that died before writing config.json
        ours = not out.exists()  # never delete a folder someone else made (quantize refuses a non-empty one)
        try:
            from model_loader.errors import ModelError
            from model_loader.quantize import quantize

            chosen = request.get("device") or ""  # the GPU chosen in Settings, if one is
            device = (chosen if chosen.startswith("cuda:") else "cuda") if self._cuda_available() else "cpu"
        except Exception as err:
            self.quantize_failed.emit("error", f"could not import the model engine: {err}")
            return

        def on_progress(index: int, layers: int, what: str) -> None:
            if self._abort_quantize.is_set():
                raise QuantizeCancelled()
            self.quantize_progress.emit(int(index), int(layers), str(what))

        options = {k: request[k] for k in ("group_size", "samples", "seq_len") if request.get(k)}  # not device
        try:
            quantize(request["src"], str(out), device=device, progress=on_progress, **options)
        except QuantizeCancelled:
            if ours:
                shutil.rmtree(out, ignore_errors=True)
            self._free_device_memory()
            self.quantize_failed.emit("cancelled", "Making the 4-bit copy was cancelled.")
            return
        except Exception as err:  # ModelError (one line), out of memory, a full disk...
            if ours:
                shutil.rmtree(out, ignore_errors=True)
            self._free_device_memory()
            if not isinstance(err, ModelError):
                traceback.print_exc()
            self.quantize_failed.emit("error", (str(err).splitlines() or [type(err).__name__])[0])
            return
        self._free_device_memory()
        self.quantized.emit(str(out))

    def abort_quantize(self) -> None:
        """Thread-safe: make a quantize in progress stop at its next progress callback."""
        self._abort_quantize.set()

    # ------------------------------------------------------------------ generate
    @Slot(int, object, object, object)
    def generate(self, gen_id: int, messages: list, settings: dict, control) -> None:
        from model_loader.errors import ContextFullError, ModelError, OutOfMemoryError
        from model_loader.events import Delta, Finished, SamplingSettings, Started, TokenLogprobs

        if self.engine is None:
            self.failed.emit(gen_id, "not_ready", "the model is not loaded yet")
            return
        fields = {f.name for f in dataclasses.fields(SamplingSettings)}
        sampling = SamplingSettings(**{k: v for k, v in settings.items() if k in fields})
        coalescer = DeltaCoalescer(lambda text, kind, n: self.delta.emit(gen_id, text, kind, n), self.delta_interval_s)
        tools = settings.get("tools")  # an API client's tool definitions, for the chat template
        raw = settings.get("raw_prompt")  # a completions request's prompt (text or token ids): no chat template
        cont = bool(settings.get("continue_final"))  # the last message is the reply so far, to continue
        if self.scheduler is not None or (settings.get("samples_of") and self._samples_together()):
            self._submit(gen_id, messages, sampling, control, coalescer, settings.get("samples_of"), tools, raw, cont)
            return
        if raw is not None and not hasattr(self.engine, "generate_ids"):
            self.failed.emit(gen_id, "generate", "a raw prompt (/v1/completions) needs a model on this computer")
            return
        try:
            # the API's prompt options only where given: an engine stand-in (tests, benchmarks) needs none of them
            extra = {k: v for k, v in (("tools", tools), ("continue_final", cont)) if v}
            events = (
                self.engine.generate_ids(self._raw_ids(raw), sampling, control)
                if raw is not None
                else self.engine.generate(messages, sampling, control, **extra)
            )
            for event in events:
                if isinstance(event, Delta):
                    coalescer.add(event.text, event.kind, int(event.token_count))
                elif isinstance(event, TokenLogprobs):
                    self._send_logprobs(gen_id, event, coalescer)
                elif isinstance(event, Started):  # the prompt is prefilled: context use is known before token 1
                    self.started.emit(gen_id, event)
                elif isinstance(event, Finished):
                    coalescer.flush()
                    self.finished.emit(gen_id, dataclasses.replace(event, token_ids=[]))
        except ContextFullError as err:
            coalescer.flush()  # the text written so far reaches the window before the error does
            self.failed.emit(gen_id, "context_full", str(err))
        except OutOfMemoryError as err:
            coalescer.flush()
            self._free_device_memory()
            self.failed.emit(gen_id, "oom", str(err))
        except ModelError as err:
            coalescer.flush()
            self.failed.emit(gen_id, "generate", str(err))
        except Exception as err:
            coalescer.flush()
            traceback.print_exc()
            self.failed.emit(gen_id, "internal", f"generation failed: {type(err).__name__}: {err}")

    def _send_logprobs(self, gen_id: int, event, coalescer: "DeltaCoalescer") -> None:
        """A token's log-probabilities go out after the text before it and ahead of its own: a stream puts
        them in the chunk that carries the token's text."""
        coalescer.flush()
        self.logprobs.emit(gen_id, event)

    # ------------------------------------------------------------------ many replies at once
    def _raw_ids(self, raw) -> list[int]:
        """A raw prompt's ids: given, or its text tokenized as written (control tokens included: the client
        writes the whole prompt, template and all)."""
        return list(raw) if isinstance(raw, list) else self.engine.tokenizer.encode(raw)

    def _submit(
        self,
        gen_id: int,
        messages: list,
        sampling,
        control,
        coalescer: "DeltaCoalescer",
        samples_of: tuple | None = None,
        tools: list | None = None,
        raw=None,
        cont: bool = False,
    ) -> None:
        """Queue a reply on the scheduler (without one, a sample on the scheduler made for its prompt's samples:
        _samples_scheduler); its events become this worker's signals as the steps make them. samples_of: (name, n)
        of n samples of one prompt: those after the first wait for its prefill and reuse it."""
        from model_loader.errors import ContextFullError, ModelError, OutOfMemoryError
        from model_loader.events import Delta, Failed, Finished, Started, TokenLogprobs

        name = samples_of[0] if samples_of is not None else None
        first = self._samples.get(name) if name is not None else None
        seq = None

        def sink(event) -> None:
            if isinstance(event, Delta):
                coalescer.add(event.text, event.kind, int(event.token_count))
                return
            if isinstance(event, Started):
                self.started.emit(gen_id, event)
                return
            if isinstance(event, TokenLogprobs):
                self._send_logprobs(gen_id, event, coalescer)
                return
            coalescer.flush()
            if name is not None and self._samples.get(name) is seq:  # the first sample has ended: the rest reuse
                del self._samples[name]  # its prompt from the prefix cache, if any still comes
            if isinstance(event, Finished):
                self.finished.emit(gen_id, dataclasses.replace(event, token_ids=[]))
            elif isinstance(event, Failed):
                self.failed.emit(gen_id, "generate" if event.kind == "error" else event.kind, event.message)

        try:
            if raw is not None:
                ids, in_reasoning = self._raw_ids(raw), False
            else:
                prompt = self.engine.chat.render(messages, tools, cont)
                ids, in_reasoning = prompt.ids, prompt.starts_in_reasoning
            scheduler = self.scheduler or self._samples_scheduler(samples_of[1], len(ids), sampling)
            seq = scheduler.submit(ids, sampling, control, in_reasoning, sink, after=first)
        except ContextFullError as err:
            self.failed.emit(gen_id, "context_full", str(err))
            return
        except OutOfMemoryError as err:
            self.failed.emit(gen_id, "oom", str(err))
            return
        except ModelError as err:
            self.failed.emit(gen_id, "generate", str(err))
            return
        except Exception as err:  # a bug, or (no scheduler of its own) the paged kernels failing to start here
            traceback.print_exc()
            if self.scheduler is None:
                self._together_failed = True
            self.failed.emit(gen_id, "internal", f"generation failed: {type(err).__name__}: {err}")
            return
        if name is not None and first is None:
            self._samples[name] = seq
        if self._step_timer is None:  # made here, on this thread, which its timeouts run on
            self._step_timer = QTimer()
            self._step_timer.setInterval(0)  # a step per pass of the event loop: queued requests join between
            self._step_timer.timeout.connect(self._step)
        if not self._step_timer.isActive():
            self._step_timer.start()

    def _samples_together(self) -> bool:
        """Whether samples of one prompt decode together here with one reply at a time: a model on this machine
        (not a server's, not a test's stand-in), no scheduler of its own, and none made for samples has failed."""
        return self.scheduler is None and getattr(self.engine, "model", None) is not None and not self._together_failed

    def _samples_scheduler(self, n: int, prompt_tokens: int, sampling):
        """The scheduler for the samples of one prompt, made for the first: up to n sequences of the prompt and
        its new tokens in a paged KV cache beside the engine's own (as many as the free memory holds, the rest
        after: parallel_samples.samples_scheduler), as `r1desk-cli chat --vote` decodes them."""
        import torch

        from model_loader.errors import OutOfMemoryError
        from model_loader.loading import OOM_ADVICE
        from model_loader.parallel_samples import samples_scheduler

        if self._together is None:
            try:
                self._together = samples_scheduler(
                    self.engine, n, prompt_tokens, sampling, kv_cache=self.engine.info.kv_cache
                )
            except torch.cuda.OutOfMemoryError as err:
                self._free_device_memory()
                raise OutOfMemoryError(f"out of GPU memory for the KV cache of {n} samples; {OOM_ADVICE}") from err
        return self._together

    def _step(self) -> None:
        scheduler = self.scheduler or self._together
        if scheduler is None or not scheduler.has_work():
            self._step_timer.stop()
            if scheduler is not None and scheduler is self._together:  # its samples have ended: its memory back
                self._together = None
                self._free_device_memory()
            return
        try:
            scheduler.step()  # a failing step isolates the failing sequence itself (Scheduler._step_failed)
        except Exception as err:  # a bug in the scheduler: end every reply with it rather than loop on it
            traceback.print_exc()
            scheduler.end_all("internal", f"generation failed: {type(err).__name__}: {err}")

    def drain(self) -> None:
        """The thread's loop has stopped (the app is closing): end the replies still decoding as cancelled, with
        what they wrote, so their clients can keep it (EngineService.deliver_pending)."""
        for scheduler in (self.scheduler, self._together):
            if scheduler is not None:
                scheduler.end_all("cancelled")
        if self._step_timer is not None:  # a timer must be stopped and destroyed on its own thread: this one
            self._step_timer.stop()
            self._step_timer = None

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _cuda_available() -> bool:
        import torch

        return torch.cuda.is_available()

    @staticmethod
    def _no_gpu_message() -> str:
        import torch

        if torch.version.cuda is None:
            return "This installation of torch is CPU-only, so the GPU cannot be used."
        return "No usable NVIDIA GPU was found (check the driver)."

    @staticmethod
    def _free_device_memory() -> None:
        # No gc.collect() here: on this thread it could finalize Qt widgets the GUI thread owns (a crash).
        # Dropping our engine reference frees its tensors; empty_cache returns the blocks to the driver.
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except Exception:
            pass


class EngineHost(QObject):
    """GUI-side owner of the worker thread: turns method calls into queued signals and joins on shutdown."""

    _load_requested = Signal(object)
    _generate_requested = Signal(int, object, object, object)
    _quantize_requested = Signal(object)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.thread = EngineThread()
        self.thread.setObjectName("r1desk-engine")
        self.worker = EngineWorker()
        self.worker.moveToThread(self.thread)
        self.thread.on_exit = self.worker.drain
        self._load_requested.connect(self.worker.load, Qt.QueuedConnection)
        self._generate_requested.connect(self.worker.generate, Qt.QueuedConnection)
        self._quantize_requested.connect(self.worker.quantize, Qt.QueuedConnection)
        self.thread.start()
        self._next_id = 0
        self._load_seq = 0

    def load(self, request: LoadRequest) -> None:
        """Queue a load; one still running or waiting stops at its next step (EngineWorker.latest_load)."""
        self._load_seq += 1
        self.worker.latest_load = self._load_seq  # before the request is queued: it must see itself as newest
        self._load_requested.emit(dataclasses.replace(request, seq=self._load_seq))

    def next_id(self) -> int:
        """A new generation id, for a generate() the caller makes right after (its events carry it)."""
        self._next_id += 1
        return self._next_id

    def generate(self, messages: list[dict], settings: dict, control, gen_id: int | None = None) -> int:
        gen_id = self.next_id() if gen_id is None else gen_id
        self._generate_requested.emit(gen_id, messages, settings, control)
        return gen_id

    def quantize(self, src: str, out: str, **options) -> None:
        """options: group_size (128 in the app; tests use 32 for the tiny model), samples, seq_len."""
        self._quantize_requested.emit(dict(src=src, out=out, **options))

    def shutdown(self, timeout_ms: int = 1500) -> bool:
        """Stop the thread's event loop after its current job; True if it finished within the timeout."""
        self.worker.abort_load()
        self.worker.abort_quantize()
        self.thread.quit()
        return self.thread.wait(timeout_ms)
