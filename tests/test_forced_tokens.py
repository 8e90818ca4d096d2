"""Stop-thinking through the decode steps already queued (model_loader.forced_tokens): the commit that ends each
decode step, in its Triton kernel and its torch form, and the engine's replies with the close tag forced."""

import pytest
import torch

from model_loader.chat import STOP_THINKING_TEXT
from model_loader.decode_loop import QUEUED_STEPS
from model_loader.engine import Engine
from model_loader.events import Delta, Finished, GenerationControl, SamplingSettings
from model_loader.forced_tokens import CAPACITY, RING, ClosePush, ForcedTokens, commit_reference
from model_loader.kernels import small_ops  # noqa: F401  (triton is a test dependency)

CLOSE = 151649
FORCED = [198, CLOSE, 271]

# (queued, taken, closed, close id, sampled) -> (committed token, taken, closed)
CASES = {
    "nothing queued: the sample": ((0, 0, 0, CLOSE, 5), (5, 0, 0)),
    "the first forced token": ((3, 0, 0, CLOSE, 5), (198, 1, 0)),
    "the next forced token": ((3, 1, 0, CLOSE, 5), (CLOSE, 2, 0)),
    "all taken: samples again": ((3, 3, 0, CLOSE, 5), (5, 3, 0)),
    "the model closed first: its tag, forcing off": ((3, 0, 0, CLOSE, CLOSE), (CLOSE, 0, 1)),
    "the model's tag after forcing began: forced": ((3, 1, 0, CLOSE, CLOSE), (CLOSE, 2, 0)),
    "closed earlier: never forced": ((3, 0, 1, CLOSE, 7), (7, 0, 1)),
    "a close tag before anything is queued also turns it off": ((0, 0, 0, CLOSE, CLOSE), (CLOSE, 0, 1)),
    "no close id (-1): never closes": ((3, 0, 0, -1, CLOSE), (198, 1, 0)),
}


def _run(impl, device, state, sampled):
    queued, taken, closed, close_id = state
    st = torch.tensor([taken, closed, close_id], dtype=torch.int32, device=device)
    queue = torch.zeros(1 + CAPACITY, dtype=torch.int64)
    queue[0], queue[1:4] = queued, torch.tensor(FORCED)
    ring = torch.full((RING,), -1, dtype=torch.int64)
    if impl == "triton":  # the host's queue, read by the kernel across the bus on a GPU; the ring written so
        queue = queue.pin_memory() if device == "cuda" else queue
        ring = ring.pin_memory() if device == "cuda" else ring

        def commit(*args):
            small_ops.commit_token(*args, ring)
    else:
        queue, commit = queue.to(device), commit_reference
    token = torch.zeros(1, dtype=torch.int64, device=device)
    pos = torch.tensor([RING + 41], dtype=torch.int32, device=device)
    commit(torch.tensor([sampled], device=device), token, pos, st, queue)
    if device == "cuda":
        torch.cuda.synchronize()
    assert int(pos) == RING + 42
    if impl == "triton":  # the committed token at its position modulo the ring's size, nothing else written
        assert ring[41] == token.cpu()[0] and (ring == -1).sum() == RING - 1
    assert int(queue[0]) == queued and int(st[2]) == close_id  # the host's queue and the close id are only read
    return int(token), int(st[0]), int(st[1])


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_commit_takes_the_forced_tokens_unless_the_model_closed_first(device, case, impl):
    (queued, taken, closed, close_id, sampled), expected = CASES[case]
    assert _run(impl, device, (queued, taken, closed, close_id), sampled) == expected


@pytest.mark.parametrize("use_triton", [True, False])
def test_a_push_lands_for_the_next_commits_and_reset_clears_it(device, use_triton):
    queue = ForcedTokens(torch.device(device), CLOSE, use_triton=use_triton)
    token = torch.zeros(1, dtype=torch.int64, device=device)
    pos = torch.zeros(1, dtype=torch.int32, device=device)
    sampled = torch.tensor([9], device=device)
    committed = []
    for step in range(6):
        if step == 1:
            queue.push(FORCED)
        queue.commit(sampled, token, pos)
        committed.append(int(token))
        if queue.reads_ring:  # what the engine reads back instead of copying the token
            if device == "cuda":
                torch.cuda.synchronize()
            assert queue.committed(step) == committed[-1]
    assert committed == [9, *FORCED, 9, 9] and int(pos) == 6 and queue.taken() == 3
    queue.reset()
    queue.commit(sampled, token, pos)
    assert int(token) == 9 and queue.state.tolist() == [0, 0, CLOSE] and int(queue.queue[0]) == 0
    with pytest.raises(ValueError, match="between 1 and 16"):
        queue.push(list(range(CAPACITY + 1)))


def _stopped_reply(engine, prompt_ids, after: int, max_new: int):
    """A greedy reply from inside the reasoning, asked to stop thinking once `after` tokens came back; returns
    (Finished, tokens received when asked)."""
    control = GenerationControl()
    asked = None
    final = None
    for ev in engine.generate_ids(
        prompt_ids, SamplingSettings(temperature=0, max_new_tokens=max_new, ignore_eos=True), control, in_reasoning=True
    ):
        if isinstance(ev, Delta) and asked is None and ev.token_count >= after:
            control.stop_thinking()
            asked = ev.token_count
        elif isinstance(ev, Finished):
            final = ev
    return final, asked


@pytest.fixture(scope="module")
def device_engine(tiny_model, device):
    # fp32 on a GPU: the prefix-reuse comparison below needs no 16-bit rounding differences between paths
    engine = Engine.load(tiny_model, device=device, context_length=512, dtype="fp32" if device == "cuda" else None)
    engine.warm_up()
    yield engine
    engine.close()


def test_stop_thinking_forces_the_close_tag_into_the_queued_steps(device_engine):
    engine = device_engine
    tag = engine.chat.encode_plain(STOP_THINKING_TEXT)
    prompt = engine.chat.render([{"role": "user", "content": "Think it through."}]).ids
    final, asked = _stopped_reply(engine, prompt, after=6, max_new=40)
    ids = final.token_ids
    starts = [i for i in range(len(ids)) if ids[i : i + len(tag)] == tag]
    assert len(starts) == 1, (ids, tag)
    # Only the steps already queued when it was asked write more reasoning; then the tag, then the answer.
    assert asked <= starts[0] <= asked + QUEUED_STEPS - 1, (asked, starts)
    assert final.stats.stopped_thinking and final.answer and "</think>" not in final.answer
    assert final.stats.completion_tokens == 40
    assert final.stats.reasoning_tokens == starts[0] + 2  # "\n" and the tag itself count as reasoning


def test_the_cache_after_a_stopped_reply_holds_exactly_its_tokens(device_engine):
    # The K/V the forced steps wrote must be those of the tokens the reply reports: a continuation that reuses
    # them gives the same tokens as one that prefills everything afresh.
    engine = device_engine
    prompt = engine.chat.render([{"role": "user", "content": "Count the ways."}]).ids
    final, _ = _stopped_reply(engine, prompt, after=3, max_new=24)
    more = prompt + final.token_ids + engine.chat.encode_plain(" And then?")
    settings = SamplingSettings(temperature=0, max_new_tokens=12, ignore_eos=True)
    events = list(engine.generate_ids(more, settings))
    reused, cont = events[0].prefix_reused_tokens, events[-1]
    assert reused >= len(prompt) + len(final.token_ids) - 1
    engine.reset_cache()
    fresh = list(engine.generate_ids(more, settings))[-1]
    assert fresh.token_ids == cont.token_ids


def test_a_request_runs_the_registered_action_on_the_asking_thread_and_only_once(device):
    import threading

    queue = ForcedTokens(torch.device(device), CLOSE, use_triton=False)
    push = ClosePush(queue, FORCED)
    control = GenerationControl()
    control.stop_thinking()  # before the engine registers: left for its decode loop
    assert control.take_stop_thinking() and not push.pushed
    control.act_on_stop_thinking(push)
    asker = threading.Thread(target=lambda: (control.stop_thinking(), control.stop_thinking()))
    asker.start()
    asker.join()
    assert push.pushed and not control.take_stop_thinking()
    assert queue.queue[:4].tolist() == [3, *FORCED]
    queue.reset()
    push()  # pushed already: nothing more
    assert int(queue.queue[0]) == 0
    later = ClosePush(queue, FORCED)
    later.close()  # the reply ended: a late request must not reach the next reply
    later()
    assert not later.pushed and int(queue.queue[0]) == 0


def test_stop_thinking_asked_from_another_thread_mid_reply(device_engine):
    # As the window does: the GUI thread asks while the engine's thread waits on the GPU; the push happens on
    # the asking thread, between the engine's own CUDA calls.
    import threading

    engine = device_engine
    tag = engine.chat.encode_plain(STOP_THINKING_TEXT)
    prompt = engine.chat.render([{"role": "user", "content": "Take your time."}]).ids
    control, go = GenerationControl(), threading.Event()
    asker = threading.Thread(target=lambda: (go.wait(), control.stop_thinking()))
    asker.start()
    final = None
    for ev in engine.generate_ids(
        prompt, SamplingSettings(temperature=0, max_new_tokens=200, ignore_eos=True), control, in_reasoning=True
    ):
        if isinstance(ev, Delta) and ev.token_count >= 8 and not go.is_set():
            go.set()
            asker.join()  # the push runs on the other thread while the steps queued so far keep running
        elif isinstance(ev, Finished):
            final = ev
    asker.join()
    ids = final.token_ids
    starts = [i for i in range(len(ids)) if ids[i : i + len(tag)] == tag]
    assert len(starts) == 1 and starts[0] >= 8, (ids, tag)
    assert final.stats.stopped_thinking and final.answer
    assert final.stats.reasoning_tokens == starts[0] + 2


def test_the_torch_commit_never_reads_a_device_value_on_the_host():
    # On meta tensors any host read (.item(), a tensor used as an index) raises: the fallback must stay as
    # asynchronous as the kernel, or a GPU without Triton would sync every step.
    meta = torch.device("meta")
    commit_reference(
        torch.zeros(1, dtype=torch.int64, device=meta),
        torch.zeros(1, dtype=torch.int64, device=meta),
        torch.zeros(1, dtype=torch.int32, device=meta),
        torch.zeros(3, dtype=torch.int32, device=meta),
        torch.zeros(1 + CAPACITY, dtype=torch.int64, device=meta),
    )


def test_a_reply_closed_early_leaves_no_action_behind(device_engine):
    # The consumer stops reading mid-reasoning (the generator is closed): a later request must not push into
    # whatever reply comes next; it is left as a plain request again.
    engine = device_engine
    prompt = engine.chat.render([{"role": "user", "content": "Go on."}]).ids
    control = GenerationControl()
    reply = engine.generate_ids(
        prompt, SamplingSettings(temperature=0, max_new_tokens=64, ignore_eos=True), control, in_reasoning=True
    )
    assert any(isinstance(ev, Delta) for ev in reply)  # reads up to the first delta
    reply.close()
    control.stop_thinking()
    assert control.take_stop_thinking() and int(engine.step.forced.queue[0]) == 0
    final = [
        ev
        for ev in engine.generate_ids(
            prompt, SamplingSettings(temperature=0, max_new_tokens=12, ignore_eos=True), in_reasoning=True
        )
    ][-1]
    assert not final.stats.stopped_thinking and "</think>" not in final.text


def test_the_replies_tokens_come_back_through_the_commit_kernels_ring(tiny_model, device, monkeypatch):
    """With Triton (its interpreter on a CPU machine) the host reads each step's token from the ring the commit
    kernel writes, not from a copy after each step: the same tokens either way, stop-thinking's forced ones
    included, and the reply's cache reused after it."""
    from model_loader import forced_tokens

    engine = Engine.load(tiny_model, device=device, use_triton=True, dtype="fp32", context_length=256)
    assert engine.step.forced.reads_ring
    prompt = engine.chat.render([{"role": "user", "content": "Think it through."}]).ids
    greedy = SamplingSettings(temperature=0, max_new_tokens=3 * QUEUED_STEPS, ignore_eos=True)

    def reply(ring: bool) -> list[int]:
        monkeypatch.setattr(forced_tokens, "HOST_RING", ring)
        engine.reset_cache()
        return [ev for ev in engine.generate_ids(prompt, greedy) if isinstance(ev, Finished)][0].token_ids

    through_ring = reply(True)
    assert through_ring == reply(False) and len(through_ring) == 3 * QUEUED_STEPS
    monkeypatch.setattr(forced_tokens, "HOST_RING", True)
    final, asked = _stopped_reply(engine, prompt, after=2, max_new=2 * QUEUED_STEPS + 4)
    tag = engine.chat.encode_plain(STOP_THINKING_TEXT)
    assert any(final.token_ids[i : i + len(tag)] == tag for i in range(len(final.token_ids)))
    engine.close()


def test_stop_thinking_after_the_model_closed_its_reasoning_in_several_tokens_leaves_the_answer(
    tiny_model, monkeypatch
):
    """The model may spell its close tag as ordinary tokens ("</", "think", ">"), which the GPU's commit does
    not know as the close: a Stop thinking asked once the answer had begun pushed the tag into the answer and
    flagged the reply as stopped. Once the reasoning has closed, however it was written, the request is over."""
    import model_loader.decode_graphs as decode_graphs
    import model_loader.decode_loop as loop_module

    engine = Engine.load(tiny_model, device="cpu", context_length=512)
    engine.warm_up()
    vocab, enc = engine.tokenizer.get_vocab(), engine.chat.encode_plain
    script = (
        enc("Okay, let me see.\n")
        + [vocab["</"], vocab["think"], vocab[">"]]
        + enc("\n\nThe answer is 4. It is four because two plus two.")
    )
    step = iter(range(10**6))

    def scripted(logits):  # the model writes exactly this, token by token
        return torch.tensor([script[min(next(step), len(script) - 1)]], dtype=torch.int64)

    monkeypatch.setattr(loop_module, "greedy", scripted)  # the first token (after the prefill)
    monkeypatch.setattr(decode_graphs, "greedy", scripted)  # the decode steps
    control, final, asked = GenerationControl(), None, False
    settings = SamplingSettings(temperature=0, max_new_tokens=len(script), ignore_eos=True)
    for ev in engine.generate([{"role": "user", "content": "2+2?"}], settings, control):
        if isinstance(ev, Delta) and ev.kind == "answer" and not asked:
            asked = True
            control.stop_thinking()  # the button, pressed as the answer starts to show
        elif isinstance(ev, Finished):
            final = ev
    assert asked and final.answer == "The answer is 4. It is four because two plus two."
    assert not final.stats.stopped_thinking and final.reasoning.strip() == "Okay, let me see."
    engine.close()
