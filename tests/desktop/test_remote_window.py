"""The window as a client of a model server: a real `r1desk-cli serve` on the tiny model (CPU), added through
the Add server dialog, its key in the (in-memory) keyring; a reply streamed from it, folded and saved as a local
one; and a server that dies mid-reply."""

import json

import pytest
from PySide6.QtCore import Qt
from serving import API_KEY, serve

from desktop.engine_status import model_title
from desktop.settings import AppSettings
from desktop.servers import KeyStore, Server, servers_to_json


def remote_settings(url: str, model_id: str) -> dict:
    servers = servers_to_json([Server("Lab", url, False, [model_id])])
    return dict(servers=servers, remote_server=url, remote_model=model_id)


def test_a_reply_from_a_server_streams_folds_and_is_saved(qtbot, make_window, lab, profile, system_keyring):
    model_id, url = lab
    KeyStore(profile / "config" / "r1desk-keys").set(url, API_KEY)
    win = make_window(max_new_tokens=24, **remote_settings(url, model_id))
    assert win.engine_info["device"] == "remote"
    assert win.topbar.status_label.text() == f"Ready · {model_title(model_id)} · server at {url.split('/')[2]}"
    win.set_live_visible(True)
    assert win.live.values["weights"].text() == "on the server"
    # the server's load from its /metrics, read off the GUI thread while the panel is open
    qtbot.waitUntil(lambda: win.live.server_figures is not None, timeout=10000)
    assert win.live.section_heads["batch"].text() == "Server" and win.live.values["running"].text() == "0 of 1 / 0"
    with qtbot.waitSignal(win.reply_finished, timeout=60000) as done:
        assert win.send("What is 2 + 2?")
    msg = done.args[0]
    assert msg["reasoning"]  # R1's template opens the reasoning: it came back as reasoning_content
    assert msg["content"].startswith(msg["reasoning"])
    stats = json.loads(msg["stats"]) if isinstance(msg["stats"], str) else msg["stats"]
    assert stats["completion_tokens"] == 24 and stats["finish_reason"] == "max_new_tokens"
    assert stats["prompt_tokens"] > 0  # the server's usage counts
    widget = win.chat.widgets[-1]
    assert widget.reasoning_block is not None


def test_a_wrong_key_says_so_and_offers_a_way_out(qtbot, make_window, lab, system_keyring):
    model_id, url = lab  # no key stored for it
    win = make_window(wait_ready=False, **remote_settings(url, model_id))
    qtbot.waitUntil(lambda: win.engine_state == "failed", timeout=30000)
    assert "refused the API key" in win.banner.label.text()
    assert [b.text() for b in win.banner.action_buttons()] == ["Try again", "Settings…"]


def test_a_server_that_dies_mid_reply_keeps_the_partial_reply_and_says_why(
    qtbot, make_window, tiny_model, system_keyring
):
    proc, model_id, url = serve(tiny_model)
    try:
        win = make_window(max_new_tokens=400, **remote_settings(url, model_id))
        with qtbot.waitSignal(win.reply_failed, timeout=60000) as failed:
            assert win.send("Tell me a long story.")
            qtbot.waitUntil(lambda: win.stream is not None and bool(win.stream.reasoning), timeout=30000)
            proc.kill()
        assert "dropped mid-reply" in failed.args[1] or "closed the connection" in failed.args[1]
        saved = win.store.messages(win.conv_id)[-1]
        assert saved["role"] == "assistant" and saved["reasoning"]  # what came is kept
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_stop_thinking_on_a_server_continues_the_reply_as_its_answer(qtbot, make_window, lab, profile, system_keyring):
    model_id, url = lab
    KeyStore(profile / "config" / "r1desk-keys").set(url, API_KEY)
    win = make_window(max_new_tokens=60, **remote_settings(url, model_id))
    assert win.engine_info["continues"]  # an r1desk server
    with qtbot.waitSignal(win.reply_finished, timeout=60000) as done:
        assert win.send("What is 2 + 2?")
        qtbot.waitUntil(lambda: win.stream is not None and len(win.stream.reasoning) > 0, timeout=30000)
        button = win.composer.stop_thinking_btn
        qtbot.waitUntil(button.isVisible, timeout=10000)
        assert button.isEnabled()
        qtbot.mouseClick(button, Qt.LeftButton)
    msg = done.args[0]
    stats = json.loads(msg["stats"]) if isinstance(msg["stats"], str) else msg["stats"]
    assert stats["stopped_thinking"] and msg["reasoning"] and msg["answer"]
    assert msg["content"] == f"{msg['reasoning']}</think>\n\n{msg['answer']}"


def test_a_server_that_cannot_continue_says_so_on_the_stop_thinking_button(make_window, lab, system_keyring):
    """The window's rule for a server without continuation (its model list doesn't say r1desk): the button is
    shown while the model reasons, but not offered, and its tooltip says why."""
    model_id, url = lab
    win = make_window(start=False, **remote_settings(url, model_id))
    win.engine_info = {"device": "remote", "continues": False}
    win.update_composer()
    button = win.composer.stop_thinking_btn
    assert not button.isEnabled() and "can't continue a reply" in button.toolTip()
    win.engine_info = {"device": "remote", "continues": True}
    win.update_composer()
    assert button.isEnabled()


def test_the_self_test_runs_against_a_server(tmp_path, lab):
    """`r1desk --remote URL --model NAME --api-key-file F --self-test`: scripted use of a server's model."""
    from test_app_selftest import _run

    model_id, url = lab
    key_file = tmp_path / "key"
    key_file.write_text(API_KEY + "\n")
    args = ["--remote", url, "--model", model_id, "--self-test", "--max-new-tokens", "8", "--prompt", "Hi"]
    out = _run([*args, "--api-key-file", str(key_file)], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"model={model_id} device=remote tokens=8" in out.stdout
    refused = _run(args, tmp_path)  # no key: the server says no, and the self-test says why
    assert refused.returncode == 1 and "refused the API key" in refused.stderr
    assert not (tmp_path / "c" / "r1desk-keys").exists()  # a key given for a run is not stored


def test_remote_needs_the_models_name_and_a_key_file_needs_remote(capsys):
    from desktop.app import parse_args

    for argv in (["--remote", "http://gpu-box:8089/v1"], ["--api-key-file", "k", "--model", "m"]):
        with pytest.raises(SystemExit):
            parse_args(argv)
    assert "--api-key-file goes with --remote" in capsys.readouterr().err


def test_the_top_bar_picks_a_servers_model_and_a_chat_remembers_which_model_answered(
    qtbot, make_window, lab, profile, system_keyring
):
    import fakes

    model_id, url = lab
    KeyStore(profile / "config" / "r1desk-keys").set(url, API_KEY)
    win = make_window(
        engine=fakes.FakeEngine(token_s=0.0), max_new_tokens=16, servers=remote_settings(url, model_id)["servers"]
    )
    picker = win.topbar.model_picker
    labels = [picker.itemText(i) for i in range(picker.count())]
    assert labels == ["DeepSeek-R1-Distill-Qwen-1.5B · this computer", f"{model_id} · Lab"]
    assert not picker.isHidden() and picker.currentIndex() == 0
    with qtbot.waitSignal(win.reply_finished, timeout=30000):
        win.send("A local question")
    local_chat = win.conv_id
    picker.activated.emit(1)  # the user picks the server's model
    qtbot.waitUntil(lambda: win.engine_state == "ready" and win.engine_info["device"] == "remote", timeout=30000)
    assert win.settings.remote_model == model_id and win.settings.remote_server == url
    assert AppSettings.load(win.qs).remote_model == model_id  # kept for the next start
    win.new_chat()
    with qtbot.waitSignal(win.reply_finished, timeout=60000):
        win.send("A question for the server")
    remote_chat = win.conv_id
    win.open_conversation(local_chat)  # answered by the local model: the notice offers it back
    assert (
        win.banner.kind == "chat_model" and "DeepSeek-R1-Distill-Qwen-1.5B · this computer" in win.banner.label.text()
    )
    (use,) = win.banner.action_buttons()
    qtbot.mouseClick(use, Qt.LeftButton)
    qtbot.waitUntil(lambda: win.engine_state == "ready" and win.engine_info["device"] != "remote", timeout=30000)
    assert not win.banner.isVisible() and win.settings.model_key() == ""
    win.open_conversation(remote_chat)
    assert win.banner.kind == "chat_model" and f"{model_id} · Lab" in win.banner.label.text()


@pytest.fixture
def other_server():
    """A scripted OpenAI-compatible server that is not r1desk (tests/test_remote.py's): the dialect it speaks is
    the test's."""
    import http.server
    import threading

    from test_remote import Script

    Script.script.clear()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Script)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", Script.script
    httpd.shutdown()


def test_a_server_without_a_reasoning_parser_still_folds_the_reasoning(qtbot, make_window, other_server):
    """<think> inside `content`, no usage, a slow first byte: the window folds the reasoning as for a local model."""
    from test_remote import _chunk

    url, script = other_server
    script.update(
        status=200,
        drop=False,
        delay=0.5,
        lines=[
            _chunk(content="<think>\nLet me add: "),
            _chunk(content="2 + 2 = 4.\n</think>\n\n"),
            _chunk(content="**4**"),
            "data: [DONE]",
        ],
    )
    win = make_window(**remote_settings(url, "m"))
    assert not win.engine_info["continues"]  # not r1desk: stop thinking is not offered
    with qtbot.waitSignal(win.reply_finished, timeout=30000) as done:
        win.send("What is 2 + 2?")
    msg = done.args[0]
    assert (msg["reasoning"], msg["answer"]) == ("\nLet me add: 2 + 2 = 4.\n", "**4**")
    assert win.chat.widgets[-1].reasoning_block is not None
    stats = msg["stats"]
    assert stats["completion_tokens"] == 3 and stats["ttft_ms"] >= 500  # counted from the pieces: no usage sent


def test_stop_ends_a_servers_reply_and_keeps_what_came(qtbot, make_window, lab, profile, system_keyring):
    model_id, url = lab
    KeyStore(profile / "config" / "r1desk-keys").set(url, API_KEY)
    win = make_window(max_new_tokens=400, **remote_settings(url, model_id))
    with qtbot.waitSignal(win.reply_finished, timeout=60000) as done:
        win.send("Tell me a long story.")
        qtbot.waitUntil(lambda: win.stream is not None and len(win.stream.reasoning) > 20, timeout=30000)
        win.stop()
    msg = done.args[0]
    assert msg["stats"]["finish_reason"] == "cancelled" and msg["reasoning"]
    assert msg["stats"]["completion_tokens"] < 400
