"""The local OpenAI-compatible API, end to end: `r1desk-cli serve` (headless, tiny model, CPU) driven by the
official `openai` client and raw HTTP. Two servers: the R1 tiny model (output starts inside the reasoning) and a
copy with a plain chat template (output is all answer: content, stop strings)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time

import aiohttp
import openai
import pytest
from serving import KEY, Reply, error_body, openai_client, raw_request, serve, stop

ORIGIN = "http://app.example"  # a web app's origin the r1 server lets in (given with a trailing slash)


@pytest.fixture(scope="module")
def keyed_server(tiny_model):
    proc, model_id, url = serve(tiny_model, "--api-key", KEY, "--max-waiting", "2", "--allow-origin", ORIGIN + "/")
    yield model_id, url
    stop(proc)


def _ask(server, content, key=KEY, **kw):
    model_id, url = server
    return openai_client(url, key).chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": content}], **kw
    )


def _stream(server, content, **kw):
    model_id, url = server
    return list(
        openai_client(url).chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": content}], stream=True, **kw
        )
    )


# ---------------------------------------------------------------------------------------------- answers
def test_models_list_names_the_loaded_model(keyed_server):
    model_id, url = keyed_server
    assert model_id == "tiny-r1"
    assert [m.id for m in openai_client(url).models.list()] == ["tiny-r1"]
    assert openai_client(url).models.retrieve("tiny-r1").id == "tiny-r1"


def test_streamed_and_plain_answers_agree_with_reasoning_in_its_fields_and_usage(keyed_server):
    whole = _ask(keyed_server, "Why is the sky blue?", max_tokens=40, temperature=0)
    msg = whole.choices[0].message
    extra = msg.model_extra
    assert msg.role == "assistant"
    assert extra["reasoning_content"] and extra["reasoning"] == extra["reasoning_content"]
    assert msg.content == ""  # the random model never closes </think> within 40 tokens: all reasoning
    assert whole.choices[0].finish_reason == "length"
    u = whole.usage
    assert (u.completion_tokens, u.completion_tokens_details.reasoning_tokens) == (40, 40)
    assert u.prompt_tokens > 5 and u.total_tokens == u.prompt_tokens + 40

    chunks = _stream(
        keyed_server, "Why is the sky blue?", max_tokens=40, temperature=0, stream_options={"include_usage": True}
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks if c.choices)
    assert text == extra["reasoning_content"]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert all(d.model_extra.get("reasoning") == d.model_extra.get("reasoning_content") for d in deltas)
    assert "".join(d.content or "" for d in deltas) == ""  # reasoning never goes out as content too
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0  # the same prompt again: its prefix reused


def test_reasoning_tokens_count_only_the_reasoning(keyed_server):
    # the bias makes the model close its reasoning at once: one reasoning token (the tag), the rest answer
    model_id, url = keyed_server
    r = openai_client(url).chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=6,
        temperature=0,
        logit_bias={"151649": 100},
    )
    details = r.usage.completion_tokens_details
    assert (r.usage.completion_tokens, details.reasoning_tokens) == (6, 1)
    assert r.choices[0].message.content  # the rest is answer


def test_a_stop_string_ends_the_generation_not_just_the_text(plain_server):
    full = _ask(plain_server, "Tell me something.", max_tokens=48, temperature=0).choices[0].message.content
    stop = full[8:12]
    stopped = _ask(plain_server, "Tell me something.", max_tokens=400, temperature=0, stop=[stop])
    assert stopped.choices[0].finish_reason == "stop"
    # the engine was told to stop when the string appeared: it wrote a few tokens past it, not 400
    assert stopped.usage.completion_tokens < 100


def test_answer_goes_to_content_and_stop_strings_cut_it(plain_server):
    full = _ask(plain_server, "Tell me something.", max_tokens=48, temperature=0).choices[0].message.content
    assert len(full) > 20
    stop = full[12:16]
    cut = full.find(stop)
    stopped = _ask(plain_server, "Tell me something.", max_tokens=48, temperature=0, stop=[stop, "never appears"])
    assert stopped.choices[0].message.content == full[:cut]
    assert stopped.choices[0].finish_reason == "stop"
    chunks = _stream(plain_server, "Tell me something.", max_tokens=48, temperature=0, stop=stop)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == full[:cut]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_seed_replays_a_sampled_reply(plain_server):
    a = _ask(plain_server, "Write a poem.", max_tokens=30, temperature=1.0, seed=7).choices[0].message.content
    b = _ask(plain_server, "Write a poem.", max_tokens=30, temperature=1.0, seed=7).choices[0].message.content
    c = _ask(plain_server, "Write a poem.", max_tokens=30, temperature=1.0, seed=8).choices[0].message.content
    assert a == b and a != c


def test_follow_up_reuses_the_prefix_after_other_requests_and_stays_exact(plain_server):
    """Chat and API clients interleave on one KV cache: a conversation's later turn must not depend on
    what ran in between (the engine reuses only the common token prefix)."""
    first = _ask(plain_server, "Name a colour.", max_tokens=12, temperature=0).choices[0].message.content
    _ask(plain_server, "Something else entirely, longer than the first question.", max_tokens=12, temperature=0)
    model_id, url = plain_server
    history = [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "Another?"},
    ]
    after_other = openai_client(url).chat.completions.create(
        model=model_id, messages=history, max_tokens=12, temperature=0
    )
    again = openai_client(url).chat.completions.create(model=model_id, messages=history, max_tokens=12, temperature=0)
    assert after_other.choices[0].message.content == again.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1


# ---------------------------------------------------------------------------------------------- errors
def test_bad_requests_get_openai_shaped_errors_naming_the_field(keyed_server):
    model_id, url = keyed_server
    ok = {"model": model_id, "messages": [{"role": "user", "content": "hi"}]}
    assert "JSON" in error_body(raw_request(url, "POST", "/v1/chat/completions", content=b"{not json"), 400)["message"]
    assert (
        error_body(raw_request(url, "POST", "/v1/chat/completions", json_body={"model": model_id}), 400)["param"]
        == "messages"
    )
    for field, value in [
        ("temperature", 3),
        ("temperature", "hot"),
        ("n", 17),
        ("max_tokens", 0),
        ("stop", 5),
        ("stream", "yes"),
        ("top_p", 0),
        ("seed", 1.5),
    ]:
        err = error_body(raw_request(url, "POST", "/v1/chat/completions", json_body={**ok, field: value}), 400)
        assert err["param"] == field and field in err["message"], (field, err)
    both = {**ok, "max_completion_tokens": 5, "max_tokens": -1}  # an invalid one beside a valid one
    assert error_body(raw_request(url, "POST", "/v1/chat/completions", json_body=both), 400)["param"] == "max_tokens"
    bad_role = {**ok, "messages": [{"role": "function", "content": "x"}]}
    assert (
        error_body(raw_request(url, "POST", "/v1/chat/completions", json_body=bad_role), 400)["param"]
        == "messages[0].role"
    )
    no_call_id = {**ok, "messages": [{"role": "tool", "content": "x"}]}
    assert (
        error_body(raw_request(url, "POST", "/v1/chat/completions", json_body=no_call_id), 400)["param"]
        == "messages[0].tool_call_id"
    )
    image = {**ok, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    assert (
        error_body(raw_request(url, "POST", "/v1/chat/completions", json_body=image), 400)["param"]
        == "messages[0].content[0]"
    )
    with pytest.raises(openai.NotFoundError) as nf:
        openai_client(url).chat.completions.create(model="other", messages=[{"role": "user", "content": "hi"}])
    assert nf.value.body["code"] == "model_not_found" and nf.value.body["param"] == "model"


def test_text_that_is_not_unicode_and_json_nested_too_deep_get_a_400_not_a_500(keyed_server):
    """JSON's \\ud800 escapes decode to lone surrogates, which nothing downstream can encode (the model name
    echoed in an error, the tokenizer); a body nested 100,000 deep overflows the parser. Both were 500s with a
    traceback; an Authorization header that isn't UTF-8 was a 500 too."""
    model_id, url = keyed_server
    for body, param in [
        (b'{"model": "\\ud800", "messages": []}', "model"),
        (
            json.dumps(
                {"model": model_id, "messages": [{"role": "user", "content": "a\udc00"}]}, ensure_ascii=True
            ).encode(),
            "messages[0].content",
        ),
    ]:
        err = error_body(raw_request(url, "POST", "/v1/chat/completions", content=body), 400)
        assert err["param"] == param and "Unicode" in err["message"], err
    assert (
        "JSON" in error_body(raw_request(url, "POST", "/v1/chat/completions", content=b"[" * 100_000), 400)["message"]
    )
    assert (
        error_body(raw_request(url, "GET", "/v1/models", key=None, headers={"Authorization": "Bearer k\xff"}), 401)[
            "code"
        ]
        == "invalid_api_key"
    )
    assert _ask(keyed_server, "hi", max_tokens=2).choices[0].finish_reason  # and the server still answers


def test_a_listed_origin_gets_cors_headers_on_answers_errors_streams_and_preflights(keyed_server):
    """A browser shows a page only "a CORS error" for a response without Access-Control-Allow-Origin, so errors
    carry it too; a preflight that asks for the OpenAI JavaScript SDK's own x-stainless-* headers gets them
    allowed (else the browser never sends the request). Other origins get a 403 without them."""
    model_id, url = keyed_server
    ok = {"model": model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    origin = {"Origin": ORIGIN}
    cases = [
        (raw_request(url, "POST", "/v1/chat/completions", json_body=ok, headers=origin), 200),
        (raw_request(url, "POST", "/v1/chat/completions", json_body={**ok, "temperature": 9}, headers=origin), 400),
        (raw_request(url, "GET", "/v1/models", key=None, headers=origin), 401),
        (raw_request(url, "GET", "/v1/nothing", headers=origin), 404),
        (raw_request(url, "POST", "/v1/chat/completions", json_body={**ok, "stream": True}, headers=origin), 200),
    ]
    for reply, status in cases:
        assert reply.status_code == status and reply.headers.get("access-control-allow-origin") == ORIGIN, reply
    asked = "authorization,content-type,x-stainless-os,x-stainless-retry-count"
    pre = raw_request(
        url,
        "OPTIONS",
        "/v1/chat/completions",
        key=None,
        headers={**origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": asked},
    )
    assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == ORIGIN
    assert pre.headers["access-control-allow-headers"] == asked
    assert "Access-Control-Request-Headers" in pre.headers["vary"]
    other = raw_request(url, "POST", "/v1/chat/completions", json_body=ok, headers={"Origin": "http://evil.example"})
    assert other.status_code == 403 and "access-control-allow-origin" not in other.headers


def test_a_prompt_longer_than_the_context_is_refused(keyed_server):
    with pytest.raises(openai.BadRequestError) as err:
        _ask(keyed_server, "word " * 700, max_tokens=5)  # the server runs with a 512-token context
    assert err.value.body["code"] == "context_length_exceeded"


def test_keys_routes_methods_sizes_and_hosts(keyed_server):
    model_id, url = keyed_server
    ok = {"model": model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert error_body(raw_request(url, "GET", "/v1/models", key=None), 401)["code"] == "invalid_api_key"
    assert error_body(raw_request(url, "GET", "/v1/models", key="wrong"), 401)["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        _ask(keyed_server, "hi", key="wrong")
    assert error_body(raw_request(url, "GET", "/v1/nothing"), 404)["code"] == "not_found"
    assert error_body(raw_request(url, "GET", "/v1/chat/completions"), 405)["code"] == "method_not_allowed"
    huge = json.dumps({**ok, "messages": [{"role": "user", "content": "x" * (4 * 2**20 + 10)}]})
    assert (
        error_body(raw_request(url, "POST", "/v1/chat/completions", content=huge.encode()), 413)["code"]
        == "request_too_large"
    )
    # DNS rebinding: a page on evil.example resolving to 127.0.0.1 sends its own Host header
    err = error_body(
        raw_request(url, "POST", "/v1/chat/completions", json_body=ok, headers={"Host": "evil.example:80"}), 403
    )
    assert err["code"] == "forbidden_host"
    assert (
        raw_request(url, "POST", "/v1/chat/completions", json_body=ok, headers={"Host": "localhost"}).status_code == 200
    )
    health = raw_request(url, "GET", "/health", key=None)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert health.json()["last"] is None and raw_request(url, "GET", "/health").json()["last"]  # the key shows more
    assert "access-control-allow-origin" not in {k.lower() for k in health.headers}  # no CORS unless listed
    assert (
        error_body(raw_request(url, "GET", "/metrics", key=None), 401)["code"] == "invalid_api_key"
    )  # a key guards load
    assert "r1desk_requests_running 0.0" in raw_request(url, "GET", "/metrics").text


def test_a_full_queue_gets_429_and_disconnects_cancel(keyed_server):
    """One streaming request runs, two wait (--max-waiting 2): the fourth gets 429 with Retry-After. Closing
    the streams cancels their generations: the running one stops long before its 400 tokens."""
    model_id, url = keyed_server
    body = {"model": model_id, "messages": [{"role": "user", "content": "go"}], "max_tokens": 400, "stream": True}
    headers = {"Authorization": f"Bearer {KEY}"}

    async def scenario():
        base = url.removesuffix("/v1")
        async with aiohttp.ClientSession(base, headers=headers) as client:
            running = await client.post("/v1/chat/completions", json=body)
            first = await running.content.readline()  # the role chunk: the generation has started
            assert first.startswith(b"data: ")
            waiting = [
                asyncio.create_task(client.post("/v1/chat/completions", json={**body, "stream": False}))
                for _ in range(2)
            ]
            while True:  # yield to the two posts until the server has queued both
                async with client.get("/health") as h:
                    if (await h.json())["waiting"] >= 2:
                        break
            async with client.post("/v1/chat/completions", json=body) as full:
                result = Reply(full.status, {k.lower(): v for k, v in full.headers.items()}, await full.read())
            for t in waiting:
                t.cancel()
            running.close()
            await asyncio.gather(*waiting, return_exceptions=True)
            return result

    full = asyncio.run(scenario())
    assert error_body(full, 429)["code"] == "queue_full"
    assert full.headers["retry-after"].isdigit()
    deadline = time.monotonic() + 60
    while True:  # the server notices each hang-up and ends its request
        assert time.monotonic() < deadline, "the hung-up requests were never ended"
        health = raw_request(url, "GET", "/health").json()
        if not health["running"] and health["waiting"] == 0:
            break
    last = health["last"]
    assert last["finish_reason"] == "cancelled" and last["completion_tokens"] < 400


def test_four_concurrent_clients_each_get_their_own_whole_answer(plain_server):
    prompts = [f"Question number {i}?" for i in range(4)]
    alone = {p: _ask(plain_server, p, max_tokens=24, temperature=0).choices[0].message.content for p in prompts}
    together = {}

    def client(p):
        together[p] = _ask(plain_server, p, max_tokens=24, temperature=0).choices[0].message.content

    threads = [threading.Thread(target=client, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert together == alone


def test_serve_refuses_another_host_without_a_key(tiny_model):
    out = subprocess.run(
        [sys.executable, "-m", "desktop.cli", "serve", "--model", str(tiny_model), "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "--api-key" in out.stderr
