"""Every request field is honoured or refused (issue: options accepted and silently ignored). Against `serve` on
the tiny model (plain template: all it writes is answer) through the official `openai` client: log-probabilities
in OpenAI's shape, streamed and not, agreeing with each other and with the text; sampler options that change the
choice (top_k, logit_bias); and a 400 naming the field for each one this server can't honour, for unknown fields
and for bad values. The options' effect on the logits themselves is checked in test_logits_processing."""

from __future__ import annotations

import dataclasses
import json

import openai
import pytest

from desktop.api import schema
from model_loader.events import TokenLogprobs
from serving import openai_client


HELLO = [{"role": "user", "content": "Say hello"}]


def test_logprobs_come_per_token_in_openais_shape_and_spell_the_answer(plain_server):
    model, url = plain_server
    client = openai_client(url)
    r = client.chat.completions.create(
        model=model, messages=HELLO, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 8
    assert (
        b"".join(bytes(t.bytes) for t in content).decode("utf-8", "replace").strip()
        == r.choices[0].message.content.strip()
    )
    for t in content:
        assert len(t.top_logprobs) == 3
        tops = [x.logprob for x in t.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert t.logprob <= tops[0] + 1e-6  # greedy: the token taken is the likeliest
        assert t.logprob == pytest.approx(tops[0], abs=1e-5)
        assert t.token == t.top_logprobs[0].token
    streamed = []
    for c in client.chat.completions.create(
        model=model, messages=HELLO, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3, stream=True
    ):
        if c.choices and c.choices[0].logprobs is not None:
            streamed += c.choices[0].logprobs.content
    assert [(t.token, t.bytes) for t in streamed] == [(t.token, t.bytes) for t in content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=1e-5)


def test_logprobs_without_top_and_left_out(plain_server):
    model, url = plain_server
    client = openai_client(url)
    r = client.chat.completions.create(model=model, messages=HELLO, temperature=0, max_tokens=4, logprobs=True)
    assert [t.top_logprobs for t in r.choices[0].logprobs.content] == [[]] * 4
    r = client.chat.completions.create(model=model, messages=HELLO, temperature=0, max_tokens=4)
    assert r.choices[0].logprobs is None


def test_top_k_one_gives_the_greedy_text_whatever_the_seed(plain_server):
    model, url = plain_server
    client = openai_client(url)
    greedy = client.chat.completions.create(model=model, messages=HELLO, temperature=0, max_tokens=10)
    texts = {
        client.chat.completions.create(
            model=model, messages=HELLO, temperature=1.5, seed=seed, max_tokens=10, extra_body={"top_k": 1}
        )
        .choices[0]
        .message.content
        for seed in (1, 2, 3)
    }
    assert texts == {greedy.choices[0].message.content}


def test_logit_bias_forces_a_token(plain_server):
    model, url = plain_server
    client = openai_client(url)
    r = client.chat.completions.create(
        model=model, messages=HELLO, temperature=0, max_tokens=5, logit_bias={"9707": 100}, logprobs=True
    )  # 9707: "Hello"
    assert [t.token for t in r.choices[0].logprobs.content] == ["Hello"] * 5


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"response_format": {"type": "nonsense"}}, "response_format.type"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"verbosity": "low"}, "verbosity"),
        ({"chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"audio": {"voice": "alloy", "format": "mp3"}}, "audio"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"store": True}, "store"),
        ({"ignore_eos": True}, "ignore_eos"),  # not OpenAI's: refused as OpenAI refuses what it doesn't know
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logit_bias": {"999999999": 5}}, "logit_bias"),
        ({"logit_bias": {"12": 101}}, "logit_bias"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"top_k": "5"}, "top_k"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
def test_each_field_it_cant_honour_or_a_bad_value_is_a_400_naming_it(plain_server, extra, param):
    model, url = plain_server
    with pytest.raises(openai.BadRequestError) as err:
        openai_client(url).chat.completions.create(model=model, messages=HELLO, max_tokens=2, extra_body=extra)
    assert err.value.status_code == 400
    assert err.value.body["param"] == param, err.value.body
    assert param.split(".")[0] in err.value.body["message"]


def test_bookkeeping_fields_are_accepted(plain_server):
    model, url = plain_server
    r = openai_client(url).chat.completions.create(
        model=model,
        messages=HELLO,
        max_tokens=2,
        user="u1",
        metadata={"k": "v"},
        store=False,
        service_tier="auto",
        extra_body={
            "prompt_cache_key": "x",
            "modalities": ["text"],
            "tool_choice": "none",
            "response_format": {"type": "text"},
        },
    )
    assert r.choices[0].finish_reason == "length"


def test_the_logprobs_buffer_sends_each_part_with_its_own_text():
    buf = schema.LogprobsBuffer()
    tok = TokenLogprobs(token_id=64, token="a", bytes=[97], logprob=-0.5, top=[], kind="reasoning")
    buf.add(tok)
    buf.add(dataclasses.replace(tok, token="b", kind="answer"))
    assert buf.take("answer") == {"content": [{"token": "b", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]}
    assert buf.take("answer") is None
    assert buf.take() == {"reasoning_content": [schema.logprob_entry(tok)], "content": []}


SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "rank": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["city", "rank"],
    "additionalProperties": False,
}


def test_json_schema_output_parses_and_validates_streamed_or_not(plain_server):
    import jsonschema

    model, url = plain_server
    client = openai_client(url)
    fmt = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA, "strict": True}}
    for seed in (1, 2):
        r = client.chat.completions.create(
            model=model, messages=HELLO, max_tokens=200, temperature=1.0, seed=seed, response_format=fmt
        )
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=model, messages=HELLO, max_tokens=200, temperature=0, response_format=fmt, stream=True
        )
        if c.choices
    )
    jsonschema.validate(json.loads(streamed), SCHEMA)


def test_json_object_output_is_an_object(plain_server):
    model, url = plain_server
    r = openai_client(url).chat.completions.create(
        model=model,
        messages=HELLO,
        max_tokens=20,
        temperature=0,
        response_format={"type": "json_object"},
        logit_bias={"6257": 50},
    )
    assert json.loads(r.choices[0].message.content) == {}  # "{}" pulled by the bias, then only the end


@pytest.mark.parametrize(
    "fmt,param,code",
    [
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}},
            "response_format.json_schema.schema",
            "invalid_schema",
        ),
        ({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, "response_format.json_schema", None),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}},
            "response_format.json_schema.schema",
            None,
        ),
    ],
)
def test_a_schema_it_cant_use_is_a_400_with_the_reason(plain_server, fmt, param, code):
    model, url = plain_server
    with pytest.raises(openai.BadRequestError) as err:
        openai_client(url).chat.completions.create(model=model, messages=HELLO, max_tokens=2, response_format=fmt)
    assert err.value.body["param"] == param and err.value.body["code"] == code
