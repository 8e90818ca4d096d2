"""Ollama's API dialect (/api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version), which many
desktop tools speak natively: request validation and response shapes, mapped onto the same requests as the
OpenAI dialect (desktop/api/schema.py). Pure Python.

What maps where: `options` temperature, top_p, top_k, min_p, seed, stop, num_predict (-1 and -2: up to the
context), repeat_penalty (CTRL's, over the prompt and the reply), presence_penalty, frequency_penalty; `format`
"json" or a JSON Schema (grammar-constrained, as response_format); `think` (a reasoning model's reasoning comes
in `thinking`; it can't be turned off); `tools` (the model's template must take them); `logprobs`,
`top_logprobs`. Runtime options of llama.cpp (num_gpu, num_thread, num_batch, use_mmap, ...) change nothing
about the output and are accepted; num_ctx is accepted up to the loaded context (it is that large already).
Sampling options this engine doesn't have (mirostat, tfs_z, typical_p, a repeat_last_n window) are refused
with a 400 naming them unless they are at their no-op values. Errors are Ollama's shape: {"error": "..."}.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field

from desktop.api.schema import ApiError, _check_unicode, _tools, parse_messages, sampler_options
from model_loader.events import GenerationStats, TokenLogprobs  # plain dataclasses: no torch

RUNTIME_OPTIONS = {
    "num_gpu",
    "main_gpu",
    "num_thread",
    "num_batch",
    "use_mmap",
    "use_mlock",
    "numa",
    "low_vram",
    "f16_kv",
    "vocab_only",
    "num_keep",
    "logits_all",
    "embedding_only",
}
NO_OP_VALUES = {
    "mirostat": (0,),
    "tfs_z": (1, 1.0),
    "typical_p": (1, 1.0),
    "penalize_newline": (False,),
    "repeat_last_n": (-1,),
    "mirostat_eta": None,
    "mirostat_tau": None,
}  # None: any (mirostat off)
NUMBER_OPTIONS = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "min_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
    "repeat_penalty": (0.0, 2.0),
}


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


@dataclass
class OllamaRequest:
    model: str
    messages: list[dict]  # OpenAI-shaped, validated (empty: a raw prompt, in settings)
    settings: dict
    stream: bool = True  # Ollama streams unless told not to
    stop: list[str] = field(default_factory=list)
    response_format: dict | None = None
    tools: list[dict] | None = None
    think: bool | None = None
    logprobs: bool = False
    load_only: bool = False  # /api/generate with no prompt: "load the model" (it is loaded)


def _json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as err:
        raise bad(f"the request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    _check_unicode(body)
    return body


def _model(body: dict, model_ids) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' is required", "model")
    # Ollama's names carry a tag ("name:latest"): the bare name matches too
    if model not in model_ids and model.rsplit(":", 1)[0] not in model_ids:
        raise ApiError(404, f"model '{model}' not found", param="model", code="model_not_found")
    return model


def options(body: dict, context_length: int) -> tuple[dict, list[str]]:
    """(SamplingSettings fields, stop strings) from `options`."""
    opts = body.get("options") or {}
    if not isinstance(opts, dict):
        raise bad("'options' must be an object", "options")
    settings: dict = {}
    openai_style: dict = {}
    for name, value in opts.items():
        where = f"options.{name}"
        if name in RUNTIME_OPTIONS:
            continue
        if name in NO_OP_VALUES:
            allowed = NO_OP_VALUES[name]
            if allowed is None or value in allowed:
                continue
            raise bad(
                f"'{where}' is not supported by this server (only its no-op value {allowed[0]!r} is accepted)", where
            )
        if name in NUMBER_OPTIONS:
            lo, hi = NUMBER_OPTIONS[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
                raise bad(f"'{where}' must be a number between {lo:g} and {hi:g}", where)
            openai_style["repetition_penalty" if name == "repeat_penalty" else name] = value
        elif name in ("top_k", "seed", "num_predict", "num_ctx"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad(f"'{where}' must be an integer", where)
            if name == "top_k":
                openai_style["top_k"] = value
            elif name == "seed":
                settings["seed"] = value % (2**32)
            elif name == "num_predict" and value > 0:
                settings["max_new_tokens"] = value
            elif name == "num_predict" and value not in (-1, -2):
                raise bad(f"'{where}' must be positive, -1 (no limit) or -2 (fill the context)", where)
            elif name == "num_ctx" and value > context_length:
                raise bad(
                    f"'{where}': this server's context is {context_length} tokens (the app's context length "
                    "setting); ask for at most that",
                    where,
                )
        elif name == "stop":
            continue
        else:
            raise bad(f"unknown option '{where}'", where)
    for name in ("temperature", "top_p"):
        if name in openai_style:
            settings[name] = float(openai_style.pop(name))
    if settings.get("top_p", 1.0) <= 0:
        raise bad("'options.top_p' must be greater than 0", "options.top_p")
    try:
        settings.update(sampler_options(openai_style))
    except ApiError as err:  # the OpenAI name back to Ollama's
        param = "options.repeat_penalty" if err.param == "repetition_penalty" else f"options.{err.param}"
        raise bad(err.message.replace("'repetition_penalty'", "'repeat_penalty'"), param) from None
    stop = opts.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("'options.stop' must be a list of strings", "options.stop")
    return settings, [s for s in stops if s]


def _format(body: dict) -> dict | None:
    value = body.get("format")
    if value in (None, ""):
        return None
    if value == "json":
        return {"schema": None, "param": "format"}
    if isinstance(value, dict):
        return {"schema": value, "param": "format"}
    raise bad("'format' must be \"json\" or a JSON Schema object", "format")


def _common(body: dict, req: OllamaRequest, context_length: int, reasons: bool) -> None:
    settings, stops = options(body, context_length)
    req.settings.update(settings)
    req.stop = stops
    req.response_format = _format(body)
    stream = body.get("stream", True)
    if not isinstance(stream, bool):
        raise bad("'stream' must be true or false", "stream")
    req.stream = stream
    think = body.get("think")
    if think is not None and not isinstance(think, bool):
        raise bad("'think' must be true or false (levels are for other models)", "think")
    if think is False and reasons:
        raise bad(
            "'think': this model always reasons before it answers; leave think out or set it true (the "
            "reasoning comes in 'thinking')",
            "think",
        )
    if think is True and not reasons:
        raise bad("'think': this model does not reason", "think")
    req.think = think
    logprobs, top = body.get("logprobs"), body.get("top_logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise bad("'logprobs' must be true or false", "logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20):
        raise bad("'top_logprobs' must be an integer from 0 to 20", "top_logprobs")
    if logprobs:
        req.settings["logprobs"] = top or 0
        req.logprobs = True
    for name in ("images",):
        if body.get(name):
            raise bad(f"'{name}': this model reads text only", name)


def _defaults(defaults: dict) -> dict:
    return {"temperature": defaults.get("temperature", 0.6), "top_p": defaults.get("top_p", 0.95)}


def parse_chat(raw: bytes, model_ids, defaults: dict, context_length: int, reasons: bool) -> OllamaRequest:
    body = _json(raw)
    req = OllamaRequest(model=_model(body, model_ids), messages=[], settings=_defaults(defaults))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list", "messages")
    for m in messages:
        if isinstance(m, dict) and m.get("images"):
            raise bad("'messages[].images': this model reads text only", "messages")
    req.messages = parse_messages([_openai_message(m) for m in messages])
    tools, _, _, _ = _tools({"tools": body.get("tools")} if body.get("tools") else {})
    req.tools = tools
    _common(body, req, context_length, reasons)
    return req


def _openai_message(m) -> dict:
    """An Ollama message as the OpenAI dialect has it (calls' arguments as a JSON string, tool results with a
    call id)."""
    if not isinstance(m, dict):
        return m
    out = {"role": m.get("role"), "content": m.get("content")}
    if m.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {
                    "name": (c.get("function") or {}).get("name"),
                    "arguments": json.dumps((c.get("function") or {}).get("arguments", {})),
                },
            }
            for i, c in enumerate(m["tool_calls"])
            if isinstance(c, dict)
        ]
    if m.get("role") == "tool":
        out["tool_call_id"] = m.get("tool_name") or "call"
    return out


def parse_generate(
    raw: bytes, model_ids, defaults: dict, context_length: int, reasons: bool, fim: bool
) -> OllamaRequest:
    from desktop.api.completions import FIM

    body = _json(raw)
    req = OllamaRequest(model=_model(body, model_ids), messages=[], settings=_defaults(defaults))
    for name, why in (
        ("template", "this server renders the model's own chat template"),
        ("context", "the deprecated context field is not supported; send the conversation to /api/chat"),
    ):
        if body.get(name):
            raise bad(f"'{name}' is not supported: {why}", name)
    prompt, system, suffix = body.get("prompt") or "", body.get("system"), body.get("suffix")
    for name, value in (("prompt", prompt), ("system", system), ("suffix", suffix)):
        if value is not None and not isinstance(value, str):
            raise bad(f"'{name}' must be a string", name)
    _common(body, req, context_length, reasons)
    if not prompt and not suffix:
        req.load_only = True  # a client's "load the model" request
        return req
    if suffix:
        if not fim:
            raise bad("'suffix' needs a model whose tokenizer has fill-in-the-middle tokens", "suffix")
        req.settings.update(raw_prompt=f"{FIM[0]}{prompt}{FIM[1]}{suffix}{FIM[2]}", verbatim=True)
    elif body.get("raw"):
        req.settings.update(raw_prompt=prompt, verbatim=True)
    else:
        req.messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}
        ]
    return req


# ---------------------------------------------------------------------------------------------- responses
def now_iso() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e9):09d}Z"


def final_stats(stats: GenerationStats) -> dict:
    """The timings Ollama reports, in nanoseconds, from a reply's GenerationStats."""
    total = int(stats.total_s * 1e9)
    prompt = int(stats.ttft_ms * 1e6)
    return {
        "total_duration": total,
        "load_duration": 0,
        "prompt_eval_count": stats.prompt_tokens,
        "prompt_eval_duration": prompt,
        "eval_count": stats.completion_tokens,
        "eval_duration": max(0, total - prompt),
    }


DONE_REASONS = {"eos": "stop", "max_new_tokens": "length", "context_full": "length", "cancelled": "stop"}


def logprob_entries(entries: list[TokenLogprobs]) -> list[dict]:
    return [
        {
            "token": e.token,
            "logprob": e.logprob,
            "top_logprobs": [{"token": t["token"], "logprob": t["logprob"]} for t in e.top],
        }
        for e in entries
    ]


def details(info: dict) -> dict:
    quant = info.get("quantization")
    dtype = str(info.get("dtype") or "")
    params = ""
    if not quant and info.get("weights_bytes"):
        per = 4 if dtype == "float32" else 2
        params = f"{info['weights_bytes'] / per / 1e9:.1f}B"
    return {
        "parent_model": "",
        "format": "safetensors",
        "family": "qwen2",
        "families": ["qwen2"],
        "parameter_size": params,
        "quantization_level": "AWQ 4-bit"
        if quant
        else dtype.upper().replace("BFLOAT16", "BF16").replace("FLOAT16", "F16").replace("FLOAT32", "F32"),
    }


def digest(info: dict) -> str:
    """A stable id for the loaded folder (Ollama's is its manifest's hash; clients only compare it)."""
    return hashlib.sha256(str(info.get("model_path", "")).encode()).hexdigest()


def tags(names, info: dict, modified: str) -> dict:
    return {
        "models": [
            {
                "name": n,
                "model": n,
                "modified_at": modified,
                "size": int(info.get("weights_bytes", 0)),
                "digest": digest(info),
                "details": details(info),
            }
            for n in names
        ]
    }


def show(info: dict, modified: str) -> dict:
    capabilities = (
        ["completion"]
        + (["tools"] if info.get("tools") else [])
        + (["thinking"] if info.get("reasons") else [])
        + (["insert"] if info.get("fim") else [])
    )
    # no template: Ollama's are Go templates, and the model's own (Jinja) would mislead a client that reads it
    return {
        "modelfile": "",
        "parameters": "",
        "template": "",
        "details": details(info),
        "model_info": {"general.architecture": "qwen2", "qwen2.context_length": int(info.get("context_length", 0))},
        "capabilities": capabilities,
        "modified_at": modified,
    }
