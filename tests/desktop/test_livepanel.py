"""The live panel (desktop.livepanel) in the window: its figures as a reply streams and after it, and its fit
beside the chat in a narrow window. Its clock row: test_livepanel_clock.py; its figures without widgets:
test_live_figures.py."""

from __future__ import annotations

from PySide6.QtCore import Qt

from desktop.live_figures import memory_read
from fakes import FAKE_KV_TOKEN, FAKE_WEIGHT_READ, FakeEngine, reply


def test_live_panel_numbers(qtbot, make_window):
    # 4 tokens per delta: the live counts must come from the engine's token count, not from counting deltas
    engine = FakeEngine(token_s=0.002, tokens_per_delta=4, prefill_s=0.5)
    win = make_window(engine=engine)
    win.topbar.live_btn.setChecked(True)
    assert win.live.timer.interval() >= 100  # a few times a second, never per token
    reply(qtbot, win, "hello")  # a first exchange, so the second reply reuses a prefix and shows it
    deltas = []
    win.service.host.worker.delta.connect(lambda *a: deltas.append(a), Qt.DirectConnection)  # counted as emitted
    win.send("and again")
    v = win.live.values
    # context use shows as soon as the prompt is prefilled, before the first token and throughout the reply
    prompt, reused = 40 + 30 * 3, 30 * 3 - 10  # the fake engine's numbers for a 3-message prompt
    qtbot.waitUntil(lambda: v["reused"].text() == f"{reused} of {prompt}", timeout=10000)
    assert win.stream is not None and win.live.reply.first_t is None  # still prefilling: no token yet
    assert v["ctx"].text() == f"{prompt} / 4,096 (3%)"
    qtbot.waitUntil(lambda: win.live.reply.count >= 60, timeout=10000)
    assert win.stream is not None  # mid-reply
    win.live.refresh()
    r = win.live.reply
    used = prompt + r.count
    assert v["ctx"].text() == f"{used} / 4,096 ({100 * used / 4096:.0f}%)"
    assert v["tokens"].text() == f"{r.reasoning_n} + {r.answer_n}" and r.reasoning_n + r.answer_n == r.count
    # what a decode step reads, live: the model's weights (engine info) and the cache up to the average step so far
    cache = FAKE_KV_TOKEN * (prompt + r.count / 2)
    assert v["read"].text() == f"{(FAKE_WEIGHT_READ + cache) / 1e9:.2f} GB"
    assert v["read_rate"].text().endswith("B/s") and f"{cache / 1e9:.2f} GB of KV cache" in v["read"].toolTip()
    qtbot.waitUntil(lambda: v["rate"].text() not in ("—", "0"), timeout=10000)
    assert int(v["rate"].text()) > 200  # ~450 tok/s of tokens; counting deltas would say ~115
    assert v["ttft"].text().endswith("ms")
    with qtbot.waitSignal(win.reply_finished, timeout=20000) as blocker:
        pass
    s = blocker.args[0]["stats"]
    win.live.refresh()
    assert v["ttft"].text() == f"{s['ttft_ms']:.0f} ms"
    assert v["ttft"].toolTip() == (
        f"Chat template and tokenizer: 0.5 ms\nPrefill of {prompt - reused} new tokens "
        f"({reused} cached) and the first token: {s['ttft_ms'] - 0.5:.1f} ms"
    )
    assert v["tokens"].text() == f"{s['reasoning_tokens']} + {s['completion_tokens'] - s['reasoning_tokens']}"
    assert v["ctx"].text().endswith("/ 4,096 (" + f"{100 * (s['prompt_tokens'] + s['completion_tokens']) / 4096:.0f}%)")
    assert win.live.reply.count == s["completion_tokens"] == 4 * len(deltas) and s["prompt_tokens"] == prompt
    assert v["replies"].text() == "2" and "ms" in v["ttft_p"].text()
    assert v["weights"].text() == "3.31 GiB" and v["kv"].text() == "112 MiB"
    assert len(win.live.rate_plot.values) > 3 and win.live.latency_plot.values[-1] == s["ttft_ms"]
    # what the average decode step read (the engine's figure) and at what rate: bytes x the reply's tok/s
    read, cache = s["decode_read_bytes"], s["decode_cache_read_bytes"]
    assert 0 < cache < read
    gb_s = read * s["decode_tok_s"] / 1e9
    assert v["read"].text() == f"{read / 1e9:.2f} GB"
    assert v["read_rate"].text() == (f"{gb_s / 1000:.2f} TB/s" if gb_s >= 1000 else f"{gb_s:.0f} GB/s")
    assert f"{(read - cache) / 1e9:.2f} GB of weights and {cache / 1e9:.2f} GB of KV cache" in v["read"].toolTip()
    assert memory_read(0.0, 0.0, 0.0) == ("—", "—", "")  # no decode step, or a reply saved without these


def test_the_live_panel_fits_beside_the_chat_in_a_narrow_window(qtbot, make_window, monkeypatch):
    """Opening the live panel in the smallest window used to overflow it: the window kept its fixed minimum, so
    the panel's right side, the top bar's buttons ("…") and the composer's placeholder were cut off. Now the
    window's minimum grows to what the visible columns need (never wider than the screen), and shrinks back
    when the panel closes; the composer shows a placeholder that fits its box."""
    from PySide6.QtCore import QRect

    from desktop.composer import PLACEHOLDER, PLACEHOLDER_SHORT

    win = make_window(engine=FakeEngine(), size=(760, 520))  # the chat page, with its composer
    screen = win.screen().availableGeometry().width()  # the offscreen screen: 800 px
    win.set_live_visible(True)
    qtbot.waitUntil(lambda: win.minimumWidth() == min(win.splitter.minimumSizeHint().width(), screen), timeout=5000)

    class WideScreen:  # a desktop monitor, where the columns fit
        @staticmethod
        def availableGeometry():
            return QRect(0, 0, 1920, 1080)

    monkeypatch.setattr(win, "screen", lambda: WideScreen)
    win.set_live_visible(False)
    win.set_live_visible(True)
    win.resize(760, 520)  # as small as it will go
    qtbot.waitUntil(
        lambda: win.live.isVisible() and win.width() >= win.splitter.minimumSizeHint().width(), timeout=5000
    )
    assert win.width() > 760
    panel_right = win.live.mapTo(win, win.live.rect().topRight()).x()
    assert panel_right < win.width()
    for button in (win.topbar.menu_btn, win.topbar.live_btn, win.topbar.settings_btn):
        assert button.width() >= button.sizeHint().width(), button.text()
    edit = win.composer.edit
    room = edit.viewport().width() - 2 * edit.document().documentMargin()
    assert edit.fontMetrics().horizontalAdvance(edit.placeholderText()) <= room
    assert edit.placeholderText() == PLACEHOLDER_SHORT  # the long one does not fit the column beside the panel
    win.set_live_visible(False)
    win.resize(760, 520)
    qtbot.waitUntil(lambda: win.width() < 900, timeout=5000)  # the minimum shrinks back with the panel closed
    win.resize(1300, 820)
    qtbot.waitUntil(lambda: edit.placeholderText() == PLACEHOLDER, timeout=5000)  # wide again: the full hint
