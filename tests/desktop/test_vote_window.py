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


def test_with_one_reply_at_a_time_ask_n_still_decodes_its_chains_together(qtbot, make_window, tiny_model):
    """Replies at once = 1 (the window's default) keeps a lone reply on the single-reply engine, but Ask ×N's
    chains decode together, as `chat --vote` does: every chain has started (its prompt in the KV cache) before
    the first one ends. One after another, chain 2 would start only once chain 1 had ended. The scheduler made
    for them goes when they end, and a plain reply then runs on the engine as before."""
    win = make_window(model=tiny_model, vote_chains=3, max_new_tokens=48, max_parallel=1)
    assert win.service.info["max_parallel"] == 1 and win.service.info["samples_together"] is True
    events: list[tuple[str, int]] = []

    def watch(req) -> None:
        req.started.connect(lambda _started, i=req.id: events.append(("started", i)))
        req.finished.connect(lambda _result, i=req.id: events.append(("ended", i)))
        req.failed.connect(lambda _kind, _message, i=req.id: events.append(("ended", i)))

    win.service.request_started.connect(watch)
    win.composer.set_text("What is 2 + 2?")
    with qtbot.waitSignal(win.reply_finished, timeout=60000) as done:
        win.composer.vote_btn.click()
    assert done.args[0]["stats"]["vote"]["total"] == 3
    kinds = [kind for kind, _ in events]
    assert kinds.count("started") == 3 and kinds.count("ended") == 3
    assert kinds.index("ended") > max(i for i, kind in enumerate(kinds) if kind == "started"), events
    worker = win.service.host.worker
    qtbot.waitUntil(lambda: worker._together is None, timeout=10000)  # its KV cache is gone with it
    with qtbot.waitSignal(win.reply_finished, timeout=60000) as plain:
        win.send("And once more")
    stats = plain.args[0]["stats"]
    assert stats["finish_reason"] in ("stop", "max_new_tokens") and "vote" not in stats


def test_samples_take_the_engine_in_turn_when_their_batch_cannot_start(qtbot, make_window, tiny_model, monkeypatch):
    """A batch for the samples that fails to start (its paged kernels, say, where the kernel store lacks them and
    there is no C compiler) ends the chain that asked for it with the error; the vote's other chains then run on
    the engine one after another and the vote finishes with them, and the app stays usable."""
    from model_loader.scheduler import Scheduler

    def broken(*_args, **_kwargs):
        raise RuntimeError("the paged kernels could not start")

    monkeypatch.setattr(Scheduler, "__init__", broken)
    win = make_window(model=tiny_model, vote_chains=3, max_new_tokens=16, max_parallel=1)
    win.composer.set_text("What is 2 + 2?")
    with qtbot.waitSignal(win.reply_finished, timeout=60000) as done:
        win.composer.vote_btn.click()
    vote = done.args[0]["stats"]["vote"]
    assert vote["total"] == 3
    reasons = [c["finish_reason"] for c in vote["chains"]]
    assert reasons[0] == "internal" and all(r in ("stop", "max_new_tokens") for r in reasons[1:]), reasons
    with qtbot.waitSignal(win.reply_finished, timeout=60000) as plain:
        win.send("And once more")
    assert plain.args[0]["stats"]["finish_reason"] in ("stop", "max_new_tokens")
