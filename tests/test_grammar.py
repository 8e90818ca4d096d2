"""Structured output (model_loader.grammar): under a JSON Schema the reply parses and validates, for random
schemas (every construct bounded, so a random model's reply ends); a reasoning model's reasoning is left free
and the constraint starts at its answer; a schema the library can't compile is refused with its reason. The
tiny random model writes whatever the grammar lets through, which is the point: only the grammar makes it JSON."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from model_loader.events import Delta, Finished, GenerationControl, SamplingSettings
from model_loader.grammar import GrammarError, compile_json

WORDS = ["name", "id", "tags", "city", "ok", "score", "items", "kind", "note", "when"]

leaf = st.one_of(
    st.integers(1, 12).map(lambda n: {"type": "string", "maxLength": n}),
    st.lists(st.sampled_from(["red", "green", "blue", "a b", 'x"y', "日本"]), min_size=1, max_size=4, unique=True).map(
        lambda e: {"enum": e}
    ),
    st.tuples(st.integers(-50, 50), st.integers(0, 100)).map(
        lambda t: {"type": "integer", "minimum": t[0], "maximum": t[0] + t[1]}
    ),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.just({"type": "string", "pattern": "^[a-z]{1,6}$"}),
    st.just({"type": "string", "format": "date"}),
)


def _containers(children):
    objects = st.lists(
        st.tuples(st.sampled_from(WORDS), children, st.booleans()), min_size=1, max_size=4, unique_by=lambda t: t[0]
    ).map(
        lambda props: {
            "type": "object",
            "properties": {k: v for k, v, _ in props},
            "required": [k for k, _, req in props if req],
            "additionalProperties": False,
        }
    )
    arrays = st.tuples(children, st.integers(0, 3)).map(lambda t: {"type": "array", "items": t[0], "maxItems": t[1]})
    either = st.tuples(children, children).map(lambda t: {"anyOf": [t[0], t[1]]})
    return st.one_of(objects, arrays, either)


schemas = st.recursive(leaf, _containers, max_leaves=8).map(
    lambda s: (
        s
        if s.get("type") == "object"
        else {"type": "object", "properties": {"value": s}, "required": ["value"], "additionalProperties": False}
    )
)


@pytest.fixture(scope="module")
def plain_engine(plain_model):
    from model_loader.engine import Engine

    return Engine.load(plain_model, device="cpu", context_length=1024)


@pytest.fixture(scope="module")
def plain_model(tiny_model, tmp_path_factory):
    from serving import make_plain_model

    return make_plain_model(tiny_model, tmp_path_factory.mktemp("plain") / "tiny-plain")


def _reply(plain_engine, constraint, **settings) -> Finished:
    s = SamplingSettings(constraint=constraint, **{"max_new_tokens": 400, **settings})
    events = list(plain_engine.generate([{"role": "user", "content": "Answer in JSON."}], s))
    return events[-1]


@hyp_settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schema=schemas, temperature=st.sampled_from([0.0, 1.0]))
def test_replies_under_a_random_schema_parse_and_validate(plain_engine, schema, temperature):
    constraint = compile_json(plain_engine.folder.path, plain_engine.model.cfg.vocab_size, schema)
    done = _reply(plain_engine, constraint, temperature=temperature, seed=3)
    assert done.stats.finish_reason == "eos", (schema, done.answer)  # the grammar ended it, not the budget
    jsonschema.validate(json.loads(done.answer), schema)


def test_json_object_gives_an_object_where_the_same_settings_without_it_give_no_json(plain_engine):
    # The bias pulls towards "{}" (token 6257): free, the reply is a run of them, which is not JSON; under
    # json_object the grammar lets one through and then only the end.
    bias = {6257: 50.0}
    free = _reply(plain_engine, None, temperature=0, max_new_tokens=10, logit_bias=bias)
    with pytest.raises(ValueError):
        json.loads(free.answer)
    done = _reply(
        plain_engine,
        compile_json(plain_engine.folder.path, plain_engine.model.cfg.vocab_size, None),
        temperature=0,
        logit_bias=bias,
    )
    assert done.stats.finish_reason == "eos"
    assert json.loads(done.answer) == {}


@pytest.mark.parametrize(
    "schema,reason",
    [
        ({"type": "strin"}, "strin"),
        ({"properties": {"a": {"$ref": "#/definitions/missing"}}}, "missing"),
        ({"type": "string", "pattern": "(unclosed"}, ""),
    ],
)
def test_a_schema_it_cant_compile_is_refused_with_the_reason(plain_engine, schema, reason):
    with pytest.raises(GrammarError) as err:
        compile_json(plain_engine.folder.path, plain_engine.model.cfg.vocab_size, schema)
    assert reason in str(err.value) and str(err.value)


def test_the_reasoning_stays_free_and_the_answer_follows_the_schema(tiny_model):
    """R1: the reasoning is what the model writes unconstrained (the same tokens as a free reply); stop
    thinking closes it; from there the answer is JSON for the schema."""
    from model_loader.engine import Engine

    plain_engine = Engine.load(tiny_model, device="cpu", context_length=1024)
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 999}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    constraint = compile_json(tiny_model, plain_engine.model.cfg.vocab_size, schema)

    def run(constraint):
        control = GenerationControl()
        events = []
        for event in plain_engine.generate(
            [{"role": "user", "content": "What is 6 x 7?"}],
            SamplingSettings(temperature=0, max_new_tokens=60, constraint=constraint),
            control,
        ):
            events.append(event)
            if isinstance(event, Delta) and event.token_count == 8:
                control.stop_thinking()
        return events[-1]

    free, bound = run(None), run(constraint)
    assert bound.stats.reasoning_tokens >= 8
    n = bound.stats.reasoning_tokens - 4  # before the close tag's tokens
    assert bound.token_ids[:n] == free.token_ids[:n]  # the reasoning was not constrained
    assert bound.stats.finish_reason == "eos"
    jsonschema.validate(json.loads(bound.answer), schema)
    plain_engine.close()
