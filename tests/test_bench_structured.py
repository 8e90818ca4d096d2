"""`r1desk-cli bench --scenario structured` (model_loader.bench_structured) on the tiny model (CPU): the same
reply timed plain, with log-probabilities and under a JSON Schema, and the schema's reply is JSON."""


def test_structured_scenario_times_three_ways_and_the_schema_reply_is_json(cpu_engine, capsys):
    from model_loader.bench_structured import format_structured, run_structured

    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
        "additionalProperties": False,
    }
    r = run_structured(cpu_engine, prompt_tokens=64, new_tokens=40, runs=1, schema=schema)
    for name in ("fast", "logprobs", "json_schema"):
        assert r[name]["decode_tok_s_p50"] > 0
    assert r["fast"]["completion_tokens"] == r["logprobs"]["completion_tokens"] == 40
    assert r["json_schema"]["finish_reason"] == "eos" and r["json_schema"]["valid_json"]  # the grammar ended it
    assert 0 < r["json_schema_ratio"] and 0 < r["logprobs_ratio"]
    assert "JSON schema:" in format_structured(r)
