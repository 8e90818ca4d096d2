"""Ollama's dialect on the same port, driven by the official `ollama` Python client: tags, show, ps, version;
chat and generate, streamed (NDJSON, Ollama's default) and not, with options mapped onto the engine's settings
(a seed replays, num_predict bounds, top_k=1 is greedy), `format` as a JSON Schema, `think` and `thinking` on
the R1 model, tools on the Qwen2.5 one, and errors in Ollama's shape."""

from __future__ import annotations

import json

import jsonschema
import ollama
import pytest

from serving import KEY, serve, stop


@pytest.fixture(scope="module")
def r1_ollama(tiny_model):
    """`serve` on the tiny R1 model with a key: (model id, the Ollama base URL, without /v1)."""
    proc, model_id, url = serve(tiny_model, "--api-key", KEY)
    yield model_id, url.removesuffix("/v1")
    stop(proc)


@pytest.fixture(scope="module")
def qwen_ollama(qwen_server):
    """The tiny Qwen2.5-style model's server as Ollama's clients address it (no /v1)."""
    model_id, url = qwen_server
    return model_id, url.removesuffix("/v1")


def ollama_client(host, key=KEY):
    return ollama.Client(host=host, headers={"Authorization": f"Bearer {key}"} if key else {})


HI = [{"role": "user", "content": "Why is the sky blue?"}]


def test_the_model_is_listed_shown_and_running(r1_ollama):
    model, host = r1_ollama
    client = ollama_client(host)
    assert [m.model for m in client.list().models] == [model]
    shown = client.show(model)
    assert "thinking" in shown.capabilities and shown.details.family == "qwen2"
    assert shown.modelinfo["qwen2.context_length"] == 512
    assert [m.model for m in client.ps().models] == [model]


def test_chat_streams_thinking_then_content_and_a_seed_replays(r1_ollama):
    model, host = r1_ollama
    client = ollama_client(host)
    whole = client.chat(model=model, messages=HI, options={"num_predict": 24, "temperature": 0.8, "seed": 7})
    assert whole.done and whole.done_reason == "length" and whole.eval_count == 24
    assert whole.message.thinking and whole.message.content == ""  # the random model never closes </think>
    assert whole.prompt_eval_count > 5 and whole.total_duration > 0
    parts = list(
        client.chat(model=model, messages=HI, stream=True, options={"num_predict": 24, "temperature": 0.8, "seed": 7})
    )
    assert "".join(p.message.thinking or "" for p in parts) == whole.message.thinking
    assert [p.done for p in parts][-1] is True and not any(p.done for p in parts[:-1])


def test_top_k_one_is_greedy_whatever_the_seed(r1_ollama):
    model, host = r1_ollama
    client = ollama_client(host)
    greedy = client.chat(model=model, messages=HI, options={"num_predict": 10, "temperature": 0}).message.thinking
    for seed in (1, 2):
        got = client.chat(
            model=model, messages=HI, options={"num_predict": 10, "temperature": 1.5, "top_k": 1, "seed": seed}
        )
        assert got.message.thinking == greedy


def test_generate_applies_the_template_unless_raw(r1_ollama):
    model, host = r1_ollama
    client = ollama_client(host)
    templated = client.generate(
        model=model, prompt="Why is the sky blue?", options={"num_predict": 8, "temperature": 0}
    )
    chat = client.chat(model=model, messages=HI, options={"num_predict": 8, "temperature": 0})
    assert templated.thinking == chat.message.thinking
    raw = client.generate(
        model=model, prompt="Why is the sky blue?", raw=True, options={"num_predict": 8, "temperature": 0}
    )
    assert raw.response and raw.eval_count == 8 and raw.prompt_eval_count < templated.prompt_eval_count
    loaded = client.generate(model=model)  # a client's "load the model"
    assert loaded.done and loaded.done_reason == "load"


def test_think_false_is_refused_on_a_model_that_always_reasons(r1_ollama):
    model, host = r1_ollama
    with pytest.raises(ollama.ResponseError) as err:
        ollama_client(host).chat(model=model, messages=HI, think=False)
    assert err.value.status_code == 400 and "always reasons" in err.value.error


@pytest.mark.parametrize(
    "opts,name",
    [
        ({"mirostat": 2}, "mirostat"),
        ({"typical_p": 0.5}, "typical_p"),
        ({"num_ctx": 100000}, "num_ctx"),
        ({"temperature": 5}, "temperature"),
        ({"warp_speed": 1}, "warp_speed"),
    ],
)
def test_options_it_cant_honour_are_refused_naming_them(r1_ollama, opts, name):
    model, host = r1_ollama
    with pytest.raises(ollama.ResponseError) as err:
        ollama_client(host).chat(model=model, messages=HI, options=opts)
    assert err.value.status_code == 400 and f"options.{name}" in err.value.error


def test_runtime_options_and_no_op_values_are_accepted(r1_ollama):
    model, host = r1_ollama
    r = ollama_client(host).chat(
        model=model,
        messages=HI,
        options={"num_predict": 2, "num_gpu": 99, "num_thread": 8, "mirostat": 0, "num_ctx": 512, "repeat_last_n": -1},
    )
    assert r.eval_count == 2


def test_errors_are_in_ollamas_shape(r1_ollama):
    model, host = r1_ollama
    with pytest.raises(ollama.ResponseError) as err:
        ollama_client(host).chat(model="nope", messages=HI)
    assert err.value.status_code == 404 and "nope" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        ollama_client(host, key=None).list()
    assert err.value.status_code == 401


def test_format_a_json_schema(qwen_ollama):
    model, host = qwen_ollama
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}},
        "required": ["city"],
        "additionalProperties": False,
    }
    r = ollama_client(host, key=None).chat(
        model=model, messages=HI, format=schema, options={"num_predict": 100, "temperature": 0}
    )
    jsonschema.validate(json.loads(r.message.content), schema)


def test_tools_on_a_model_that_takes_them(qwen_ollama):
    from model_loader.tool_calls import ToolCallParser  # noqa: F401 (the parser the route uses)

    model, host = qwen_ollama
    client = ollama_client(host, key=None)
    tool = {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
    r = client.chat(
        model=model,
        messages=[{"role": "user", "content": "1+2?"}],
        tools=[tool],
        options={"num_predict": 6, "temperature": 0},
    )
    assert r.message.tool_calls is None and r.message.content  # the random model calls nothing by itself
    history = [
        {"role": "user", "content": "1+2?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "add", "arguments": {"a": 1, "b": 2}}}],
        },
        {"role": "tool", "content": "3", "tool_name": "add"},
    ]
    after = client.chat(model=model, messages=history, tools=[tool], options={"num_predict": 4})
    assert after.prompt_eval_count > r.prompt_eval_count  # the call and its result went into the prompt


def test_generate_with_suffix_fills_in_the_middle(qwen_ollama):
    model, host = qwen_ollama
    r = ollama_client(host, key=None).generate(
        model=model, prompt="def add(a, b):\n    return ", suffix="\n", options={"num_predict": 5, "temperature": 0}
    )
    assert r.done and r.eval_count == 5
