"""The API's sampler options (model_loader.logits_processing), each checked against its definition on logits:
penalties and bias change exactly the logits they define, min-p and top-k keep exactly the tokens they define,
log-probabilities equal torch's log-softmax of the same logits. Then the wiring: a reply generated with them by
the engine and by the scheduler takes, at every step, the token the definition picks from the model's own
logits for that step (recomputed here from scratch)."""

from __future__ import annotations

import math

import pytest
import torch

from model_loader.events import Finished, SamplingSettings, TokenLogprobs
from model_loader.logits_processing import LogitsPipeline, token_text

V = 32


@pytest.fixture(scope="module")
def tiny_tokenizer(engine):
    return engine.tokenizer


def _logits(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, V, generator=g) * 3


def test_frequency_and_presence_penalties_subtract_by_count_and_by_presence():
    s = SamplingSettings(temperature=0, frequency_penalty=0.5, presence_penalty=1.25)
    p = LogitsPipeline(s, V, "cpu", prompt_ids=[1, 2, 3])
    for token in [4, 4, 4, 9, 1]:
        p.observe(token)
    raw = _logits()
    out = p.process(raw)
    counts = torch.zeros(V)
    counts[4], counts[9], counts[1] = 3, 1, 1  # the prompt's tokens don't count (OpenAI's definition)
    want = raw - counts * 0.5 - (counts > 0).float() * 1.25
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    s = SamplingSettings(temperature=0, repetition_penalty=1.7)
    prompt = [2, 5]
    p = LogitsPipeline(s, V, "cpu", prompt_ids=prompt)
    p.observe(torch.tensor([11]))
    raw = _logits(1)
    out = p.process(raw)
    seen = {2, 5, 11}  # the prompt's and the reply's (transformers' and vLLM's definition)
    for t in range(V):
        x = raw[0, t].item()
        want = (x / 1.7 if x > 0 else x * 1.7) if t in seen else x
        assert out[0, t].item() == pytest.approx(want, abs=1e-6), t


def test_logit_bias_adds_to_the_named_tokens_and_can_force_one():
    s = SamplingSettings(temperature=0, logit_bias={3: 100.0, 7: -2.5})
    p = LogitsPipeline(s, V, "cpu", prompt_ids=[])
    raw = _logits(2)
    out = p.process(raw)
    want = raw.clone()
    want[0, 3] += 100.0
    want[0, 7] -= 2.5
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    assert int(p.choose(raw)) == 3


def _drawn(settings: SamplingSettings, logits: torch.Tensor, draws: int = 3000) -> set[int]:
    p = LogitsPipeline(settings, V, "cpu", prompt_ids=[])
    g = torch.Generator().manual_seed(0)
    return {int(p.choose(logits, g)) for _ in range(draws)}


def test_min_p_keeps_exactly_the_tokens_at_least_min_p_times_as_likely_as_the_likeliest():
    logits = torch.arange(V, dtype=torch.float32)[None] / 4  # probabilities e^(t/4): distinct ratios
    for min_p in (0.05, 0.3, 0.9):
        s = SamplingSettings(temperature=1.0, top_p=1.0, min_p=min_p)
        probs = torch.softmax(logits[0], dim=0)
        allowed = {t for t in range(V) if probs[t] >= min_p * probs.max()}
        assert _drawn(s, logits) == allowed, min_p


def test_min_p_applies_after_the_temperature():
    logits = torch.arange(V, dtype=torch.float32)[None] / 4
    s = SamplingSettings(temperature=0.5, top_p=1.0, min_p=0.3)
    probs = torch.softmax(logits[0] / 0.5, dim=0)
    assert _drawn(s, logits) == {t for t in range(V) if probs[t] >= 0.3 * probs.max()}


def test_top_k_one_is_the_argmax_whatever_the_seed():
    logits = _logits(3)
    s = SamplingSettings(temperature=1.5, top_p=1.0, top_k=1, min_p=0.01)  # min_p: through the pipeline
    assert _drawn(s, logits, draws=200) == {int(logits.argmax())}


def test_logprobs_are_the_log_softmax_of_the_raw_logits_with_the_likeliest_in_order(tiny_tokenizer):
    # bias and penalties change the choice, never the reported log-probabilities (vLLM's default: raw)
    s = SamplingSettings(temperature=0, logprobs=5, logit_bias={7: 50.0}, presence_penalty=1.0)
    p = LogitsPipeline(s, V, "cpu", prompt_ids=[])
    raw = _logits(4)
    token = int(p.choose(raw))
    assert token == 7
    scored = p.take_logprobs(token, tiny_tokenizer, "answer")
    ref = torch.log_softmax(raw.double(), dim=-1)[0]
    assert scored.logprob == pytest.approx(ref[7].item(), abs=1e-5)
    best = torch.argsort(ref, descending=True)[:5].tolist()
    assert [t["token_id"] for t in scored.top] == best
    for t in scored.top:
        assert t["logprob"] == pytest.approx(ref[t["token_id"]].item(), abs=1e-5)
    assert math.isclose(sum(math.exp(v) for v in ref.tolist()), 1.0, rel_tol=1e-9)


def test_token_text_gives_exact_bytes_for_pieces_of_characters_and_control_tokens(tiny_tokenizer):
    ids = tiny_tokenizer.encode("é 日本 😀")
    raw = b"".join(token_text(tiny_tokenizer, t)[1] for t in ids)
    assert raw == "é 日本 😀".encode()
    eos = tiny_tokenizer.eos_token_id
    assert token_text(tiny_tokenizer, eos) == (tiny_tokenizer.eos_token, tiny_tokenizer.eos_token.encode())


# ---------------------------------------------------------------------------------------------- wiring
def _step_logits(engine, prompt_ids: list[int], tokens: list[int]) -> list[torch.Tensor]:
    """The model's logits before each generated token, each recomputed from scratch (no cache reuse)."""
    out = []
    with torch.inference_mode():
        for i in range(len(tokens)):
            engine.reset_cache()
            ids = torch.tensor(prompt_ids + tokens[:i], dtype=torch.int64)
            out.append(engine.model.prefill(ids, 0).float())
    engine.reset_cache()
    return out


def _replay_check(engine, prompt_ids, settings: SamplingSettings, tokens: list[int], scored: list[TokenLogprobs]):
    """Every step's token is the argmax of the definition applied to that step's logits; every log-probability
    is the log-softmax of them."""
    counts = torch.zeros(engine.model.cfg.vocab_size)
    for i, logits in enumerate(_step_logits(engine, prompt_ids, tokens)):
        x = logits[0] - counts * settings.frequency_penalty - (counts > 0).float() * settings.presence_penalty
        for t, b in (settings.logit_bias or {}).items():
            x[t] += b
        assert int(torch.argmax(x)) == tokens[i], f"step {i}"
        ref = torch.log_softmax(logits[0].double(), dim=-1)
        assert scored[i].token_id == tokens[i]
        assert scored[i].logprob == pytest.approx(ref[tokens[i]].item(), abs=2e-4)
        assert [t["token_id"] for t in scored[i].top] == torch.argsort(ref, descending=True)[:3].tolist()
        counts[tokens[i]] += 1


# The bias makes token 100 the likeliest until the penalties for repeating it outweigh the bias: both bite.
PENALISED = SamplingSettings(
    temperature=0,
    max_new_tokens=12,
    frequency_penalty=2.0,
    presence_penalty=0.5,
    logit_bias={100: 14.0},
    logprobs=3,
    ignore_eos=True,
)


def test_the_engine_takes_each_step_by_the_definition_on_the_models_own_logits(engine):
    prompt = engine.chat.render([{"role": "user", "content": "count to ten"}]).ids
    events = list(engine.generate_ids(prompt, PENALISED))
    done = events[-1]
    assert isinstance(done, Finished) and len(done.token_ids) == 12
    scored = [e for e in events if isinstance(e, TokenLogprobs)]
    _replay_check(engine, prompt, PENALISED, done.token_ids, scored)
    assert 2 <= done.token_ids.count(100) < 12  # biased towards, then penalised away from
    plain = [
        e for e in engine.generate_ids(prompt, SamplingSettings(temperature=0, max_new_tokens=12, ignore_eos=True))
    ][-1]
    assert plain.token_ids != done.token_ids  # the penalties changed the reply


def test_the_scheduler_applies_each_sequences_own_options_in_one_batch(engine):
    from model_loader.scheduler import Scheduler, SchedulerConfig

    prompt = engine.chat.render([{"role": "user", "content": "count to ten"}]).ids
    other = engine.chat.render([{"role": "user", "content": "name a colour"}]).ids
    alone = list(engine.generate_ids(prompt, PENALISED))[-1].token_ids
    sched = Scheduler(engine.model, engine.chat, num_blocks=64, config=SchedulerConfig(max_seqs=4))
    got: dict[int, list] = {0: [], 1: [], 2: []}
    plain = SamplingSettings(temperature=0, max_new_tokens=12, ignore_eos=True)
    biased = SamplingSettings(temperature=0, max_new_tokens=12, ignore_eos=True, logit_bias={5: 100.0})
    for i, (ids, s) in enumerate([(prompt, PENALISED), (other, plain), (other, biased)]):
        sched.submit(ids, s, sink=got[i].append)
    sched.run_until_idle()
    done = [next(e for e in got[i] if isinstance(e, Finished)) for i in range(3)]
    assert done[0].token_ids == alone  # beside others with other settings, the same as alone
    _replay_check(engine, prompt, PENALISED, done[0].token_ids, [e for e in got[0] if isinstance(e, TokenLogprobs)])
    assert done[2].token_ids == [5] * 12
    assert done[1].token_ids != done[2].token_ids
    assert not any(isinstance(e, TokenLogprobs) for e in got[1])  # only asked for, never sent to others
