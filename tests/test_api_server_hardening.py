"""The server against what is not an ordinary client: a web page's requests (a form-like POST needs no CORS
preflight), bodies that aren't JSON, a key kept off the command line, other model names, a request asking for
more tokens than the context has room for, a failure's text kept out of answers, and Ctrl+C with a stream open.
`serve` on the tiny model (CPU), driven by raw HTTP and the `openai` client."""

from __future__ import annotations

import argparse
import json
import signal
import time
from urllib.parse import urlsplit

import openai
import pytest

from serving import openai_client, error_body, raw_request, serve, stop

KEY = "key-from-a-file"


@pytest.fixture(scope="module")
def key_file_server(tiny_model, tmp_path_factory):
    key_file = tmp_path_factory.mktemp("key") / "api-key"
    key_file.write_text(KEY + "\n")
    proc, model_id, url = serve(
        tiny_model, "--api-key-file", str(key_file), "--served-model-name", "r1-small", "deepseek-r1"
    )
    yield model_id, url
    stop(proc)


def _tokens_generated(url) -> float:
    for line in raw_request(url, "GET", "/metrics", key=KEY).text.splitlines():
        if line.startswith("r1desk_generation_tokens_total"):
            return float(line.split()[-1])
    return 0.0


def _body(model_id, **kw):
    return {"model": model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **kw}


def test_a_web_pages_request_does_nothing_whatever_its_content_type(key_file_server):
    model_id, url = key_file_server
    before = _tokens_generated(url)
    form_like = json.dumps(_body(model_id)).encode()
    for content_type in ("text/plain", "application/json"):
        r = raw_request(
            url,
            "POST",
            "/v1/chat/completions",
            key=KEY,
            content=form_like,
            headers={"Content-Type": content_type, "Origin": "https://evil.example"},
        )
        assert error_body(r, 403)["code"] == "forbidden_origin"
    preflight = raw_request(
        url,
        "OPTIONS",
        "/v1/chat/completions",
        key=None,
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers
    assert _tokens_generated(url) == before  # nothing was generated


def test_a_body_that_is_not_declared_json_is_a_415(key_file_server):
    model_id, url = key_file_server
    body = json.dumps(_body(model_id)).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        r = raw_request(
            url, "POST", "/v1/chat/completions", key=KEY, content=body, headers={"Content-Type": content_type}
        )
        assert error_body(r, 415)["code"] == "unsupported_media_type"
    ok = raw_request(
        url,
        "POST",
        "/v1/chat/completions",
        key=KEY,
        content=body,
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert ok.status_code == 200, ok.text


def test_the_key_from_a_file_guards_the_api(key_file_server):
    model_id, url = key_file_server
    assert error_body(raw_request(url, "GET", "/v1/models", key=None), 401)["code"] == "invalid_api_key"
    assert error_body(raw_request(url, "GET", "/v1/models", key="wrong"), 401)["code"] == "invalid_api_key"
    assert raw_request(url, "GET", "/v1/models", key=KEY).status_code == 200


def test_api_key_sources_in_order_and_a_bad_file_is_an_error(tmp_path, monkeypatch):
    from model_loader.cli import api_key_of

    def args(**kw):
        return argparse.Namespace(**{"api_key": None, "api_key_file": None, **kw})

    monkeypatch.setenv("R1DESK_API_KEY", "from-env")
    key_file = tmp_path / "k"
    key_file.write_text("from-file\nsecond line ignored\n")
    assert api_key_of(args(api_key="given", api_key_file=str(key_file))) == "given"
    assert api_key_of(args(api_key_file=str(key_file))) == "from-file"
    assert api_key_of(args()) == "from-env"
    monkeypatch.delenv("R1DESK_API_KEY")
    assert api_key_of(args()) is None
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        api_key_of(args(api_key_file=str(tmp_path / "empty")))
    with pytest.raises(ValueError, match="could not read"):
        api_key_of(args(api_key_file=str(tmp_path / "missing")))


def test_served_model_names_are_the_ids_clients_use(key_file_server, tiny_model):
    model_id, url = key_file_server
    client = openai_client(url, KEY)
    assert model_id == "r1-small"
    assert [m.id for m in client.models.list()] == ["r1-small", "deepseek-r1"]
    r = client.chat.completions.create(model="deepseek-r1", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.model == "deepseek-r1"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model=tiny_model.name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )


def test_prompt_plus_max_tokens_past_the_context_is_a_400_with_the_numbers(key_file_server):
    model_id, url = key_file_server
    client = openai_client(url, KEY)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "hi"}], max_tokens=510)
    assert err.value.body["code"] == "context_length_exceeded"
    assert "512" in err.value.body["message"] and "510" in err.value.body["message"]
    # without max_tokens: the rest of the context, never a 400
    r = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=2
    )
    assert r.usage.completion_tokens == 2


def test_a_failure_inside_the_server_answers_a_generic_500():
    import asyncio

    from aiohttp.test_utils import make_mocked_request

    from desktop.api.server import ApiServer, _generation_error

    async def broken(request):
        raise RuntimeError("secret detail /home/someone/model")

    class NoService:  # the middleware under test needs no service; the metrics it makes listen to one
        info = None

        class request_ended:
            connect = staticmethod(lambda slot: None)

    key_file_server = ApiServer(NoService())
    response = asyncio.run(key_file_server._errors(make_mocked_request("GET", "/v1/models"), broken))
    assert response.status == 500
    body = json.loads(response.body)
    assert body["error"]["code"] == "internal_error" and "secret" not in response.text
    err = _generation_error("internal", "generation failed: RuntimeError: secret detail")
    assert err.status == 500 and "secret" not in err.message


def test_a_host_that_only_ends_in_localhost_is_not_loopback(key_file_server):
    from desktop.api.server import is_loopback

    model_id, url = key_file_server
    assert not is_loopback("evillocalhost") and is_loopback("app.localhost") and is_loopback("127.0.0.5")
    r = raw_request(url, "GET", "/v1/models", key=KEY, headers={"Host": "evillocalhost"})
    assert error_body(r, 403)["code"] == "forbidden_host"


def test_ctrl_c_with_a_stream_open_ends_it_with_an_error_event_and_exits_at_once(tiny_model):
    """The stream asks for the whole 4k context (seconds of decoding on the CPU): the signal lands mid-stream.
    The client gets a last error event and [DONE]; the process exits within 2 s of the signal."""
    proc, model_id, url = serve(tiny_model, "--context", "4096")
    try:
        import http.client

        u = urlsplit(url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        body = {
            "model": model_id,
            "messages": [{"role": "user", "content": "go on"}],
            "stream": True,
            "max_tokens": 4000,
        }
        conn.request(
            "POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        assert resp.status == 200
        for _ in range(3):  # a few tokens in: the generation runs
            assert resp.readline().startswith(b"data: ")
            resp.readline()
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rest = resp.read().decode()
        assert proc.wait(timeout=30) == 0, proc.stderr.read()[-3000:]
        took = time.monotonic() - sent
        events = [line[6:] for line in rest.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["code"] == "server_shutdown"
        assert took < 2.0, f"exited {took:.1f} s after Ctrl+C"
    finally:
        if proc.poll() is None:
            proc.kill()
