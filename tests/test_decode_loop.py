"""A single-sequence reply (model_loader.decode_loop, through Engine.generate) on the tiny model: sampling, prefix
reuse, stopping, cancel, stop-thinking, context limits. Closing the engine and its errors: test_engine.py."""

import threading

import pytest

from model_loader.errors import ContextFullError
from model_loader.events import Delta, Finished, GenerationControl, SamplingSettings, Started

MESSAGES = [{"role": "user", "content": "Tell me a story about a robot."}]


def run(engine, messages=MESSAGES, control=None, **settings):
    """One reply; checks the event order (Started, Delta..., Finished) and returns (Finished, deltas)."""
    events = list(engine.generate(messages, SamplingSettings(**settings), control))
    started, final = events[0], events[-1]
    assert isinstance(started, Started) and isinstance(final, Finished)
    assert all(isinstance(e, Delta) for e in events[1:-1])
    assert started.prompt_tokens == final.stats.prompt_tokens
    assert started.prefix_reused_tokens == final.stats.prefix_reused_tokens
    assert started.context_length == final.stats.context_length
    return final, events[1:-1]


def test_seeded_sampling_is_reproducible(cpu_engine):
    a, _ = run(cpu_engine, temperature=0.8, top_p=0.95, seed=123, max_new_tokens=30, ignore_eos=True)
    b, _ = run(cpu_engine, temperature=0.8, top_p=0.95, seed=123, max_new_tokens=30, ignore_eos=True)
    c, _ = run(cpu_engine, temperature=0.8, top_p=0.95, seed=124, max_new_tokens=30, ignore_eos=True)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_top_k_1_and_tiny_top_p_are_greedy(cpu_engine):
    greedy, _ = run(cpu_engine, temperature=0, max_new_tokens=20, ignore_eos=True)
    k1, _ = run(cpu_engine, temperature=1.5, top_k=1, seed=1, max_new_tokens=20, ignore_eos=True)
    p0, _ = run(cpu_engine, temperature=1.5, top_p=1e-6, seed=2, max_new_tokens=20, ignore_eos=True)
    assert k1.token_ids == greedy.token_ids == p0.token_ids


def test_prefix_reuse_gives_the_same_tokens_as_a_fresh_prefill(cpu_engine):
    first, _ = run(cpu_engine, temperature=0, max_new_tokens=16, ignore_eos=True)
    follow = MESSAGES + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Shorter."}]
    reused, _ = run(cpu_engine, follow, temperature=0, max_new_tokens=16, ignore_eos=True)
    assert reused.stats.prefix_reused_tokens >= len(cpu_engine.chat.render(MESSAGES).ids) - 2
    cpu_engine.reset_cache()
    fresh, _ = run(cpu_engine, follow, temperature=0, max_new_tokens=16, ignore_eos=True)
    assert fresh.stats.prefix_reused_tokens == 0
    assert fresh.token_ids == reused.token_ids


def test_a_changed_conversation_reuses_only_what_still_matches(cpu_engine):
    first, _ = run(cpu_engine, temperature=0, max_new_tokens=8, ignore_eos=True)
    edited = [{"role": "user", "content": "Tell me a story about a cat."}]
    ids_before = cpu_engine.chat.render(MESSAGES).ids
    ids_after = cpu_engine.chat.render(edited).ids
    same = next(i for i, (x, y) in enumerate(zip(ids_before, ids_after)) if x != y)
    changed, _ = run(cpu_engine, edited, temperature=0, max_new_tokens=8, ignore_eos=True)
    assert changed.stats.prefix_reused_tokens == same
    cpu_engine.reset_cache()
    fresh, _ = run(cpu_engine, edited, temperature=0, max_new_tokens=8, ignore_eos=True)
    assert fresh.token_ids == changed.token_ids


def test_deltas_add_up_to_the_reply_and_stats_are_filled(cpu_engine):
    final, deltas = run(cpu_engine, temperature=0, max_new_tokens=40, ignore_eos=True)
    assert "".join(d.text for d in deltas if d.kind == "reasoning") == final.reasoning
    assert "".join(d.text for d in deltas if d.kind == "answer") == final.answer
    assert [d.token_count for d in deltas] == sorted(d.token_count for d in deltas)
    st = final.stats
    assert st.finish_reason == "max_new_tokens" and st.completion_tokens == 40 == len(final.token_ids)
    assert st.prompt_tokens == len(cpu_engine.chat.render(MESSAGES).ids)
    assert st.ttft_ms > 0 and st.decode_tok_s > 0 and len(st.token_latencies_ms) == 39
    assert 0 < st.prompt_ms < st.ttft_ms  # the first token waited for the prompt's rendering, and TTFT says so
    assert st.memory.weights_bytes > 0 and st.memory.kv_cache_bytes > 0


def test_stops_at_eos(cpu_engine):
    # Force the end-of-sentence token to be the argmax: bias lm_head's row for it.
    eos = cpu_engine.tokenizer.eos_token_id
    lm_head = cpu_engine.model.w["lm_head"]
    saved = lm_head[eos].clone()
    lm_head[eos] = cpu_engine.model.w["norm"].sign() * 50
    try:
        final, _ = run(cpu_engine, temperature=0, max_new_tokens=50)
    finally:
        lm_head[eos] = saved
        cpu_engine.reset_cache()
    assert final.stats.finish_reason == "eos"
    assert final.token_ids[-1] == eos and final.stats.completion_tokens < 50


def test_cancel_stops_within_one_token(cpu_engine):
    control = GenerationControl()
    seen = None
    for ev in cpu_engine.generate(
        MESSAGES, SamplingSettings(temperature=0, max_new_tokens=500, ignore_eos=True), control
    ):
        if isinstance(ev, Delta) and ev.token_count >= 5 and seen is None:
            seen = ev.token_count
            control.cancel()
        if isinstance(ev, Finished):
            final = ev
    assert final.stats.finish_reason == "cancelled"
    assert final.stats.completion_tokens <= seen + 1


def test_cancel_from_another_thread(cpu_engine):
    control = GenerationControl()
    started = threading.Event()
    canceller = threading.Thread(target=lambda: (started.wait(), control.cancel()))
    canceller.start()
    final = None
    for ev in cpu_engine.generate(
        MESSAGES, SamplingSettings(temperature=0, max_new_tokens=100_000, ignore_eos=True), control
    ):
        started.set()
        if isinstance(ev, Finished):
            final = ev
    canceller.join()
    assert final.stats.finish_reason == "cancelled"


def test_stop_thinking_closes_the_reasoning_and_answers(cpu_engine):
    control = GenerationControl()
    kinds = []
    for ev in cpu_engine.generate(
        MESSAGES, SamplingSettings(temperature=0, max_new_tokens=40, ignore_eos=True), control
    ):
        if isinstance(ev, Delta):
            kinds.append(ev.kind)
            if len(kinds) == 5:
                control.stop_thinking()
        else:
            final = ev
    assert kinds[:5] == ["reasoning"] * 5
    assert "answer" in kinds and kinds.index("answer") >= 5
    assert final.stats.stopped_thinking
    assert "</think>" in final.text and final.answer
    assert final.stats.completion_tokens == 40


def test_full_context_is_reported(tiny_model):
    from model_loader.engine import Engine

    engine = Engine.load(tiny_model, device="cpu", context_length=64)
    final, _ = run(engine, temperature=0, max_new_tokens=1000, ignore_eos=True)
    assert final.stats.finish_reason == "context_full"
    assert final.stats.prompt_tokens + final.stats.completion_tokens == 64
    with pytest.raises(ContextFullError, match="context holds 64"):
        run(engine, [{"role": "user", "content": "word " * 100}], temperature=0)
    # still usable afterwards
    final, _ = run(engine, temperature=0, max_new_tokens=3)
    assert final.stats.completion_tokens == 3


def test_the_recorded_seed_replays_an_unseeded_reply(cpu_engine):
    first, _ = run(cpu_engine, temperature=0.9, max_new_tokens=20, ignore_eos=True)
    assert first.stats.seed is not None
    again, _ = run(cpu_engine, temperature=0.9, seed=first.stats.seed, max_new_tokens=20, ignore_eos=True)
    assert again.token_ids == first.token_ids
