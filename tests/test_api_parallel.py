"""`r1desk-cli serve --max-parallel N`: API requests decoded together through the scheduler (continuous
batching), as clients see it: a short request does not wait for a long one, batched answers are the answers each
request gets alone, and --max-tokens-cap bounds every request."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest

from test_api import _client, _serve, _stop


@pytest.fixture(scope="module")
def server(tiny_model):
    proc, model_id, url = _serve(tiny_model, "--max-parallel", "4", "--max-tokens-cap", "300")
    yield model_id, url
    _stop(proc)


def _ask(server, content, **kw):
    model_id, url = server
    return _client(url, key="none").chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": content}], temperature=0, **kw)


def test_a_short_request_finishes_while_a_long_one_streams(server):
    """With one reply at a time the short request would wait for all 300 tokens of the long one."""
    model_id, url = server
    first_chunk = threading.Event()
    ended = []

    def long_request():
        stream = _client(url, key="none").chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "Tell me everything."}], temperature=0,
            max_tokens=300, stream=True)
        for _ in stream:
            first_chunk.set()
        ended.append("long")

    t = threading.Thread(target=long_request)
    t.start()
    assert first_chunk.wait(60)
    short = _ask(server, "Hi", max_tokens=5)
    ended.append("short")
    t.join(120)
    assert short.usage.completion_tokens == 5
    assert ended == ["short", "long"]


def test_answers_decoded_together_are_the_answers_alone(server):
    questions = [f"Question number {i}: why?" * (i + 1) for i in range(4)]
    alone = [_ask(server, q, max_tokens=24).choices[0].message.model_extra["reasoning_content"] for q in questions]
    together: dict[int, str] = {}

    def ask(i):
        together[i] = _ask(server, questions[i], max_tokens=24).choices[0].message.model_extra["reasoning_content"]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [together[i] for i in range(4)] == alone


def test_the_cap_bounds_every_request_and_health_counts_replies(server):
    capped = _ask(server, "Go on.", max_tokens=400)
    assert capped.usage.completion_tokens == 300 and capped.choices[0].finish_reason == "length"
    model_id, url = server
    with urllib.request.urlopen(url.removesuffix("/v1") + "/health") as resp:
        health = json.loads(resp.read())
    assert health["running"] == 0 and health["waiting"] == 0 and health["status"] == "ok"
