"""POST /v1/completions (raw prompts: editors' autocomplete) against `serve` on the tiny Qwen2.5-style model,
through the `openai` client: the text continues the prompt exactly (the same tokens as the engine decodes from
those ids), token-id prompts, several prompts and samples, echo, stop, legacy logprobs, streaming, and
fill-in-the-middle with `suffix` framed by the model's FIM tokens."""

from __future__ import annotations

import openai
import pytest

from serving import openai_client, serve, stop


@pytest.fixture(scope="module")
def qwen_engine(qwen_model):
    from model_loader.engine import Engine

    return Engine.load(qwen_model, device="cpu", context_length=512)


def _greedy(qwen_engine, ids, n):
    from model_loader.events import SamplingSettings

    return list(qwen_engine.generate_ids(ids, SamplingSettings(temperature=0, max_new_tokens=n, verbatim=True)))[-1]


PROMPT = "def fibonacci(n):\n    "


def test_the_text_continues_the_prompt_as_the_engine_decodes_it(qwen_server, qwen_engine):
    model, url = qwen_server
    client = openai_client(url)
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
    want = _greedy(qwen_engine, qwen_engine.tokenizer.encode(PROMPT), 12)
    assert r.choices[0].text == qwen_engine.tokenizer.decode(want.token_ids)  # verbatim: no newline trimmed
    assert r.choices[0].finish_reason == "length" and r.object == "text_completion"
    assert r.usage.prompt_tokens == len(qwen_engine.tokenizer.encode(PROMPT)) and r.usage.completion_tokens == 12
    by_ids = client.completions.create(
        model=model, prompt=qwen_engine.tokenizer.encode(PROMPT), max_tokens=12, temperature=0
    )
    assert by_ids.choices[0].text == r.choices[0].text


def test_max_tokens_defaults_to_16_as_openais_does(qwen_server):
    model, url = qwen_server
    r = openai_client(url).completions.create(model=model, prompt=PROMPT, temperature=0)
    assert r.usage.completion_tokens == 16


def test_several_prompts_and_samples_come_back_indexed_prompt_by_sample(qwen_server):
    model, url = qwen_server
    client = openai_client(url)
    prompts = ["The capital of France is", "1, 2, 3,"]
    r = client.completions.create(model=model, prompt=prompts, n=2, max_tokens=6, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    alone = [
        client.completions.create(model=model, prompt=p, max_tokens=6, temperature=0).choices[0].text for p in prompts
    ]
    assert [c.text for c in r.choices] == [alone[0], alone[0], alone[1], alone[1]]


def test_echo_stop_and_streaming(qwen_server):
    model, url = qwen_server
    client = openai_client(url)
    full = client.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    echoed = client.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPT + full
    stop = full[6:9]
    cut = client.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop])
    assert cut.choices[0].text == full[: full.find(stop)] and cut.choices[0].finish_reason == "stop"
    chunks = list(
        client.completions.create(
            model=model,
            prompt=PROMPT,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full
    assert chunks[-1].usage.completion_tokens == 24


def test_legacy_logprobs(qwen_server):
    model, url = qwen_server
    r = openai_client(url).completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:k]) for k in range(5)]
    for value, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 2 and max(top.values()) == pytest.approx(value, abs=1e-5)  # greedy: the likeliest


def test_suffix_frames_the_prompt_with_the_fill_in_the_middle_tokens(qwen_server, qwen_engine):
    model, url = qwen_server
    r = openai_client(url).completions.create(
        model=model, prompt="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))", max_tokens=8, temperature=0
    )
    framed = "<|fim_prefix|>def add(a, b):\n    return <|fim_suffix|>\n\nprint(add(1, 2))<|fim_middle|>"
    ids = qwen_engine.tokenizer.encode(framed)
    assert ids.count(qwen_engine.tokenizer.get_vocab()["<|fim_middle|>"]) == 1
    assert r.choices[0].text == qwen_engine.tokenizer.decode(_greedy(qwen_engine, ids, 8).token_ids)


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"prompt": [151936 + 5]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"echo": True, "logprobs": 1}, "echo"),
        ({"best_of": 3}, "best_of"),
        ({"logprobs": 6}, "logprobs"),
        ({"messages": []}, "messages"),
    ],
)
def test_bad_completion_requests_are_400s_naming_the_field(qwen_server, extra, param):
    model, url = qwen_server
    body = {"prompt": PROMPT, "max_tokens": 2, **extra}
    with pytest.raises(openai.BadRequestError) as err:
        openai_client(url).completions.create(
            model=model,
            **{k: v for k, v in body.items() if k == "prompt"},
            extra_body={k: v for k, v in body.items() if k != "prompt"},
        )
    assert err.value.body["param"] == param


def test_a_model_without_fim_tokens_refuses_suffix(tiny_model, tmp_path):
    import json
    import shutil

    folder = tmp_path / "no-fim"
    shutil.copytree(tiny_model, folder)
    tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    tok["added_tokens"] = [t for t in tok["added_tokens"] if "fim" not in t["content"]]
    (folder / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    proc, model, url = serve(folder)
    try:
        with pytest.raises(openai.BadRequestError) as err:
            openai_client(url).completions.create(model=model, prompt="a", suffix="b", max_tokens=2)
        assert err.value.body["param"] == "suffix" and "fill-in-the-middle" in err.value.body["message"]
    finally:
        stop(proc)
