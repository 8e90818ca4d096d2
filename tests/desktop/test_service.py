"""The engine service: one owner of the worker, a FIFO of requests from several clients, each request's events
routed to it alone, cancel of waiting and running requests, a bounded queue, and reloads."""

from __future__ import annotations

import fakes
import pytest

from desktop.service import EngineService, NotReady, QueueFull
from desktop.worker import LoadRequest


@pytest.fixture
def service(qtbot):
    engine = fakes.FakeEngine(token_s=0.0005)
    svc = EngineService(engine_factory=fakes.factory(engine), max_waiting=3)
    yield svc, engine
    svc.shutdown(3000)


def _ready(qtbot, svc):
    with qtbot.waitSignal(svc.ready, timeout=10000):
        svc.load(LoadRequest("/models/fake", "cpu", 4096, None))


class Recorder:
    def __init__(self, req):
        self.events = []
        req.queued.connect(lambda n: self.events.append(("queued", n)))
        req.started.connect(lambda s: self.events.append(("started",)))
        req.delta.connect(lambda text, kind, n: self.events.append(("delta", text)))
        req.finished.connect(lambda r: self.events.append(("finished", r)))
        req.failed.connect(lambda kind, msg: self.events.append(("failed", kind)))

    @property
    def done(self):
        return any(e[0] in ("finished", "failed") for e in self.events)

    def text(self):
        return "".join(e[1] for e in self.events if e[0] == "delta")


def test_requests_run_one_at_a_time_in_order_each_with_its_own_events(qtbot, service):
    svc, engine = service
    with pytest.raises(NotReady):
        svc.submit([{"role": "user", "content": "too early"}], {})
    _ready(qtbot, svc)
    order = []
    svc.request_started.connect(lambda req: order.append(req.id))
    reqs = [
        svc.submit([{"role": "user", "content": f"q{i}"}], {"max_new_tokens": 30 + i}, client=c)
        for i, c in enumerate(["chat", "api", "api"])
    ]
    recs = [Recorder(r) for r in reqs]
    assert [len(svc.ahead_of(r)) for r in reqs] == [0, 1, 2]
    qtbot.waitUntil(lambda: all(r.done for r in recs), timeout=20000)
    assert order == [r.id for r in reqs]
    assert [m[0]["content"] for m in engine.prompts] == ["q0", "q1", "q2"]
    for i, rec in enumerate(recs):
        result = rec.events[-1][1]
        assert rec.events[-1][0] == "finished" and result.stats.completion_tokens == 30 + i
        assert rec.text() == result.text.replace("</think>\n\n", "")  # its own deltas, nobody else's
        assert ("started",) in rec.events
    # connected after submit (2 ahead then): told once that it moved up, not again while its place held
    assert [e for e in recs[2].events if e[0] == "queued"] == [("queued", 1)]
    assert svc.running is None and not svc.waiting


def test_clients_get_the_engines_typed_events_across_the_worker_thread(qtbot, service):
    """The engine's own dataclasses cross the worker thread: a request's started and finished carry Started and
    Finished (its token ids left behind), and the service's request_first and request_ended the same Started and
    its GenerationStats, so clients read fields by name (a misspelt one fails, never reads as None). A request
    that fails before it finishes ends with None."""
    import threading

    from model_loader.errors import ModelError
    from model_loader.events import Finished, GenerationStats, MemoryStats, Started

    svc, engine = service
    _ready(qtbot, svc)
    first, ended = [], []
    svc.request_first.connect(lambda req, started: first.append((req, started)))
    svc.request_ended.connect(lambda req, stats: ended.append((req, stats, threading.get_ident())))
    req = svc.submit([{"role": "user", "content": "typed"}], {"max_new_tokens": 12})
    started = []
    req.started.connect(started.append)
    with qtbot.waitSignal(req.finished, timeout=10000) as done:
        pass
    result = done.args[0]
    assert isinstance(result, Finished) and result.token_ids == []  # the fake engine sent 12 ids
    stats = result.stats
    assert isinstance(stats, GenerationStats) and isinstance(stats.memory, MemoryStats)
    assert (stats.completion_tokens, stats.finish_reason) == (12, "max_new_tokens")
    assert len(ended) == 1 and ended[0][0] is req and ended[0][1] is stats is req.stats  # one object, no copies
    assert ended[0][2] == threading.get_ident()  # delivered on the service's thread
    assert len(started) == 1 and isinstance(started[0], Started) and first == [(req, started[0])]
    assert started[0].prompt_tokens == stats.prompt_tokens and started[0].context_length == 4096
    assert svc.last["ttft_ms"] == stats.ttft_ms and svc.last["finish_reason"] == "max_new_tokens"

    engine.fail_generate = ModelError("the prompt could not be read")
    failed = svc.submit([{"role": "user", "content": "fails"}], {})
    with qtbot.waitSignal(failed.failed, timeout=10000) as why:
        pass
    assert why.args == ["generate", "the prompt could not be read"]
    assert ended[-1][:2] == (failed, None) and failed.stats is None


def test_cancel_waiting_and_running_requests_and_the_queue_limit(qtbot, service):
    svc, engine = service
    _ready(qtbot, svc)
    engine.token_s = 0.002
    running = svc.submit([{"role": "user", "content": "long"}], {})
    waiting = [svc.submit([{"role": "user", "content": f"w{i}"}], {}) for i in range(3)]
    with pytest.raises(QueueFull):
        svc.submit([{"role": "user", "content": "one too many"}], {})
    rec_run, rec_w = Recorder(running), Recorder(waiting[1])
    waiting[1].cancel()
    assert rec_w.events == [("failed", "cancelled")] and waiting[1] not in svc.waiting
    qtbot.waitUntil(lambda: any(e[0] == "delta" for e in rec_run.events), timeout=10000)
    running.cancel()
    qtbot.waitUntil(lambda: rec_run.done, timeout=10000)
    assert rec_run.events[-1][1].stats.finish_reason == "cancelled"
    qtbot.waitUntil(lambda: svc.running is None and not svc.waiting, timeout=20000)
    assert [m[0]["content"] for m in engine.prompts] == ["long", "w0", "w2"]  # the cancelled one never ran


def test_a_reload_drops_waiting_requests_and_lets_the_running_one_finish(qtbot, service):
    svc, engine = service
    _ready(qtbot, svc)
    engine.token_s = 0.002
    running, waiting = (svc.submit([{"role": "user", "content": c}], {}) for c in ("a", "b"))
    rec_run, rec_wait = Recorder(running), Recorder(waiting)
    qtbot.waitUntil(lambda: any(e[0] == "delta" for e in rec_run.events), timeout=10000)
    with qtbot.waitSignal(svc.ready, timeout=20000):
        svc.load(LoadRequest("/models/fake", "cpu", 4096, None))
    assert rec_wait.events == [("failed", "unloaded")]
    assert rec_run.events[-1][0] == "finished" and rec_run.events[-1][1].stats.finish_reason == "eos"
    assert svc.state == "ready"


def test_ended_requests_are_not_kept_by_the_service(qtbot, service):
    """A request that finished, failed or was dropped before it started (cancelled here; a reload's drop takes
    the same path) belongs to its client alone: the service kept each as a Qt child (the API's prompts of up to
    4 MiB and its event queues with it), one more per request for as long as the app ran."""
    import gc
    import weakref

    from desktop.service import GenerationRequest

    svc, engine = service
    _ready(qtbot, svc)
    reqs = [svc.submit([{"role": "user", "content": "x" * 100_000}], {"max_new_tokens": 5}) for _ in range(3)]
    recs = [Recorder(r) for r in reqs]
    reqs[2].cancel()  # still waiting: dropped at once
    qtbot.waitUntil(lambda recs=recs: all(r.done for r in recs), timeout=20000)  # (recs is deleted below)
    assert [r.events[-1][0] for r in recs] == ["finished", "finished", "failed"]
    assert svc.findChildren(GenerationRequest) == []
    gone = [weakref.ref(r) for r in reqs]
    del reqs, recs
    gc.collect()
    assert all(ref() is None for ref in gone)  # nothing else held them
    rec = Recorder(svc.submit([{"role": "user", "content": "still works"}], {"max_new_tokens": 3}))
    qtbot.waitUntil(lambda: rec.done, timeout=20000)
    assert rec.events[-1][0] == "finished"


@pytest.mark.parametrize("first_ends", ["aborted at its next step", "ready all the same", "failed all the same"])
def test_a_load_asked_for_while_another_runs_is_the_only_one_that_counts(wait_cross_thread, qtbot, first_ends):
    """Settings changed while a model loads queue a second load behind the first. The first is told to stop;
    whether it stops, or ends ready or failed anyway (past its last step), the service stays "loading" and says
    nothing until the second ends: its Ready would let a message be sent that then waits through the second
    load (or fails when that one does), and the window would take the first model's settings as current."""
    import threading

    import fakes

    first, second = fakes.FakeEngine(), fakes.FakeEngine()
    first.info.model_name, second.info.model_name = "first", "second"
    gates = {"/models/first": threading.Event(), "/models/second": threading.Event()}

    def make(request, progress, on_compiling=None):
        gates[request.spec].wait(30)  # the test lets each load go on
        if request.spec == "/models/first":
            if first_ends == "aborted at its next step":
                progress(1, 2)  # where the abort is seen
            elif first_ends == "failed all the same":
                raise fakes.OutOfMemoryError("the first model did not fit")
            return first
        return second

    svc = EngineService(engine_factory=make)
    try:
        readies, failures = [], []
        svc.ready.connect(lambda info: readies.append(info["model_name"]))
        svc.load_failed.connect(lambda kind, msg: failures.append(kind))
        svc.load(LoadRequest("/models/first", "cpu", 4096, None))
        svc.load(LoadRequest("/models/second", "cpu", 4096, "bf16"))
        worker = svc.host.worker
        with wait_cross_thread(worker.ready if first_ends == "ready all the same" else worker.failed, timeout=10000):
            gates["/models/first"].set()
        # the service's slots ran first (connected first): the first load's end changed nothing
        assert svc.state == "loading" and readies == [] and failures == []
        with pytest.raises(NotReady):
            svc.submit([{"role": "user", "content": "too early"}], {})
        with qtbot.waitSignal(svc.ready, timeout=10000):
            gates["/models/second"].set()
        assert readies == ["second"] and failures == [] and svc.state == "ready" and svc.model_name == "second"
        rec = Recorder(svc.submit([{"role": "user", "content": "hi"}], {"max_new_tokens": 3}))
        qtbot.waitUntil(lambda: rec.done, timeout=10000)
        assert rec.events[-1][0] == "finished" and second.prompts and not first.prompts
    finally:
        for gate in gates.values():
            gate.set()
        svc.shutdown(3000)
