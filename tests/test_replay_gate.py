"""Decode steps still queued on the GPU skip their work once the host closes the replay gate (model_loader.
replay_gate): a cancel, a stop-thinking or the end of a reply no longer waits for them. On a GPU the queued
work is held deterministically behind a kernel that spins until the test releases it (no timing involved);
without a GPU the gate is unavailable and the steps run as before."""

from contextlib import contextmanager

import torch

from model_loader.engine import Engine
from model_loader.events import Finished, GenerationControl, SamplingSettings
from model_loader.replay_gate import ReplayGate


class Hold:
    """A kernel that keeps the GPU's stream busy until release(): the work queued behind it waits."""

    def __init__(self):
        from model_loader.weights import host_mapped_alias

        self.host = torch.zeros(1, dtype=torch.int16, pin_memory=True)
        self.flag = host_mapped_alias(self.host)
        assert self.flag is not None

    def launch(self):
        import triton
        import triton.language as tl

        @triton.jit
        def _spin(flag_ptr):
            while tl.load(flag_ptr, volatile=True) == 0:
                pass

        _spin[(1,)](self.flag)

    def release(self):
        self.host.fill_(1)


def test_replays_queued_while_the_gate_is_closed_skip_their_work(device):
    gate = ReplayGate(device)
    if device != "cuda":
        assert not gate.available
        with gate.closed():  # nothing to close: a no-op
            pass
        return
    assert gate.available, "conditional graph nodes on mapped host memory should work on this GPU"
    counter = torch.zeros(1, device=device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), gate.body():
        counter.add_(1)
    hold = Hold()
    hold.launch()
    for _ in range(5):
        graph.replay()  # queued behind the hold
    with gate.closed():
        hold.release()
        torch.cuda.current_stream().synchronize()
    assert counter.item() == 0
    graph.replay()
    assert counter.item() == 1  # open again


def _reply(engine, messages, control=None):
    settings = SamplingSettings(temperature=0, max_new_tokens=24, ignore_eos=True)
    events = list(engine.generate(messages, settings, control or GenerationControl()))  # to the end: a generator
    assert isinstance(events[-1], Finished)  # closed early counts as an interrupted reply and drops the cache
    return events[-1]


def test_a_reply_cut_short_while_steps_are_queued_leaves_the_cache_as_it_says(tiny_model, device, monkeypatch):
    """Stop-thinking and cancel requested while decode steps are queued behind a hold: on a GPU those steps
    skip their work, so their K/V are never written; the engine must count only the steps that ran, or the next
    turn would reuse cache entries that aren't there. The next turn must equal the same turn from an empty
    cache. (Without a GPU the same requests come in the same place, and the queued steps run.)"""
    on_gpu = device == "cuda"
    engine = Engine.load(tiny_model, device=device, use_triton=on_gpu, context_length=512)
    engine.warm_up()
    hold = Hold() if on_gpu else None
    planned = {}  # decode position -> what to do just before that step is launched
    run = engine.step.run

    def run_planned(mode, pos):
        action = planned.pop(pos, None)
        if action is not None:
            action()
        run(mode, pos)

    monkeypatch.setattr(engine.step, "run", run_planned)
    if on_gpu:
        assert engine.step.gate is not None and engine.step.gate.available
        closed = engine.step.gate.closed

        @contextmanager
        def closed_then_released():  # the engine closes the gate, then the held steps may go (and skip)
            with closed():
                hold.release()
                yield

        monkeypatch.setattr(engine.step.gate, "closed", closed_then_released)
    question = [{"role": "user", "content": "Why is the sky blue?"}]
    n_prompt = len(engine.chat.render(question).ids)
    for request in ("stop_thinking", "cancel"):
        control = GenerationControl()

        def hold_and_request():  # before the pass's second step: steps 1.. wait behind the hold
            if on_gpu:
                hold.host.fill_(0)
                hold.launch()
            getattr(control, request)()

        planned.clear()
        planned[n_prompt + 1] = hold_and_request
        first = _reply(engine, question, control)
        assert not planned, "the request was never made"
        assert first.stats.finish_reason == ("cancelled" if request == "cancel" else "max_new_tokens")
        assert first.stats.stopped_thinking == (request == "stop_thinking")
        follow_up = question + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "More."}]
        again = _reply(engine, follow_up)
        assert again.stats.prefix_reused_tokens > 0
        engine.reset_cache()
        fresh = _reply(engine, follow_up)
        assert again.token_ids == fresh.token_ids
    engine.close()
