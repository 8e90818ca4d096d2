"""The local API server inside the window: the Settings switch starts and stops it on the window's own asyncio
loop (qasync), the header shows its address, API requests land in the live panel's request log (not as chats),
and a chat reply waits its turn behind an API request in the engine service's queue."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import threading
import urllib.error
import urllib.request

import openai
import pytest


@pytest.fixture
def running_loop(qapp):
    """The app's loop (qasync's, desktop.fastloop) over the Qt loop pytest-qt spins, marked running as app.main's
    is (aiohttp needs it)."""
    from desktop.fastloop import FastQEventLoop

    loop = FastQEventLoop(qapp, already_running=True)
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.events._set_running_loop(None)
    asyncio.set_event_loop(None)


class InThread:
    """Run a blocking client call off the GUI thread (the server answers on the GUI thread's loop)."""

    def __init__(self, fn):
        self.result = self.error = None
        self.done = False

        def run():
            try:
                self.result = fn()
            except BaseException as err:  # reported by the test
                self.error = err
            self.done = True

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()


def _serving(win) -> str:
    return win.api.url


def test_settings_switch_starts_and_stops_the_server_and_requests_show_in_the_log(
    qtbot, make_window, tiny_model, running_loop
):
    win = make_window(model=tiny_model, api_enabled=True, api_port=0)
    qtbot.waitUntil(lambda: win.api.label.isVisible(), timeout=20000)
    url = _serving(win)
    port = win.api.server.port
    assert win.api.label.text() == f"API: 127.0.0.1:{port}" and url == f"http://127.0.0.1:{port}/v1"
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
    call = InThread(
        lambda: client.chat.completions.create(
            model=win.service.model_name, messages=[{"role": "user", "content": "hello"}], max_tokens=20, temperature=0
        )
    )
    qtbot.waitUntil(lambda: call.done, timeout=60000)
    assert call.error is None, call.error
    assert call.result.usage.completion_tokens == 20
    assert call.result.choices[0].message.model_extra["reasoning_content"]
    qtbot.waitUntil(lambda: win.live.log.count() == 1, timeout=5000)
    line = win.live.log.item(0).text()
    assert "20 tok" in line and "TTFT" in line and "tok/s" in line and line.endswith("· OpenAI/Python")
    assert win.store.conversations() == []  # API requests are not chats

    win.apply_settings(dataclasses.replace(win.settings, api_enabled=False))
    qtbot.waitUntil(lambda: not win.api.label.isVisible() and win.api.server is None, timeout=10000)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    # and back on, on a port of the user's choosing
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    win.apply_settings(dataclasses.replace(win.settings, api_enabled=True, api_port=free, api_key="k1"))
    qtbot.waitUntil(lambda: win.api.label.text() == f"API: 127.0.0.1:{free}", timeout=10000)
    probe = InThread(lambda: urllib.request.urlopen(f"http://127.0.0.1:{free}/v1/models", timeout=30))
    qtbot.waitUntil(lambda: probe.done, timeout=30000)
    assert isinstance(probe.error, urllib.error.HTTPError) and probe.error.code == 401  # the key applies
    # origins as a user may type them (a trailing slash, one twice): one restart to take them, and none for a
    # later change to something else (a restart cancels the API requests in flight)
    win.apply_settings(dataclasses.replace(win.settings, api_origins="http://a.example/, http://a.example"))
    qtbot.waitUntil(
        lambda: win.api.server is not None and win.api.server.allowed_origins == {"http://a.example"}, timeout=10000
    )
    server = win.api.server
    win.apply_settings(dataclasses.replace(win.settings, temperature=0.3))
    qtbot.waitUntil(lambda: win.api._task is None or win.api._task.done(), timeout=10000)
    assert win.api.server is server


def test_a_chat_reply_waits_behind_an_api_request(qtbot, make_window, tiny_model, running_loop):
    win = make_window(model=tiny_model, api_enabled=True, api_port=0, max_new_tokens=40)
    qtbot.waitUntil(lambda: win.api.label.isVisible(), timeout=20000)
    client = openai.OpenAI(base_url=_serving(win), api_key="unused", max_retries=0, timeout=120)
    order = []

    def api_call():
        parts = []
        for chunk in client.chat.completions.create(
            model=win.service.model_name,
            stream=True,
            max_tokens=300,
            messages=[{"role": "user", "content": "a long one"}],
        ):
            if chunk.choices:
                delta = chunk.choices[0].delta  # reasoning, and the answer if a sampled </think> ended it early
                parts.append((delta.model_extra.get("reasoning_content") or "") + (delta.content or ""))
        order.append("api")
        return "".join(parts)

    call = InThread(api_call)
    qtbot.waitUntil(lambda: win.service.running is not None and win.service.running.client == "api", timeout=30000)
    assert win.send("hello")
    widget = win.stream.widget
    assert widget.meta.text() == "waiting for 1 API request…"
    with qtbot.waitSignal(win.reply_finished, timeout=120000) as done:
        pass
    order.append("chat")
    qtbot.waitUntil(lambda: call.done, timeout=30000)
    assert call.error is None, call.error
    assert order == ["api", "chat"]
    assert len(call.result) > 100  # the API client got its whole reply (300 tokens), not cut by the chat
    assert done.args[0]["complete"] and done.args[0]["stats"]["completion_tokens"] > 0
    assert widget.meta.text() != "waiting for 1 API request…"


def test_requests_before_the_model_is_ready_get_503(qtbot, make_window, running_loop):
    import fakes

    win = make_window(
        engine=fakes.FakeEngine(), load_chunk_s=0.05, wait_ready=False, api_enabled=True, api_port=0
    )  # 200 chunks x 50 ms: ten seconds of "loading"
    qtbot.waitUntil(lambda: win.api.label.isVisible(), timeout=10000)
    probe = InThread(lambda: urllib.request.urlopen(win.api.url + "/models", timeout=30))
    qtbot.waitUntil(lambda: probe.done, timeout=30000)
    err = probe.error
    assert win.engine_state == "loading"
    assert isinstance(err, urllib.error.HTTPError) and err.code == 503, err
    assert err.headers["Retry-After"].isdigit()
    assert json.loads(err.read())["error"]["code"] == "model_not_ready"


def test_with_two_replies_at_once_a_chat_reply_runs_beside_an_api_request(qtbot, make_window, tiny_model, running_loop):
    """Settings → Replies at once 2: the window's reply does not wait for the API's long one; it finishes first,
    and the API client still gets its whole reply."""
    win = make_window(model=tiny_model, api_enabled=True, api_port=0, max_new_tokens=20, max_parallel=2)
    qtbot.waitUntil(lambda: win.api.label.isVisible(), timeout=20000)
    assert win.service.parallel == 2
    client = openai.OpenAI(base_url=_serving(win), api_key="unused", max_retries=0, timeout=120)
    order = []

    def api_call():
        chunks = list(
            client.chat.completions.create(
                model=win.service.model_name,
                stream=True,
                max_tokens=400,
                temperature=0,
                messages=[{"role": "user", "content": "long"}],
            )
        )
        order.append("api")
        return chunks

    call = InThread(api_call)
    qtbot.waitUntil(lambda: win.service.running is not None and win.service.running.client == "api", timeout=30000)
    assert win.send("hello")
    assert win.stream.widget.meta.text() != "waiting for 1 API request…"
    with qtbot.waitSignal(win.reply_finished, timeout=120000) as done:
        pass
    order.append("chat")
    qtbot.waitUntil(lambda: call.done, timeout=60000)
    assert call.error is None, call.error
    assert order == ["chat", "api"]
    assert done.args[0]["complete"] and done.args[0]["stats"]["completion_tokens"] == 20
    assert [c for c in call.result if c.choices and c.choices[0].finish_reason][0].choices[0].finish_reason == "length"
    # the live panel: its "Replies at once" rows, and "This reply" is the chat's own (the newest request), not a
    # mix of the two replies' tokens
    live = win.live
    live.show()
    live.refresh()
    assert live.section_heads["batch"].isVisible()
    assert live.values["running"].text() == "0 of 2 / 0"
    assert live.values["blocks"].text().startswith("0 / ")
    reasoning, answer = (int(x) for x in live.values["tokens"].text().split(" + "))
    assert reasoning + answer == 20
