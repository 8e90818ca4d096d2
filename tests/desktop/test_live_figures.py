"""The live panel's figures without widgets (desktop.live_figures): sizes, what a decode step read and at what
rate, where the time to first token went, and a reply's token counts and rate as deltas arrive."""

import pytest

from desktop import live_figures
from desktop.live_figures import LiveReply, gib, memory_read, slow_kernels_notice, ttft_breakdown
from model_loader.events import GenerationStats


def test_sizes_read_in_the_unit_that_suits_them():
    assert gib(3.31 * 2**30) == "3.31 GiB"
    assert gib(112 * 2**20) == "112 MiB"  # under a quarter GiB: MiB


def test_a_decode_steps_read_and_its_rate():
    read, rate, tip = memory_read(3.5e9, 0.5e9, 700.0)
    assert (read, rate) == ("3.50 GB", "2.45 TB/s")
    assert "3.00 GB of weights and 0.50 GB of KV cache" in tip
    assert memory_read(1.2e9, 0.0, 500.0)[1] == "600 GB/s"
    assert memory_read(None, 0.0, 500.0) == ("—", "—", "")


def test_the_time_to_first_token_split_into_the_prompt_and_the_prefill():
    stats = GenerationStats(
        finish_reason="eos",
        prompt_tokens=530,
        completion_tokens=8,
        reasoning_tokens=6,
        prefix_reused_tokens=512,
        context_length=4096,
        ttft_ms=5.0,
        first_answer_ms=None,
        decode_tok_s=100.0,
        total_s=0.1,
        prompt_ms=1.25,
    )
    assert ttft_breakdown(stats) == (
        "Chat template and tokenizer: 1.2 ms\nPrefill of 18 new tokens (512 cached) and the first token: 3.8 ms"
    )


def test_a_reply_counts_tokens_not_deltas_and_its_rate_is_over_the_last_second(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(live_figures.time, "monotonic", lambda: now[0])
    reply = LiveReply()
    now[0] = 100.5
    reply.on_delta("reasoning", 1)
    for i in range(2, 11):  # a delta can carry several tokens: its count is the engine's
        now[0] += 0.1
        reply.on_delta("reasoning" if i < 6 else "answer", i * 2)
    assert (reply.reasoning_n, reply.answer_n, reply.count) == (10, 10, 20)
    assert reply.first_t == 100.5 and reply.first_answer_t == pytest.approx(101.0)
    assert reply.rate_now() == pytest.approx(20 / 0.9)  # 20 tokens in the 0.9 s since the first
    now[0] += 0.55
    reply.on_delta("answer", 30)  # at 101.95 the last second holds the tokens after 100.9's count (10): 20
    assert reply.rate_now() == pytest.approx(20 / 1.0)
    now[0] += 2.0
    assert reply.rate_now() == 0.0  # nothing for two seconds
    quiet = LiveReply()
    quiet.on_delta("answer")  # an engine that doesn't count: each delta taken for a token
    quiet.on_delta("answer")
    assert quiet.count == 2


def test_the_slow_kernels_notice_says_why_and_what_to_do_only_on_a_gpu_without_them():
    note = "no C compiler was found, which Triton needs. Install a C compiler and start r1desk again."
    gpu = {"device": "cuda:0", "kernels": "pytorch", "cuda_graphs": True, "kernels_note": note}
    text = slow_kernels_notice(gpu)
    assert note in text and "in CUDA graphs" in text and "slower" in text
    assert "CUDA graphs" not in slow_kernels_notice(dict(gpu, cuda_graphs=False))
    assert "could not be used" in slow_kernels_notice(dict(gpu, kernels_note=None))
    assert slow_kernels_notice(dict(gpu, kernels="triton")) is None
    assert slow_kernels_notice(dict(gpu, device="cpu")) is None  # the CPU never had them
    assert slow_kernels_notice({"device": "remote", "kernels": ""}) is None  # a server's kernels are its own
