"""The engine (model_loader.engine) on the tiny model: close() frees the model at once, without collecting garbage on
its thread; an error inside a reply (out of GPU memory) is reported and leaves the engine usable. Replies
themselves: test_decode_loop.py."""

import threading

import pytest

from model_loader.events import SamplingSettings


def run(engine, **settings):
    """One reply to a fixed question; its Finished event."""
    messages = [{"role": "user", "content": "Tell me a story about a robot."}]
    return list(engine.generate(messages, SamplingSettings(**settings)))[-1]


def test_close_frees_the_model(tiny_model):
    from model_loader.engine import Engine

    engine = Engine.load(tiny_model, device="cpu", context_length=64)
    run(engine, temperature=0, max_new_tokens=2)
    engine.close()
    assert not engine.ready and engine.model.k_cache is None and engine.model.w["layers"] == []


def test_close_frees_the_tensors_at_once_and_collects_no_garbage_on_its_thread(tiny_model):
    """The window turns automatic garbage collection off and collects on the GUI thread only
    (desktop/gcguard.py). The engine thread closes an engine whose warm-up failed (out of memory, the window
    closed): a collection there would finalize the GUI's garbage on that thread. close() frees the tensors by
    dropping its references (none sits in a cycle: their weak references die at once) and collects nothing."""
    import gc
    import weakref

    from model_loader.engine import Engine

    engine = Engine.load(tiny_model, device="cpu", context_length=64)
    run(engine, temperature=0, max_new_tokens=2)
    held = [weakref.ref(t) for t in (engine.model.k_cache, engine.model.v_cache, *engine.model.w["layers"][0].values())]
    finalized = []

    class Garbage:
        def __init__(self):
            self.me = self  # a cycle: only a collection frees it

        def __del__(self):
            finalized.append(threading.current_thread().name)

    was_enabled = gc.isenabled()  # off where desktop tests ran before in this worker: it must stay off
    gc.disable()
    try:
        Garbage()
        closer = threading.Thread(target=engine.close, name="engine-thread")
        closer.start()
        closer.join()
        assert finalized == [] and all(ref() is None for ref in held)
    finally:
        if was_enabled:
            gc.enable()
        gc.collect()
    assert finalized == [threading.current_thread().name]


def test_out_of_gpu_memory_while_generating_is_reported_and_the_engine_stays_usable(cpu_engine, monkeypatch):
    import torch

    from model_loader.errors import OutOfMemoryError

    real = cpu_engine.model.prefill

    def exhausted(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(cpu_engine.model, "prefill", exhausted)
    with pytest.raises(OutOfMemoryError, match="out of GPU memory while generating; try a shorter context"):
        run(cpu_engine, temperature=0, max_new_tokens=3)
    monkeypatch.setattr(cpu_engine.model, "prefill", real)
    final = run(cpu_engine, temperature=0, max_new_tokens=3)
    assert final.stats.completion_tokens == 3 and final.stats.prefix_reused_tokens == 0
