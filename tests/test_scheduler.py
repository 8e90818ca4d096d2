"""Continuous batching (model_loader.scheduler) on the tiny model in fp32 on the CPU: a sequence's text does not
depend on what runs beside it, each sequence has its own cancel, seed, stop-thinking and failure, and memory is
shared and given back."""

import pytest
import torch

from model_loader.events import Failed, Finished, GenerationControl, SamplingSettings, Started
from model_loader.scheduler import Scheduler, SchedulerConfig

GREEDY = SamplingSettings(temperature=0, max_new_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts(engine):
    """Prompts of 9 to ~300 tokens (one over several prefill chunks)."""
    texts = [
        "Hi",
        "What is 2 + 2? Reason step by step.",
        "Tell me a long story about a cat. " * 25,
        "Écris un poème sur la mer 🌊",
        "def fib(n): return n if n < 2 else fib(n - 1) + fib(n - 2) " * 3,
    ]
    return [engine.chat.render([{"role": "user", "content": t}]).ids for t in texts]


class Collect:
    """A sink: every event of one sequence, in order."""

    def __init__(self):
        self.events = []

    def __call__(self, event):
        self.events.append(event)

    @property
    def final(self):
        assert isinstance(self.events[-1], (Finished, Failed)), self.events[-1:]
        return self.events[-1]


def make(engine, blocks=256, **config) -> Scheduler:
    return Scheduler(
        engine.model, engine.chat, blocks, SchedulerConfig(**{"max_seqs": 8, "chunk": 64, "block_size": 16, **config})
    )


def alone(engine, ids, settings=GREEDY) -> Finished:
    scheduler = make(engine, max_seqs=1)
    sink = Collect()
    scheduler.submit(ids, settings, sink=sink)
    scheduler.run_until_idle()
    return sink.final


def test_a_sequence_alone_decodes_what_the_single_sequence_engine_decodes(engine, prompts):
    for ids in prompts[:3]:
        ours = alone(engine, ids)
        theirs = [e for e in engine.generate_ids(ids, GREEDY)][-1]
        assert ours.token_ids == theirs.token_ids
        assert ours.text == theirs.text


def test_batched_equals_alone_with_sequences_joining_and_leaving(engine, prompts):
    """Mixed prompt lengths, different reply lengths (sequences leave mid-batch) and arrivals between steps."""
    expected = [
        alone(engine, ids, SamplingSettings(temperature=0, max_new_tokens=8 + 6 * i, ignore_eos=True))
        for i, ids in enumerate(prompts)
    ]
    scheduler = make(engine, max_seqs=3)  # fewer slots than requests: some wait for others to leave
    sinks = [Collect() for _ in prompts]
    steps = 0
    for i, ids in enumerate(prompts):
        scheduler.submit(ids, SamplingSettings(temperature=0, max_new_tokens=8 + 6 * i, ignore_eos=True), sink=sinks[i])
        for _ in range(3):  # the next one arrives while these decode
            steps += scheduler.step()
    scheduler.run_until_idle()
    assert scheduler.steps < sum(len(e.token_ids) for e in expected), "sequences shared steps"
    for sink, want in zip(sinks, expected):
        assert sink.final.token_ids == want.token_ids
        assert sink.final.text == want.text
    assert scheduler.pool.free_blocks == scheduler.pool.num_blocks


def test_cancelling_one_of_four_leaves_the_others_unchanged(engine, prompts):
    expected = [alone(engine, ids) for ids in prompts[:4]]
    scheduler = make(engine)
    controls = [GenerationControl() for _ in range(4)]
    sinks = [Collect() for _ in range(4)]
    seqs = [
        scheduler.submit(ids, GREEDY, control=control, sink=sink)
        for ids, control, sink in zip(prompts, controls, sinks)
    ]
    while len(seqs[1].output) < 5:
        scheduler.step()
    controls[1].cancel()
    scheduler.run_until_idle()
    assert sinks[1].final.stats.finish_reason == "cancelled"
    assert 5 <= len(sinks[1].final.token_ids) < GREEDY.max_new_tokens
    assert sinks[1].final.token_ids == expected[1].token_ids[: len(sinks[1].final.token_ids)]
    for i in (0, 2, 3):
        assert sinks[i].final.token_ids == expected[i].token_ids
    assert scheduler.pool.free_blocks == scheduler.pool.num_blocks


def test_overlapped_steps_decode_what_steps_one_at_a_time_decode(engine, prompts):
    """The next decode step launched before the host reads the samples (config.overlap): the same texts, ends and
    finish reasons as without it, for greedy and seeded replies of different lengths, one of which ends on a stop
    token that the launched step could not foresee, and a cancel mid-reply."""
    import copy

    greedy = alone(engine, prompts[0], SamplingSettings(temperature=0, max_new_tokens=12)).token_ids
    chat = copy.copy(engine.chat)
    chat.stop_ids = frozenset({greedy[6]})  # prompt 0's reply ends there, by its model's choice
    settings = [
        SamplingSettings(temperature=0, max_new_tokens=30),
        SamplingSettings(temperature=0, max_new_tokens=9, ignore_eos=True),
        SamplingSettings(temperature=0.8, top_p=0.9, max_new_tokens=26, seed=7, ignore_eos=True),
        SamplingSettings(temperature=0.8, top_k=20, max_new_tokens=30, seed=8, ignore_eos=True),
    ]
    outcomes, overlapped = {}, {}
    for overlap in (False, True):
        scheduler = Scheduler(
            engine.model, chat, 256, SchedulerConfig(max_seqs=8, chunk=64, block_size=16, overlap=overlap)
        )
        sinks, controls = [Collect() for _ in settings], [GenerationControl() for _ in settings]
        seqs = [scheduler.submit(ids, s, control=c, sink=k) for ids, s, c, k in zip(prompts, settings, controls, sinks)]
        while len(seqs[3].output) < 15:
            scheduler.step()
        controls[3].cancel()
        scheduler.run_until_idle()
        outcomes[overlap] = [(k.final.token_ids, k.final.text, k.final.stats.finish_reason) for k in sinks]
        overlapped[overlap] = scheduler.overlapped_steps
        assert scheduler.pool.free_blocks == scheduler.pool.num_blocks
    assert outcomes[True] == outcomes[False]
    assert [reason for _, _, reason in outcomes[True]] == ["eos", "max_new_tokens", "max_new_tokens", "cancelled"]
    assert len(outcomes[True][0][0]) == 7
    assert overlapped[False] == 0 and overlapped[True] >= 10


def test_a_waiting_request_cancelled_ends_at_once_while_others_decode_overlapped(engine, prompts):
    scheduler = make(engine, max_seqs=1)  # one decodes, the other waits for its slot
    waiting, control = Collect(), GenerationControl()
    scheduler.submit(prompts[0], SamplingSettings(temperature=0, max_new_tokens=40, ignore_eos=True))
    scheduler.submit(prompts[1], GREEDY, control=control, sink=waiting)
    for _ in range(5):
        scheduler.step()
    assert scheduler.overlapped_steps
    control.cancel()
    for _ in range(2):
        scheduler.step()
    assert waiting.final.stats.finish_reason == "cancelled" and waiting.final.token_ids == []


def overlapped_run(engine, prompts, chat=None, blocks=256):
    """Three seeded replies through an overlapping scheduler: (their token ids, the scheduler)."""
    scheduler = Scheduler(
        engine.model, chat or engine.chat, blocks, SchedulerConfig(max_seqs=8, chunk=64, block_size=16)
    )
    sinks = [Collect() for _ in range(3)]
    for i, sink in enumerate(sinks):
        settings = SamplingSettings(temperature=0.9, top_k=50, max_new_tokens=30, seed=11 + i, ignore_eos=True)
        scheduler.submit(prompts[i], settings, sink=sink)
    scheduler.run_until_idle()
    assert scheduler.pool.free_blocks == scheduler.pool.num_blocks
    return [sink.final.token_ids for sink in sinks], scheduler


def test_a_step_that_fails_to_launch_ahead_keeps_each_seeds_text(engine, prompts, monkeypatch):
    """The sampler raises half-way through a launched-ahead step (after one sequence's draw): the step runs again
    unoverlapped from the same random streams."""
    import model_loader.scheduler as scheduler_module

    want, _ = overlapped_run(engine, prompts)
    real_sample, real_launch = scheduler_module.sort_sample, Scheduler._launch_next
    calls = {"ahead": False, "n": 0}

    def launch(self, launched):
        calls["ahead"] = True
        try:
            return real_launch(self, launched)
        finally:
            calls["ahead"] = False

    def flaky(logits, params, generator):
        calls["n"] += calls["ahead"]
        if calls["ahead"] and calls["n"] == 20:
            raise torch.cuda.OutOfMemoryError("out of memory")
        return real_sample(logits, params, generator)

    monkeypatch.setattr(Scheduler, "_launch_next", launch)
    monkeypatch.setattr(scheduler_module, "sort_sample", flaky)
    got, scheduler = overlapped_run(engine, prompts)
    assert calls["n"] > 20 and scheduler.overlapped_steps
    assert got == want


def test_a_failed_read_of_a_launched_step_leaves_out_a_sequence_that_ended(engine, prompts, monkeypatch):
    """The device error surfaces when the host reads a launched step whose batch holds a sequence that ended on a
    stop token meanwhile: the step is the other one's alone (which fails, as a sequence whose step fails alone
    does), and the scheduler drains with every block free."""
    import copy

    import model_loader.scheduler as scheduler_module

    greedy = alone(engine, prompts[0], SamplingSettings(temperature=0, max_new_tokens=12)).token_ids
    chat = copy.copy(engine.chat)
    chat.stop_ids = frozenset({greedy[6]})
    scheduler = Scheduler(engine.model, chat, 64, SchedulerConfig(max_seqs=8, chunk=64, block_size=16))
    sinks = [Collect(), Collect()]
    scheduler.submit(prompts[0], SamplingSettings(temperature=0, max_new_tokens=30), sink=sinks[0])
    scheduler.submit(prompts[1], GREEDY, sink=sinks[1])
    real_read = scheduler_module.LaunchedStep.read
    fired = []

    def read(self):
        if not fired and any(seq.status == "finished" for seq, _ in self.batch):
            fired.append(True)
            raise RuntimeError("a device error")
        return real_read(self)

    monkeypatch.setattr(scheduler_module.LaunchedStep, "read", read)
    for _ in range(300):
        if not scheduler.has_work():
            break
        scheduler.step()
    assert fired and not scheduler.has_work()
    assert sinks[0].final.stats.finish_reason == "eos"
    assert isinstance(sinks[1].final, Failed) and "a device error" in sinks[1].final.message
    assert scheduler.pool.free_blocks == scheduler.pool.num_blocks


def test_a_seed_gives_the_same_text_alone_or_batched(engine, prompts):
    settings = [
        SamplingSettings(temperature=0.9, top_p=0.9, top_k=50, max_new_tokens=20, seed=s, ignore_eos=True)
        for s in (1, 2, 3)
    ]
    expected = [alone(engine, prompts[1], s) for s in settings]
    assert len({tuple(e.token_ids) for e in expected}) == 3, "different seeds, different samples"
    scheduler = make(engine)
    sinks = [Collect() for _ in settings]
    for s, sink in zip(settings, sinks):
        scheduler.submit(prompts[1], s, sink=sink)
    scheduler.submit(prompts[2], GREEDY)  # and a stranger beside them
    scheduler.run_until_idle()
    for sink, want in zip(sinks, expected):
        assert sink.final.token_ids == want.token_ids
        assert sink.final.stats.seed == want.stats.seed


def test_samples_of_one_prompt_share_its_prefill(engine, prompts):
    ids = prompts[2]  # ~300 tokens: many full blocks
    scheduler = make(engine)
    sinks = [Collect() for _ in range(3)]
    seqs = scheduler.submit_samples(
        ids, SamplingSettings(temperature=0.7, max_new_tokens=10, seed=5, ignore_eos=True), 3, sinks=sinks
    )
    scheduler.run_until_idle()
    reused = [sink.final.stats.prefix_reused_tokens for sink in sinks]
    assert reused[0] == 0
    assert reused[1] == reused[2] == (len(ids) - 1) // 16 * 16, "every full block of the prompt is reused"
    assert [s.seed for s in seqs] == [5, 6, 7]
    assert len({tuple(s.final.token_ids) for s in sinks}) > 1
    assert scheduler.pool.lookups and scheduler.pool.hits


def test_a_follow_up_reuses_the_conversation_so_far(engine):
    chat = engine.chat
    scheduler = make(engine)
    first = [{"role": "user", "content": "Tell me about the sea. " * 20}]
    sink = Collect()
    scheduler.submit(chat.render(first).ids, GREEDY, sink=sink, in_reasoning=True)
    scheduler.run_until_idle()
    follow = first + [{"role": "assistant", "content": sink.final.text}, {"role": "user", "content": "And more?"}]
    ids = chat.render(follow).ids
    sink2 = Collect()
    scheduler.submit(ids, GREEDY, sink=sink2)
    scheduler.run_until_idle()
    assert sink2.final.stats.prefix_reused_tokens >= len(chat.render(first).ids) // 16 * 16 - 16
    assert sink2.final.token_ids == alone(engine, ids).token_ids


def test_requests_wait_for_blocks_and_a_running_reply_is_never_dropped(engine, prompts):
    """A cache too small for everyone at once: requests wait, sequences that run out are preempted and
    recomputed, and every reply still comes out whole."""
    scheduler = make(engine, blocks=30)  # 480 tokens for five prompts of 9..300 tokens + 40 new each
    sinks = [Collect() for _ in prompts]
    settings = SamplingSettings(temperature=0, max_new_tokens=40, ignore_eos=True)
    for ids, sink in zip(prompts, sinks):
        scheduler.submit(ids, settings, sink=sink)
    peak = 0
    while scheduler.has_work():
        scheduler.step()
        peak = max(peak, scheduler.pool.used_blocks)
        scheduler.pool.check([s.table for s in scheduler.running])
    assert peak <= 30
    assert scheduler.preemptions > 0, "the schedule must have run out of blocks mid-reply"
    for sink in sinks:
        assert isinstance(sink.final, Finished) and len(sink.final.token_ids) == 40
        assert sum(isinstance(e, Started) for e in sink.events) == 1
    assert scheduler.pool.free_blocks == scheduler.pool.num_blocks


def test_a_prompt_longer_than_the_whole_cache_is_refused_at_once(engine):
    from model_loader.errors import ContextFullError

    scheduler = make(engine, blocks=4)
    with pytest.raises(ContextFullError, match="KV cache holds 64"):
        scheduler.submit(list(range(100)), GREEDY)
    with pytest.raises(ContextFullError, match="context holds 1024"):
        scheduler.submit(list(range(2000)), GREEDY)
    assert not scheduler.has_work()


def test_a_long_prompt_pauses_the_others_by_one_chunk_at_a_time(engine, prompts):
    scheduler = make(engine)
    for ids in prompts[:2]:
        scheduler.submit(ids, GREEDY)
    while any(seq.pending > 1 for seq in scheduler.running) or scheduler.waiting or scheduler._incoming:
        scheduler.step()
    long = prompts[2]
    scheduler.submit(long, GREEDY)
    rows = []
    real_step = scheduler.forward.step
    scheduler.forward.step = lambda tokens, positions, seqs: (
        rows.append(len(tokens)) or real_step(tokens, positions, seqs)
    )
    before = [len(seq.output) for seq in scheduler.running]
    while len(rows) < -(-len(long) // 64):
        scheduler.step()
    assert max(rows) <= 64 + 2, "no step holds more than one chunk beside the decoders"
    after = [len(seq.output) for seq in scheduler.running[:2]]
    assert all(a - b == len(rows) for a, b in zip(after, before)), "the decoders advanced every step"


def test_prompts_that_arrive_together_are_read_together_up_to_the_step_budget(engine):
    """Four short prompts at once: one step reads them all when the budget holds them (their first tokens come
    together), one a step when it holds one. Each sequence still feeds at most one chunk a step."""
    short = [engine.chat.render([{"role": "user", "content": f"Question {i}: why?"}]).ids for i in range(4)]
    long = engine.chat.render([{"role": "user", "content": "Tell me a long story about a cat. " * 20}]).ids
    assert all(len(ids) <= 64 for ids in short) and len(long) > 128

    def first_steps(prefill_tokens):
        scheduler = make(engine, prefill_tokens=prefill_tokens)
        rows = []
        real_step = scheduler.forward.step
        scheduler.forward.step = lambda t, p, s: rows.append([x.rows for x in s]) or real_step(t, p, s)
        for ids in [long, *short]:
            scheduler.submit(ids, GREEDY)
        scheduler.step()
        return rows[0]

    assert first_steps(64 * 5) == [64] + [len(ids) for ids in short]
    assert first_steps(64) == [64]


def test_a_failing_sequence_fails_alone_and_the_others_finish(engine, prompts):
    """A step that raises is retried one sequence at a time: the sequence that fails alone gets Failed, the ones
    beside and behind it finish as they would have."""
    poison = prompts[1]
    expected = {i: alone(engine, prompts[i]) for i in (0, 2, 3)}
    scheduler = make(engine)
    real_step = scheduler.forward.step

    def faulty(tokens, positions, seqs):  # the model breaks wherever this one reply's 3rd token is an input
        at = len(poison) + 2
        for seq in seqs:
            start = seq.context - seq.rows
            if (
                start <= at < seq.context
                and tokens[seq.row0 + at - start] == poisoned["token"]
                and tokens[seq.row0] == ([*poison, *poisoned["ids"]])[start]
            ):
                raise RuntimeError("an illegal memory access")
        return real_step(tokens, positions, seqs)

    reply = alone(engine, poison).token_ids
    poisoned = {"token": reply[2], "ids": reply}
    scheduler.forward.step = faulty
    sinks = {i: Collect() for i in (0, 1, 2, 3)}
    for i in (0, 1, 2):
        scheduler.submit(prompts[i], GREEDY, sink=sinks[i])
    for _ in range(4):
        scheduler.step()
    scheduler.submit(prompts[3], GREEDY, sink=sinks[3])  # one behind it
    scheduler.run_until_idle()
    assert isinstance(sinks[1].final, Failed)
    assert "RuntimeError" in sinks[1].final.message
    for i in (0, 2, 3):
        assert sinks[i].final.token_ids == expected[i].token_ids
        assert sum(isinstance(e, Started) for e in sinks[i].events) == 1
    assert scheduler.pool.free_blocks == scheduler.pool.num_blocks
    after = Collect()
    scheduler.forward.step = real_step
    scheduler.submit(prompts[0], GREEDY, sink=after)
    scheduler.run_until_idle()
    assert after.final.token_ids == expected[0].token_ids


def test_stop_thinking_closes_one_sequences_reasoning(engine, prompts):
    scheduler = make(engine)
    controls = [GenerationControl(), GenerationControl()]
    sinks = [Collect(), Collect()]
    for i in range(2):
        scheduler.submit(
            prompts[i],
            SamplingSettings(temperature=0, max_new_tokens=30, ignore_eos=True),
            control=controls[i],
            sink=sinks[i],
            in_reasoning=True,
        )
    for _ in range(4):
        scheduler.step()
    controls[0].stop_thinking()
    scheduler.run_until_idle()
    done = sinks[0].final
    assert done.stats.stopped_thinking
    tag = engine.chat.encode_plain("\n</think>\n\n")
    start = next(i for i in range(len(done.token_ids)) if done.token_ids[i : i + len(tag)] == tag)
    assert 2 <= start <= 6
    assert "</think>" in done.text and done.answer
    assert not sinks[1].final.stats.stopped_thinking
    assert (
        sinks[1].final.token_ids
        == alone(engine, prompts[1], SamplingSettings(temperature=0, max_new_tokens=30, ignore_eos=True)).token_ids
    )


def test_batched_decode_attention_matches_per_sequence_attention(engine, prompts):
    """The GPU's one-gather-a-layer decode attention (padded, masked) against the per-sequence one, on the CPU."""
    from model_loader.paged_model import PagedForward

    scheduler = make(engine)
    scheduler.forward = PagedForward(engine.model, scheduler.cache, batched_decode=True)
    logits_seen = []
    real = scheduler.forward.step
    scheduler.forward.step = lambda *a: logits_seen.append(real(*a)) or logits_seen[-1]
    sinks = [Collect() for _ in prompts]
    for ids, sink in zip(prompts, sinks):
        scheduler.submit(ids, GREEDY, sink=sink)
    scheduler.run_until_idle()
    for ids, sink in zip(prompts, sinks):
        want = alone(engine, ids)
        same = next((i for i, (a, b) in enumerate(zip(sink.final.token_ids, want.token_ids)) if a != b), None)
        assert same is None or same > 8, "rounding may differ, not the first tokens"
    assert all(torch.isfinite(x).all() for x in logits_seen)


def test_a_sequences_logits_are_bitwise_the_same_alone_or_batched(engine, prompts):
    """The forward pass itself is batch-invariant on the CPU: a prefill chunk and a decode token give the same
    bits whether other sequences share the step or not (paged_model: padded rows, attention per sequence)."""
    from model_loader.paged_model import PagedForward, PagedKVCache, SeqSlice

    a, b = prompts[1], prompts[3]
    blocks_a, blocks_b = [0, 1], [2, 3]

    def run(together: bool):
        forward = PagedForward(engine.model, PagedKVCache(engine.model, 8, 16))
        first = SeqSlice(0, len(a), len(a), blocks_a, True)
        if together:
            logits = forward.step(
                a + b, [*range(len(a)), *range(len(b))], [first, SeqSlice(len(a), len(b), len(b), blocks_b, True)]
            )
        else:
            logits = forward.step(a, list(range(len(a))), [first])
        nxt = int(logits[0].argmax())
        decode = [SeqSlice(0, 1, len(a) + 1, blocks_a, True)]
        if together:
            second = forward.step([nxt, 7], [len(a), len(b)], decode + [SeqSlice(1, 1, len(b) + 1, blocks_b, True)])
        else:
            second = forward.step([nxt], [len(a)], decode)
        return logits[0], second[0]

    (prefill_alone, decode_alone), (prefill_batched, decode_batched) = run(False), run(True)
    assert torch.equal(prefill_alone, prefill_batched)
    assert torch.equal(decode_alone, decode_batched)


@pytest.mark.parametrize("kv_cache", ["16-bit", "8-bit"])
def test_the_triton_path_decodes_what_the_pytorch_path_decodes(tiny_model, prompts, kv_cache):
    """The paged Triton kernels (cache writer, decode attention over block tables; with an 8-bit cache, fp8 rows
    and their scales) inside the whole scheduler, in Triton's interpreter on the CPU (a GPU's own run checks them
    compiled): the same greedy text as the PyTorch path for prompts decoding together."""
    from model_loader.engine import Engine

    triton_engine = Engine.load(tiny_model, device="cpu", context_length=1024, use_triton=True, kv_cache=kv_cache)
    plain = Engine.load(tiny_model, device="cpu", context_length=1024, kv_cache=kv_cache)
    assert triton_engine.model.use_triton and not plain.model.use_triton
    settings = SamplingSettings(temperature=0, max_new_tokens=10, ignore_eos=True)
    results = []
    for engine in (triton_engine, plain):
        scheduler = make(engine, max_seqs=4, kv_cache=kv_cache)
        sinks = [Collect() for _ in range(3)]
        for ids, sink in zip(prompts[:3], sinks):
            scheduler.submit(ids, settings, sink=sink)
        scheduler.run_until_idle()
        results.append([sink.final.token_ids for sink in sinks])
    assert results[0] == results[1]


def test_steps_run_as_graphs_decode_what_eager_steps_decode(tiny_model):
    """The scheduler's steps through graphs by sequence (PagedForward._plan: fresh prompts through prefill graphs,
    a follow-up's new turn over its cached conversation through the decode graphs row by row, beside decoding
    sequences and a fresh prompt) give the texts of eager steps. On the CPU stand-ins replay the captured
    functions (graph_standins) and Triton's interpreter runs the paged kernels."""
    from graph_standins import install
    from model_loader.engine import Engine

    engine = Engine.load(tiny_model, device="cpu", context_length=512, use_triton=True)
    chat = engine.chat
    settings = SamplingSettings(temperature=0, max_new_tokens=8, ignore_eos=True)
    firsts = [
        chat.render([{"role": "user", "content": t}]).ids
        for t in ("Tell me about the sea. " * 3, "Why is the sky blue? " * 3)
    ]
    more = chat.encode_plain(" And then?")
    results, schedulers = [], []
    for graphed in (False, True):
        scheduler = make(engine, max_seqs=4)
        if graphed:
            install(scheduler.forward, prefill_buckets=(16, 32, 64), decode_buckets=(1, 2, 4, 8, 16, 32))
        sinks = [Collect() for _ in firsts]
        for ids, sink in zip(firsts, sinks):
            scheduler.submit(ids, settings, sink=sink)
        scheduler.run_until_idle()
        # each conversation goes on from where it ended (its blocks cached), beside a fresh prompt
        follow_ups = [ids + sink.final.token_ids + more for ids, sink in zip(firsts, sinks)]
        again = [Collect() for _ in range(3)]
        for ids, sink in zip(follow_ups + [chat.render([{"role": "user", "content": "Hi, who are you?"}]).ids], again):
            scheduler.submit(ids, settings, sink=sink)
        scheduler.run_until_idle()
        assert all(sink.final.stats.prefix_reused_tokens >= 16 for sink in again[:2])
        results.append([sink.final.token_ids for sink in sinks + again])
        schedulers.append(scheduler)
    assert results[1] == results[0]
    forward = schedulers[1].forward
    assert sum(g.replays for g, _ in forward.prefill_graphs.values()) >= 3  # the fresh prompts
    # rows beyond the sequences decoding: the follow-ups' new turns replayed row by row
    assert any(g.replays for b, (g, _) in forward.graphs.items() if b > 4)


def test_an_engine_hands_its_memory_to_a_scheduler(tiny_model, prompts):
    """serve_batched(): the single-sequence cache goes, the scheduler's paged cache comes, the engine refuses
    generate() from then on, and close() ends what is still queued with a clear message."""
    from model_loader.engine import Engine
    from model_loader.errors import ModelError

    engine = Engine.load(tiny_model, device="cpu", context_length=512)
    engine.warm_up()
    scheduler = engine.serve_batched(max_seqs=3)
    assert engine.model.k_cache is None
    assert scheduler.pool.num_blocks == 3 * 512 // 64 + 1
    assert engine.info.kv_cache_bytes == scheduler.cache.nbytes == engine.memory().kv_cache_bytes
    with pytest.raises(ModelError, match="scheduler"):
        next(engine.generate_ids(prompts[0]))
    sink = Collect()
    scheduler.submit(prompts[0], GREEDY, sink=sink)
    scheduler.run_until_idle()
    assert sink.final.token_ids == alone(engine, prompts[0]).token_ids
    waiting = Collect()
    scheduler.submit(prompts[1], GREEDY, sink=waiting)
    engine.close()
    assert isinstance(waiting.final, Failed) and waiting.final.kind == "unloaded"


def test_serve_by_default_decodes_as_many_replies_as_the_free_memory_holds(tiny_model):
    """`serve --max-parallel auto`: sequences of the whole context that free memory holds, the engine's own KV
    cache counted as free (it goes to the scheduler), at most AUTO_PARALLEL_CAP; 1 on a CPU (the engine alone)."""
    from model_loader.engine import Engine
    from model_loader.paged_model import PagedKVCache

    engine = Engine.load(tiny_model, device="cpu", context_length=512)
    assert engine.parallel_that_fits() == 1  # a CPU: the single-reply engine
    per_seq = 512 // 64
    block = PagedKVCache.bytes_per_block(engine.model, 64)
    own = engine.model.kv_cache_bytes
    three = -(-(3 * per_seq * block) * 10 // 9)  # Scheduler.blocks_that_fit keeps a tenth for activations
    assert engine.parallel_that_fits(free_bytes=three - own) == 3
    assert engine.parallel_that_fits(free_bytes=three - own - block) == 2  # one block short of the third
    assert engine.parallel_that_fits(free_bytes=0) == 1
    assert engine.parallel_that_fits(free_bytes=1 << 40) == Engine.AUTO_PARALLEL_CAP


@pytest.fixture(scope="module")
def stems(engine):
    """Prompt stems that share prefixes (a system prompt, a conversation and its follow-up), so arrivals hit the
    prefix cache, and a cache small enough that they also run out of blocks."""
    chat = engine.chat
    system = {"role": "system", "content": "You are a careful assistant. " * 8}
    first = [system, {"role": "user", "content": "Tell me about the sea. " * 4}]
    follow = first + [{"role": "assistant", "content": "The sea is large."}, {"role": "user", "content": "More?"}]
    other = [system, {"role": "user", "content": "Count to ten."}]
    return [chat.render(m).ids for m in (first, follow, other)]


from hypothesis import HealthCheck, given, settings as hyp_settings, strategies as st  # noqa: E402


@hyp_settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(st.sampled_from(["submit", "cancel", "step"]), st.integers(0, 7), st.integers(1, 12)),
        min_size=1,
        max_size=30,
    )
)
def test_random_arrivals_and_cancels_keep_the_block_accounting_exact(engine, stems, schedule):
    """Through the real scheduler: arrivals sharing prefixes, cancels of waiting and running sequences, and a cache
    too small for all of them (waiting, preemption). After every step each block's count equals the tables that
    list it, the free list holds exactly the unheld blocks; every request ends exactly once; at the end every
    block is free."""
    scheduler = make(engine, blocks=9, max_seqs=3)  # 144 tokens: prompts of 58-89 tokens wait and get preempted
    ended: dict[int, int] = {}
    seqs = []
    schedule = [("submit", pick, 12) for pick in (1, 0, 1, 2)] + schedule  # enough at once to run out of blocks
    for op, pick, n in schedule:
        if op == "submit":
            seq = scheduler.submit(
                stems[pick % 3],
                SamplingSettings(temperature=0.7, max_new_tokens=n, seed=pick, ignore_eos=True),
                sink=lambda ev, i=len(seqs): (
                    ended.__setitem__(i, ended.get(i, 0) + 1) if isinstance(ev, (Finished, Failed)) else None
                ),
            )
            seqs.append(seq)
        elif op == "cancel" and seqs:
            seqs[pick % len(seqs)].control.cancel()
        else:
            for _ in range(n):
                scheduler.step()
                scheduler.pool.check([s.table for s in scheduler.running])
    scheduler.run_until_idle()
    scheduler.pool.check([])
    assert scheduler.pool.free_blocks == scheduler.pool.num_blocks
    assert ended == {i: 1 for i in range(len(seqs))}


@pytest.fixture(scope="module")
def engine_8bit(tiny_model):
    from model_loader.engine import Engine

    engine = Engine.load(tiny_model, device="cpu", context_length=1024, kv_cache="8-bit")
    yield engine
    engine.close()


def test_the_8bit_paged_cache_decodes_what_the_8bit_engine_decodes_alone_or_batched(engine_8bit, prompts):
    """An 8-bit paged cache quantizes each K/V row as the single-sequence 8-bit cache does (fp8 e4m3 with a scale
    per row), so a sequence decodes the engine's text, and batched the same as alone."""
    scheduler = make(engine_8bit, kv_cache="8-bit")
    assert scheduler.cache.k.dtype == torch.float8_e4m3fn and scheduler.cache.k_scale is not None
    sinks = [Collect() for _ in prompts[:3]]
    for ids, sink in zip(prompts[:3], sinks):
        scheduler.submit(ids, GREEDY, sink=sink)
    scheduler.run_until_idle()
    for ids, sink in zip(prompts[:3], sinks):
        theirs = [e for e in engine_8bit.generate_ids(ids, GREEDY)][-1]
        assert sink.final.token_ids == theirs.token_ids
    assert scheduler.pool.used_blocks == 0  # every finished sequence gave its blocks back


def test_an_8bit_block_costs_about_half_a_16bit_one(engine):
    from model_loader.paged_model import PagedKVCache

    cfg = engine.model.cfg
    sixteen = PagedKVCache.bytes_per_block(engine.model, 64)
    eight = PagedKVCache.bytes_per_block(engine.model, 64, "8-bit")
    rows = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * 64
    assert sixteen == rows * cfg.head_dim * engine.model.dtype.itemsize and eight == rows * (cfg.head_dim + 4)
    cache = PagedKVCache(engine.model, 3, 64, "8-bit")
    assert cache.nbytes == 3 * eight
