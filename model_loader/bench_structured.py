"""`r1desk-cli bench --scenario structured`: what the API's per-request options cost in decode speed. The same
prompt decoded greedily three ways, taking turns: the fast path (sampling inside the CUDA graph), with
logprobs (the step stops at the logits and the host-side pipeline chooses: model_loader.logits_processing), and
under a JSON Schema (the pipeline plus llguidance's mask each token: model_loader.grammar). The default schema is
OpenAI's own structured-outputs example (steps of explanation and output, then a final answer: free strings);
BOUNDED_SCHEMA, eight records whose strings have a maxLength, is the hard case for the mask (see BENCHMARKS.md)."""

from __future__ import annotations

import json

from model_loader.bench import bench_prompt
from model_loader.engine import Engine
from model_loader.events import Finished, SamplingSettings
from model_loader.stats import percentile

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "maxLength": 32},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "status": {"enum": ["active", "inactive", "pending"]},
    },
    "required": ["name", "age", "email", "tags", "status"],
    "additionalProperties": False,
}
BOUNDED_SCHEMA = {
    "type": "object",
    "properties": {"people": {"type": "array", "items": PERSON, "minItems": 8, "maxItems": 8}},
    "required": ["people"],
    "additionalProperties": False,
}
STEP = {
    "type": "object",
    "properties": {"explanation": {"type": "string"}, "output": {"type": "string"}},
    "required": ["explanation", "output"],
    "additionalProperties": False,
}
TYPICAL_SCHEMA = {
    "type": "object",
    "properties": {"steps": {"type": "array", "items": STEP}, "final_answer": {"type": "string"}},
    "required": ["steps", "final_answer"],
    "additionalProperties": False,
}


def run_structured(engine: Engine, prompt_tokens: int, new_tokens: int, runs: int, schema: dict | None = None) -> dict:
    from model_loader.grammar import compile_json

    schema = schema or TYPICAL_SCHEMA
    constraint = compile_json(engine.folder.path, engine.model.cfg.vocab_size, schema)
    prompt = bench_prompt(engine, prompt_tokens)
    ways = {"fast": {}, "logprobs": {"logprobs": 0}, "json_schema": {"constraint": constraint}}
    results: dict[str, list[Finished]] = {name: [] for name in ways}
    for i in range(runs + 1):  # the first round warms up (graph captures) and is not counted
        for name, extra in ways.items():
            engine.reset_cache()
            settings = SamplingSettings(
                temperature=0, max_new_tokens=new_tokens, ignore_eos=name != "json_schema", **extra
            )
            # in_reasoning False: the grammar applies from the first token (in a chat it starts at the answer)
            final = [
                ev for ev in engine.generate_ids(prompt, settings, in_reasoning=False) if isinstance(ev, Finished)
            ][0]
            if i:
                results[name].append(final)
    out: dict = {"schema": schema, "prompt_tokens": len(prompt), "runs": runs}
    for name, finals in results.items():
        out[name] = {
            "decode_tok_s_p50": percentile([f.stats.decode_tok_s for f in finals], 50),
            "completion_tokens": finals[0].stats.completion_tokens,
            "finish_reason": finals[0].stats.finish_reason,
        }
    reply = results["json_schema"][0].answer
    try:
        json.loads(reply)
        out["json_schema"]["valid_json"] = True
    except ValueError:
        out["json_schema"]["valid_json"] = False
    fast = out["fast"]["decode_tok_s_p50"] or 1.0
    out["logprobs_ratio"] = out["logprobs"]["decode_tok_s_p50"] / fast
    out["json_schema_ratio"] = out["json_schema"]["decode_tok_s_p50"] / fast
    return out


def format_structured(r: dict) -> str:
    lines = [f"prompt {r['prompt_tokens']} tokens, greedy, {r['runs']} runs each, taking turns"]
    for name in ("fast", "logprobs", "json_schema"):
        x = r[name]
        lines.append(
            f"  {name:12s} {x['decode_tok_s_p50']:8.1f} tok/s   {x['completion_tokens']} tokens ({x['finish_reason']})"
        )
    lines.append(
        f"  logprobs: {r['logprobs_ratio']:.1%} of the fast path; JSON schema: {r['json_schema_ratio']:.1%}"
        f" (reply valid JSON: {r['json_schema']['valid_json']})"
    )
    return "\n".join(lines)
