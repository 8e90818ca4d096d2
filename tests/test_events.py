"""The event API every consumer reads (model_loader.events): SamplingSettings' room for new tokens and which
settings the in-graph sampler covers alone, GenerationControl's requests from another thread, and events that go
through json as they are."""

import json
import threading
from dataclasses import asdict

import pytest

from model_loader.events import (
    Finished,
    GenerationControl,
    GenerationStats,
    MemoryStats,
    SamplingSettings,
)


def test_new_tokens_are_bounded_by_the_room_and_by_max_new_tokens():
    assert SamplingSettings().new_tokens_within(300) == 300  # None: until the context is full
    assert SamplingSettings(max_new_tokens=100).new_tokens_within(300) == 100
    assert SamplingSettings(max_new_tokens=100).new_tokens_within(40) == 40
    assert SamplingSettings(max_new_tokens=100).new_tokens_within(0) == 0


@pytest.mark.parametrize(
    "changes",
    [
        {"temperature": 0},
        {"temperature": 1.2, "top_p": 0.5, "top_k": 40},
        {"seed": 7, "max_new_tokens": 10, "ignore_eos": True, "verbatim": True},
        {"logit_bias": {}},  # an empty bias biases nothing
        {"min_p": 0.0, "repetition_penalty": 1.0},
    ],
)
def test_temperature_top_p_and_top_k_are_plain(changes):
    assert SamplingSettings(**changes).plain


@pytest.mark.parametrize(
    "changes",
    [
        {"min_p": 0.05},
        {"frequency_penalty": 0.5},
        {"presence_penalty": -0.5},
        {"repetition_penalty": 1.1},
        {"logit_bias": {42: 5.0}},
        {"logprobs": 0},  # the chosen token's log-probability alone still needs the logits
        {"constraint": object()},
    ],
)
def test_any_other_option_takes_the_logits_path(changes):
    assert not SamplingSettings(**changes).plain


def test_stop_thinking_is_taken_once_and_cancel_stays():
    control = GenerationControl()
    assert not control.cancelled and not control.take_stop_thinking()
    control.stop_thinking()
    assert control.take_stop_thinking() and not control.take_stop_thinking()  # one request, taken once
    control.cancel()
    assert control.cancelled and not control.take_stop_thinking()


def test_an_action_registered_by_the_engine_runs_on_the_callers_thread_instead():
    control = GenerationControl()
    ran_on = []
    control.act_on_stop_thinking(lambda: ran_on.append(threading.get_ident()))
    caller = threading.Thread(target=control.stop_thinking)
    caller.start()
    caller.join()
    assert ran_on == [caller.ident]  # at once, on the thread that asked
    assert not control.take_stop_thinking()  # and not left for the decode loop as well
    control.act_on_stop_thinking(None)  # the reasoning closed: back to the loop's check
    control.stop_thinking()
    assert ran_on == [caller.ident] and control.take_stop_thinking()


def test_events_go_through_json_as_they_are():
    stats = GenerationStats(
        finish_reason="eos",
        prompt_tokens=12,
        completion_tokens=3,
        reasoning_tokens=2,
        prefix_reused_tokens=0,
        context_length=4096,
        ttft_ms=10.5,
        first_answer_ms=None,
        decode_tok_s=100.0,
        total_s=0.1,
        token_latencies_ms=[1.0, 2.0],
        memory=MemoryStats(device="cpu", weights_bytes=1024),
    )
    event = Finished(text="a</think>\n\nb", reasoning="a", answer="b", token_ids=[1, 2, 3], stats=stats)
    back = json.loads(json.dumps(asdict(event)))
    assert back["text"] == event.text and back["token_ids"] == [1, 2, 3]
    assert back["stats"]["memory"]["weights_bytes"] == 1024 and back["stats"]["token_latencies_ms"] == [1.0, 2.0]
