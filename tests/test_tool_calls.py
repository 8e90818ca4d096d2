"""Tool calls: definitions and results go through the model's own chat template (Qwen2.5's, on a tiny random
model of that family), its <tool_call> blocks come back as OpenAI's `tool_calls`, whole or streamed as deltas,
and tool_choice required / a named function makes the reply a valid call (grammar-constrained: a random model
calls nothing on its own). A model whose template has no tools (the R1 distills) refuses them with a 400."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from model_loader.chat_template import QWEN25_CHAT_TEMPLATE, R1_CHAT_TEMPLATE
from model_loader.tool_calls import ToolCallParser, template_supports_tools
from serving import openai_client, serve, stop

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": 0, "maximum": 99},
                "b": {"type": "integer", "minimum": 0, "maximum": 99},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, ADD]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


# ---------------------------------------------------------------------------------------------- parsing
REPLY = (
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n'
    '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
)


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 1000])
def test_the_parser_splits_content_and_calls_however_the_text_streams(piece):
    parser = ToolCallParser()
    items = []
    for k in range(0, len(REPLY), piece):
        items += parser.feed(REPLY[k : k + piece])
    items += parser.flush()
    content = "".join(x for kind, x in items if kind == "content")
    calls = [x for kind, x in items if kind == "call"]
    assert content == "Let me check.\n\n"
    assert calls == [
        {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "C"}'},
        {"name": "add", "arguments": '{"a": 1, "b": 2}'},
    ]


def test_what_is_not_a_call_stays_content():
    for text in [
        "<tool_call>\nnot json\n</tool_call>",
        '<tool_call>\n{"arguments": {}}\n</tool_call>',
        'an unfinished <tool_call>\n{"name": "add"',
        "a < b and <tool",
    ]:
        parser = ToolCallParser()
        items = parser.feed(text) + parser.flush()
        assert items and all(kind == "content" for kind, _ in items)
        assert "".join(x for _, x in items) == text


def test_which_templates_take_tools():
    assert template_supports_tools(QWEN25_CHAT_TEMPLATE)
    assert not template_supports_tools(R1_CHAT_TEMPLATE)


def test_calls_and_results_go_back_through_the_template(qwen_model):
    from model_loader.chat import ChatFormat
    from model_loader.tokenizer import load_tokenizer

    tok = load_tokenizer(qwen_model)
    chat = ChatFormat(tok, [])
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "C"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]
    text = chat.render(history, TOOLS).text
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    # the arguments as an object, as the model writes them (not a quoted string)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


# ---------------------------------------------------------------------------------------------- the API
def test_required_makes_the_reply_a_call_with_valid_arguments(qwen_server):
    model, url = qwen_server
    client = openai_client(url)
    for seed in (1, 2, 3):
        r = client.chat.completions.create(
            model=model, messages=ASK, tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed, max_tokens=200
        )
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        for call in choice.message.tool_calls:
            assert call.type == "function" and call.id.startswith("call_")
            tool = {"get_weather": WEATHER, "add": ADD}[call.function.name]
            jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


def test_a_named_function_is_the_one_called_and_streams_as_deltas(qwen_server):
    model, url = qwen_server
    client = openai_client(url)
    choice = {"type": "function", "function": {"name": "add"}}
    whole = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=200
    ).choices[0]
    assert [c.function.name for c in whole.message.tool_calls] == ["add"]
    chunks = list(
        client.chat.completions.create(
            model=model, messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=200, stream=True
        )
    )
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    head, *rest = [d[0] for d in deltas]
    assert head.index == 0 and head.id.startswith("call_") and head.function.name == "add"
    assert "".join(d.function.arguments for d in [head, *rest]) == whole.message.tool_calls[0].function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_a_call_and_its_result_round_trip(qwen_server):
    model, url = qwen_server
    client = openai_client(url)
    first = (
        client.chat.completions.create(
            model=model, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=200
        )
        .choices[0]
        .message
    )
    call = first.tool_calls[0]
    messages = [
        *ASK,
        first.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"},
    ]
    r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")
    assert (
        r.usage.prompt_tokens
        > client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=1).usage.prompt_tokens
    )  # the call and result went in


def test_auto_without_a_call_is_plain_content(qwen_server):
    model, url = qwen_server
    r = openai_client(url).chat.completions.create(model=model, messages=ASK, tools=TOOLS, temperature=0, max_tokens=12)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
    assert r.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_bad_tool_requests_are_400s_naming_the_field(qwen_server, extra, param):
    model, url = qwen_server
    with pytest.raises(openai.BadRequestError) as err:
        openai_client(url).chat.completions.create(model=model, messages=ASK, max_tokens=2, extra_body=extra)
    assert err.value.body["param"] == param


def test_a_model_without_tool_support_says_so(tiny_model):
    proc, model, url = serve(tiny_model)
    try:
        client = openai_client(url)
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=2)
        assert err.value.body["code"] == "tools_not_supported" and "tool" in err.value.body["message"]
        r = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=2)
        assert r.choices[0].message.tool_calls is None
    finally:
        stop(proc)
