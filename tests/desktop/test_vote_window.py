"""Ask ×N in the window (desktop.vote): N chains through the engine service, their majority as the reply, the vote
stored with it and every chain one click away; Stop ends every chain."""

from __future__ import annotations

import fakes

from desktop.vote import ChainsDialog


def test_ask_n_answers_with_the_majority_and_keeps_every_chain(qtbot, make_window):
    engine = fakes.FakeEngine(token_s=0.0002)
    win = make_window(engine=engine, vote_chains=3)
    assert win.composer.vote_btn.text() == "Ask ×3" and win.composer.vote_btn.isVisible()
    win.composer.set_text("What is the sum of the first 100 odd numbers?")
    with qtbot.waitSignal(win.reply_finished, timeout=30000) as done:
        win.composer.vote_btn.click()
    assert len(engine.prompts) == 3  # three chains, one prompt
    seeds = [s.seed for s in engine.settings_seen]
    assert seeds == [seeds[0], seeds[0] + 1, seeds[0] + 2]
    msg = done.args[0]
    vote = msg["stats"]["vote"]
    assert vote["summary"] == "3 of 3 chains agree: 10000" and vote["answer"] == "10000" and vote["support"] == 3
    assert [c["answer"] for c in vote["chains"]] == ["10000"] * 3
    assert all(c["text"].endswith("\\boxed{10000}.") and c["majority"] for c in vote["chains"])
    widget = win.chat.widget_for(msg["id"])
    assert widget.vote_label.isVisible() and widget.vote_label.text() == vote["summary"]
    assert widget.vote_btn.isVisible()
    stored = win.store.message(msg["id"])  # stored with the conversation: a restart shows it again
    assert stored["stats"]["vote"] == vote
    dialog = ChainsDialog(vote, win)
    assert dialog.list.count() == 3 and dialog.list.item(0).text().startswith("★ Chain 1: 10000")
    dialog.list.setCurrentRow(2)
    assert dialog.text.toPlainText() == vote["chains"][2]["text"]
    # the next turn's history holds the chosen chain's answer, as after any reply
    assert win._history()[-1]["content"] == msg["answer"]


def test_stop_ends_every_chain_and_a_plain_send_is_one_reply(qtbot, make_window):
    engine = fakes.FakeEngine(token_s=0.01)
    win = make_window(engine=engine, vote_chains=4)
    win.composer.set_text("A question")
    win.composer.vote_btn.click()
    qtbot.waitUntil(lambda: win.stream is not None and len(win.stream.reasoning) > 20, timeout=20000)
    assert not win.composer.vote_btn.isVisible()  # while a reply is written
    with qtbot.waitSignal(win.reply_finished, timeout=30000) as done:
        win.stop()
    assert done.args[0]["stats"]["finish_reason"] == "cancelled"
    assert done.args[0]["stats"]["vote"]["total"] == 4
    assert [c["finish_reason"] for c in done.args[0]["stats"]["vote"]["chains"]] == ["cancelled"] * 4
    assert not win.service.active and not win.service.waiting
    before = len(engine.prompts)
    with qtbot.waitSignal(win.reply_finished, timeout=30000) as plain:
        win.send("And once more")
    assert len(engine.prompts) == before + 1 and "vote" not in plain.args[0]["stats"]
    assert not win.chat.widget_for(plain.args[0]["id"]).vote_label.isVisible()
