"""`r1desk-cli serve --max-parallel N`: API requests decoded together through the scheduler (continuous
batching), as clients see it: a short request does not wait for a long one, batched answers are the answers each
request gets alone, and --max-tokens-cap bounds every request."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest

from serving import openai_client, serve, stop


@pytest.fixture(scope="module")
def parallel_server(tiny_model):
    proc, model_id, url = serve(tiny_model, "--max-parallel", "4", "--max-tokens-cap", "300")
    yield model_id, url
    stop(proc)


def _ask(parallel_server, content, **kw):
    model_id, url = parallel_server
    return openai_client(url, key="none").chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": content}], temperature=0, **kw
    )


def test_a_short_request_finishes_while_a_long_one_streams(parallel_server):
    """With one reply at a time the short request would wait for all 300 tokens of the long one."""
    model_id, url = parallel_server
    first_chunk = threading.Event()
    ended = []

    def long_request():
        stream = openai_client(url, key="none").chat.completions.create(
            model=model_id,
            messages=[{"role": "user", "content": "Tell me everything."}],
            temperature=0,
            max_tokens=300,
            stream=True,
        )
        for _ in stream:
            first_chunk.set()
        ended.append("long")

    t = threading.Thread(target=long_request)
    t.start()
    assert first_chunk.wait(60)
    short = _ask(parallel_server, "Hi", max_tokens=5)
    ended.append("short")
    t.join(120)
    assert short.usage.completion_tokens == 5
    assert ended == ["short", "long"]


def test_answers_decoded_together_are_the_answers_alone(parallel_server):
    questions = [f"Question number {i}: why?" * (i + 1) for i in range(4)]
    alone = [
        _ask(parallel_server, q, max_tokens=24).choices[0].message.model_extra["reasoning_content"] for q in questions
    ]
    together: dict[int, str] = {}

    def ask(i):
        together[i] = (
            _ask(parallel_server, questions[i], max_tokens=24).choices[0].message.model_extra["reasoning_content"]
        )

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [together[i] for i in range(4)] == alone


def test_the_cap_bounds_every_request_and_health_counts_replies(parallel_server):
    capped = _ask(parallel_server, "Go on.", max_tokens=400)
    assert capped.usage.completion_tokens == 300 and capped.choices[0].finish_reason == "length"
    model_id, url = parallel_server
    with urllib.request.urlopen(url.removesuffix("/v1") + "/health") as resp:
        health = json.loads(resp.read())
    assert health["running"] == 0 and health["waiting"] == 0 and health["status"] == "ok"


def _metrics(url) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics") as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {
        s.name + ("{%s}" % ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) if s.labels else ""): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_parse_and_move_with_requests(parallel_server):
    model_id, url = parallel_server
    before = _metrics(url)
    assert before["r1desk_max_parallel"] == 4
    assert before["r1desk_kv_blocks_used"] + before["r1desk_kv_blocks_free"] > 0
    prompt = "The same long system of rules. " * 20
    for _ in range(2):  # the second time, its full blocks come from the prefix cache
        _ask(parallel_server, prompt, max_tokens=7)
    after = _metrics(url)
    assert after["r1desk_generation_tokens_total"] - before.get("r1desk_generation_tokens_total", 0) == 14
    assert (
        after["r1desk_requests_total{client=api,finish_reason=max_new_tokens}"]
        - before.get("r1desk_requests_total{client=api,finish_reason=max_new_tokens}", 0)
        == 2
    )
    assert (
        after["r1desk_time_to_first_token_seconds_count"] - before.get("r1desk_time_to_first_token_seconds_count", 0)
        == 2
    )
    assert (
        after["r1desk_inter_token_latency_seconds_count"] - before.get("r1desk_inter_token_latency_seconds_count", 0)
        == 12
    )
    assert after["r1desk_prompt_cached_tokens_total"] - before.get("r1desk_prompt_cached_tokens_total", 0) >= 64
    assert after["r1desk_prefix_cache_hit_ratio"] > 0
    assert after["r1desk_requests_running"] == 0 and after["r1desk_kv_blocks_used"] == 0


def test_n_choices_are_the_seeds_replies_and_share_the_prompt(parallel_server):
    """n = 3 sampled with seed 40: choice i is the reply seed 40 + i gives alone; the choices after the first
    reuse the first one's prefill; usage counts the prompt once and every choice's tokens; a stream carries all
    three, each with its index."""
    model_id, url = parallel_server
    prompt = "Explain the same long question again, please. " * 12
    kw = dict(max_tokens=10, temperature=0.9)
    many = openai_client(url, key="none").chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": prompt}], n=3, seed=40, **kw
    )
    assert [c.index for c in many.choices] == [0, 1, 2]
    texts = [c.message.model_extra["reasoning_content"] for c in many.choices]
    alone = [
        openai_client(url, key="none")
        .chat.completions.create(model=model_id, messages=[{"role": "user", "content": prompt}], seed=40 + i, **kw)
        .choices[0]
        .message.model_extra["reasoning_content"]
        for i in range(3)
    ]
    assert texts == alone and len(set(texts)) > 1
    assert many.usage.completion_tokens == 30
    assert many.usage.prompt_tokens == _ask(parallel_server, prompt, max_tokens=1).usage.prompt_tokens
    before = _metrics(url)["r1desk_prompt_cached_tokens_total"]
    chunks = list(
        openai_client(url, key="none").chat.completions.create(
            model=model_id,
            messages=[{"role": "user", "content": prompt + "!"}],
            n=3,
            seed=7,
            stream=True,
            stream_options={"include_usage": True},
            **kw,
        )
    )
    streamed = {
        i: "".join(
            c.choices[0].delta.model_extra.get("reasoning_content") or ""
            for c in chunks
            if c.choices and c.choices[0].index == i
        )
        for i in range(3)
    }
    assert all(streamed.values())
    finishes = sorted(c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason)
    assert finishes == [0, 1, 2]
    assert chunks[-1].usage.completion_tokens == 30
    # the two choices after the first found the new prompt's full blocks in the prefix cache
    assert _metrics(url)["r1desk_prompt_cached_tokens_total"] - before >= 2 * 64


def test_n_is_bounded(parallel_server):
    from openai import BadRequestError

    with pytest.raises(BadRequestError, match="at most 16"):
        _ask(parallel_server, "hi", max_tokens=2, n=17)


def test_the_serve_benchmark_times_every_request(tiny_model):
    from test_cli import cli

    out = json.loads(
        cli(
            "bench",
            "--model",
            tiny_model,
            "--device",
            "cpu",
            "--scenario",
            "serve",
            "--clients",
            "3",
            "--requests",
            "5",
            "--max-parallel",
            "2",
            "--new-tokens",
            "6",
            "--context",
            "512",
            "--json",
        ).stdout
    )
    assert out["errors"] == 0 and out["requests"] == 5 and out["tokens"] == 30 and out["max_parallel"] == 2
    assert 0 < out["ttft_ms_p50"] <= out["ttft_ms_p95"] <= out["ttft_ms_max"]
    assert out["e2e_s_p50"] <= out["e2e_s_max"] <= out["wall_s"]


def test_several_replies_at_once_run_over_an_8bit_cache(tiny_model):
    from test_cli import cli

    out = json.loads(
        cli(
            "bench", "--model", tiny_model, "--device", "cpu", "--scenario", "serve", "--clients", "3", "--requests",
            "4", "--max-parallel", "2", "--new-tokens", "5", "--context", "512", "--kv-cache", "8-bit", "--json",
        ).stdout
    )  # fmt: skip
    assert out["errors"] == 0 and out["requests"] == 4 and out["tokens"] == 20 and out["max_parallel"] == 2
