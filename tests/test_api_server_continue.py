"""continue_final_message (vLLM's extension, and how a client stops a reply's thinking over the API): the last
message, an assistant's, is the reply so far; the model continues it. With its reasoning sent apart
(reasoning_content), the reasoning is closed and the model writes the answer; with raw text that hasn't closed
</think>, the reasoning goes on. Checked against the engine on the same ids."""

from __future__ import annotations

import openai
import pytest

from model_loader.chat import STOP_THINKING_TEXT
from model_loader.events import SamplingSettings
from serving import openai_client

ASK = [{"role": "user", "content": "What is 6 x 7?"}]


def test_stop_thinking_by_continuing_with_the_reasoning_so_far(tiny_server, engine):
    model, url = tiny_server
    client = openai_client(url)
    first = client.chat.completions.create(model=model, messages=ASK, max_tokens=12, temperature=0)
    reasoning = first.choices[0].message.model_extra["reasoning_content"]  # never closed by the random model
    assert reasoning and not first.choices[0].message.content
    reply = client.chat.completions.create(
        model=model,
        messages=[*ASK, {"role": "assistant", "content": "", "reasoning_content": reasoning}],
        max_tokens=8,
        temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    message = reply.choices[0].message
    assert message.content and not message.model_extra.get("reasoning_content")  # all answer now
    # the same ids the engine gets: the prompt, the reasoning so far, the close tag
    head = engine.chat.render(ASK)
    ids = head.ids + engine.tokenizer.encode(reasoning + STOP_THINKING_TEXT)
    assert reply.usage.prompt_tokens == len(ids)
    alone = list(engine.generate_ids(ids, SamplingSettings(temperature=0, max_new_tokens=8)))[-1]
    assert message.content == alone.answer


def test_raw_reasoning_without_its_close_goes_on_as_reasoning(tiny_server):
    model, url = tiny_server
    r = openai_client(url).chat.completions.create(
        model=model,
        messages=[*ASK, {"role": "assistant", "content": "<think>\nFirst, six times seven"}],
        max_tokens=6,
        temperature=0,
        extra_body={"continue_final_message": True},
    )
    assert r.choices[0].message.model_extra["reasoning_content"] and not r.choices[0].message.content


@pytest.mark.parametrize(
    "messages,extra,param",
    [
        (ASK, {"continue_final_message": True}, "messages"),
        (
            [*ASK, {"role": "assistant", "content": "x"}],
            {"continue_final_message": True, "add_generation_prompt": True},
            "add_generation_prompt",
        ),
        (ASK, {"add_generation_prompt": False}, "add_generation_prompt"),
        (ASK, {"continue_final_message": "yes"}, "continue_final_message"),
    ],
)
def test_bad_continuations_are_400s(tiny_server, messages, extra, param):
    model, url = tiny_server
    with pytest.raises(openai.BadRequestError) as err:
        openai_client(url).chat.completions.create(model=model, messages=messages, max_tokens=2, extra_body=extra)
    assert err.value.body["param"] == param
