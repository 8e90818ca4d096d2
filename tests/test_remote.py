"""A model on another server (model_loader.remote.RemoteEngine, `r1desk-cli chat --remote`): against a real
`serve` (the same reply as the local engine), and against a scripted server that speaks the other dialects a
server may use for R1's reasoning (`reasoning`, `<think>` inside `content`), sends no usage, refuses the key,
errs mid-stream or drops the connection."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time

import pytest

from model_loader.events import Delta, Finished, GenerationControl, SamplingSettings
from model_loader.remote import RemoteEngine, RemoteError
from test_cli import cli


def test_chat_remote_gives_the_reply_the_local_engine_gives(tiny_server, tiny_model):
    model, url = tiny_server
    args = ["chat", "--prompt", "Why is the sky blue?", "--json", "--temperature", "0", "--max-new-tokens", "12"]
    remote = json.loads(cli(*args, "--model", model, "--remote", url).stdout)
    local = json.loads(cli(*args, "--model", tiny_model, "--device", "cpu", "--context", "512").stdout)
    assert remote["reasoning"] == local["reasoning"] and remote["reasoning"]
    assert remote["completion_tokens"] == 12 and remote["finish_reason"] == "max_new_tokens"


def test_cancel_ends_the_remote_reply_with_what_came(tiny_server):
    model, url = tiny_server
    engine = RemoteEngine(url, model)
    control = GenerationControl()
    texts = []
    for ev in engine.generate(
        [{"role": "user", "content": "hi"}], SamplingSettings(temperature=0, max_new_tokens=300), control
    ):
        if isinstance(ev, Delta):
            texts.append(ev.text)
            if len(texts) == 3:
                control.cancel()
        elif isinstance(ev, Finished):
            done = ev
    assert done.stats.finish_reason == "cancelled" and done.reasoning == "".join(texts)
    assert engine.models() == [model]


def test_stop_thinking_continues_the_reply_with_its_reasoning_closed(tiny_server):
    """r1desk's server continues an assistant message with its reasoning closed (continue_final_message with
    reasoning_content): the client hangs up on the reasoning and the same reply goes on as its answer."""
    model, url = tiny_server
    engine = RemoteEngine(url, model)
    engine.warm_up()
    assert engine.info.continues  # its model list says r1desk
    control = GenerationControl()
    deltas = []
    for ev in engine.generate(
        [{"role": "user", "content": "hi"}], SamplingSettings(temperature=0, max_new_tokens=40), control
    ):
        if isinstance(ev, Delta):
            deltas.append(ev)
            if len(deltas) == 3:
                control.stop_thinking()
        elif isinstance(ev, Finished):
            done = ev
    kinds = [d.kind for d in deltas]
    assert kinds[:3] == ["reasoning"] * 3 and "answer" in kinds
    assert kinds == sorted(kinds, key=lambda k: k == "answer")  # reasoning, then only answer
    assert done.reasoning == "".join(d.text for d in deltas if d.kind == "reasoning")
    assert done.answer == "".join(d.text for d in deltas if d.kind == "answer") != ""
    assert done.stats.stopped_thinking and done.stats.completion_tokens <= 40
    assert done.text == f"{done.reasoning}</think>\n\n{done.answer}"


def test_a_server_that_is_not_r1desk_is_not_asked_to_continue(scripted):
    url, script = scripted
    engine = RemoteEngine(url, "m")
    engine.warm_up()
    assert not engine.info.continues
    script.update(status=200, drop=False, lines=[_chunk(reasoning="a"), _chunk(reasoning="b"), "data: [DONE]"])
    control = GenerationControl()
    control.stop_thinking()  # asked for, but this server can't continue: the reply goes on as it is
    done = list(engine.generate([{"role": "user", "content": "q"}], control=control))[-1]
    assert done.reasoning == "ab" and not done.stats.stopped_thinking


def test_the_servers_load_from_its_metrics(tiny_server, scripted):
    model, url = tiny_server
    ours = RemoteEngine(url, model).server_metrics()
    assert ours == {"running": 0, "waiting": 0, "slots": 1, "kv_cache_usage": None}  # one at a time: no paged cache
    theirs = RemoteEngine(scripted[0], "m").server_metrics()  # vLLM's names, summed over its engines
    assert theirs == {"running": 3, "waiting": 2, "slots": None, "kv_cache_usage": 0.25}
    assert RemoteEngine("http://127.0.0.1:9/v1", "m", timeout=2).server_metrics() is None  # unreachable: no figures


VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
"""


# ---------------------------------------------------------------------------------------------- scripted
class Script(http.server.BaseHTTPRequestHandler):
    """Answers each POST with the SSE lines (or the status) the test put in `script`."""

    script: dict = {}

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, lines = self.script["status"], self.script["lines"]
        time.sleep(self.script.get("delay", 0))  # a server slow to its first byte (a long prompt, a queue)
        self.send_response(status)
        self.send_header("Content-Type", "text/event-stream" if status == 200 else "application/json")
        self.end_headers()
        for line in lines:
            self.wfile.write(line.encode() + b"\n\n")
            self.wfile.flush()
        if self.script.get("drop"):
            self.connection.shutdown(socket.SHUT_RDWR)

    def do_GET(self):  # noqa: N802 - the model list and /metrics, as another server (vLLM) writes them
        if self.path == "/metrics":
            body = VLLM_METRICS.encode()
        else:
            body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain" if self.path == "/metrics" else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def scripted():
    Script.script.clear()  # each test's script alone (a delay set by one must not slow the next)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Script)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", Script.script
    httpd.shutdown()


def _chunk(**delta):
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})


def _run(url):
    events = list(RemoteEngine(url, "m").generate([{"role": "user", "content": "q"}]))
    return events[-1], [e for e in events if isinstance(e, Delta)]


def test_reasoning_in_its_own_field_under_either_name(scripted):
    url, script = scripted
    script.update(
        status=200,
        drop=False,
        lines=[
            _chunk(role="assistant", content=""),
            _chunk(reasoning="thinking "),
            _chunk(reasoning_content="hard"),
            _chunk(content="42"),
            "data: [DONE]",
        ],
    )
    done, deltas = _run(url)
    assert (done.reasoning, done.answer) == ("thinking hard", "42")
    assert [d.kind for d in deltas] == ["reasoning", "reasoning", "answer"]
    assert done.stats.completion_tokens == 3  # no usage sent: counted from the deltas


def test_ollamas_thinking_field_and_a_slow_first_byte(scripted):
    url, script = scripted
    script.update(
        status=200,
        drop=False,
        delay=1.5,
        lines=[_chunk(thinking="hmm "), _chunk(thinking="ok"), _chunk(content="4"), "data: [DONE]"],
    )
    done, _ = _run(url)
    assert (done.reasoning, done.answer) == ("hmm ok", "4")
    assert done.stats.ttft_ms >= 1500  # the wait counts in the time to first token, and nothing timed out


def test_think_tags_inside_content(scripted):
    url, script = scripted
    script.update(
        status=200,
        drop=False,
        lines=[
            _chunk(content="<thi"),
            _chunk(content="nk>\nstep one"),
            _chunk(content=" done</think>\n\nThe answer"),
            "data: [DONE]",
        ],
    )
    done, _ = _run(url)
    assert (done.reasoning, done.answer) == ("\nstep one done", "The answer")  # R1's blank line dropped, as locally
    script.update(lines=[_chunk(content="<b>bold</b> plain answer"), "data: [DONE]"])  # not a think tag
    done, _ = _run(url)
    assert (done.reasoning, done.answer) == ("", "<b>bold</b> plain answer")


@pytest.mark.parametrize("status,words", [(401, "API key"), (404, "no model"), (500, "500")])
def test_refusals_say_what_the_server_said(scripted, status, words):
    url, script = scripted
    script.update(status=status, drop=False, lines=[json.dumps({"error": {"message": "nope"}})])
    with pytest.raises(RemoteError) as err:
        _run(url)
    assert words in str(err.value) and "nope" in str(err.value)


def test_an_error_mid_stream_and_a_dropped_connection_keep_what_came(scripted):
    url, script = scripted
    script.update(status=200, drop=False, lines=[_chunk(content="partial"), 'data: {"error": {"message": "boom"}}'])
    seen = []
    with pytest.raises(RemoteError, match="boom"):
        for ev in RemoteEngine(url, "m").generate([{"role": "user", "content": "q"}]):
            seen.append(ev)
    assert [e.text for e in seen if isinstance(e, Delta)] == ["partial"]
    script.update(lines=[_chunk(content="half a rep")], drop=True)
    with pytest.raises(RemoteError, match="before the reply's end|dropped"):
        _run(url)


def test_a_server_that_is_not_there():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(RemoteError, match="could not reach"):
        _run(f"http://127.0.0.1:{port}/v1")
    with pytest.raises(RemoteError, match="not an http"):
        RemoteEngine("ftp://x/v1", "m")
