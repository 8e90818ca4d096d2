"""OpenAI's legacy completions dialect (POST /v1/completions): a raw prompt, no chat template: what editors'
autocomplete sends, with `suffix` for fill-in-the-middle. Request validation and response shapes; pure Python.

The prompt is a string or token ids, or a list of either (each gets n choices, index prompt * n + sample). A
prompt's text is tokenized as written, control tokens included: the client writes the whole prompt. `suffix`
wraps it in the model's fill-in-the-middle tokens (Qwen2.5-Coder's order: prefix, suffix, middle) where its
tokenizer has them. Unlike chat, max_tokens defaults to 16, as OpenAI's does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from model_loader.chat import FIM_TOKENS
from model_loader.events import TokenLogprobs  # a plain dataclass: no torch

from desktop.api.schema import (
    BOOKKEEPING,
    MAX_N,
    MAX_STOP_STRINGS,
    ApiError,
    _bad,
    _check_unicode,
    _integer,
    _number,
    completion_id,
    sampler_options,
)

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
MAX_PROMPTS = 16
FIM = FIM_TOKENS
HONOURED = {
    "model",
    "prompt",
    "suffix",
    "echo",
    "n",
    "best_of",
    "stream",
    "stream_options",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
    "logprobs",
}
MAX_LOGPROBS = 5  # OpenAI's limit for completions


@dataclass
class CompletionRequest:
    model: str
    prompts: list  # each a str or a list of token ids
    settings: dict
    stream: bool = False
    include_usage: bool = False
    stop: list[str] = field(default_factory=list)
    n: int = 1
    echo_texts: list[str] | None = None  # echo: each prompt's text, which its choices start with
    logprobs: int | None = None


def parse_completion_request(raw: bytes, model_ids, defaults: dict, vocab_size: int, fim: bool) -> CompletionRequest:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as err:
        raise ApiError(400, f"the request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    _check_unicode(body)
    for name in body:
        if name not in HONOURED and name not in BOOKKEEPING:
            raise _bad(name, f"Unrecognized request argument supplied: {name}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", "'model' is required: the id of the loaded model (GET /v1/models lists it)")
    model_ids = (model_ids,) if isinstance(model_ids, str) else tuple(model_ids)
    if model not in model_ids:
        raise ApiError(404, f"The model '{model}' does not exist", param="model", code="model_not_found")
    prompts = given = _prompts(body.get("prompt"), vocab_size)  # given: before any fill-in-the-middle framing
    suffix = body.get("suffix")
    if suffix is not None:
        if not isinstance(suffix, str):
            raise _bad("suffix", "'suffix' must be a string")
        if not fim:
            raise _bad(
                "suffix",
                "'suffix' needs a model whose tokenizer has fill-in-the-middle tokens "
                f"({', '.join(FIM)}); this one's hasn't",
            )
        if any(not isinstance(p, str) for p in prompts):
            raise _bad("suffix", "'suffix' goes with a text prompt, not token ids")
        prompts = [f"{FIM[0]}{p}{FIM[1]}{suffix}{FIM[2]}" for p in prompts]
    n = _integer(body, "n", 1, MAX_N) or 1
    best_of = _integer(body, "best_of", 1)
    if best_of is not None and best_of != n:
        raise _bad("best_of", "'best_of' is not supported beyond n (every sample is returned)")
    stream = body.get("stream", False) or False
    if not isinstance(stream, bool):
        raise _bad("stream", "'stream' must be true or false")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise _bad("stream_options", "'stream_options' must be {\"include_usage\": true or false}")
    echo = body.get("echo", False) or False
    if not isinstance(echo, bool):
        raise _bad("echo", "'echo' must be true or false")
    logprobs = _integer(body, "logprobs", 0, MAX_LOGPROBS)
    if echo and logprobs is not None:
        raise _bad(
            "echo",
            "'echo' with 'logprobs' (the prompt's own log-probabilities) is not supported; ask for one or the other",
        )
    if echo and any(not isinstance(p, str) for p in given):
        raise _bad("echo", "'echo' goes with a text prompt, not token ids")
    settings = {
        "temperature": _number(body, "temperature", 0.0, 2.0, defaults.get("temperature", 0.6)),
        "top_p": _number(body, "top_p", 0.0, 1.0, defaults.get("top_p", 0.95)),
        "max_new_tokens": _integer(body, "max_tokens", 1) or DEFAULT_MAX_TOKENS,
        "verbatim": True,
    }
    if settings["top_p"] <= 0:
        raise _bad("top_p", "'top_p' must be greater than 0")
    settings.update(sampler_options({k: v for k, v in body.items() if k != "logprobs"}, vocab_size))
    if logprobs is not None:
        settings["logprobs"] = logprobs
    seed = _integer(body, "seed", -(2**63))
    if seed is not None:
        settings["seed"] = seed % (2**32)
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else [] if stop is None else None
    if stops is None or not all(isinstance(s, str) for s in stops) or len(stops) > MAX_STOP_STRINGS:
        raise _bad("stop", f"'stop' must be a string or a list of at most {MAX_STOP_STRINGS} strings")
    return CompletionRequest(
        model=model,
        prompts=prompts,
        settings=settings,
        stream=stream,
        include_usage=options.get("include_usage", False),
        stop=[s for s in stops if s],
        n=n,
        echo_texts=list(given) if echo else None,
        logprobs=logprobs,
    )


def _prompts(value, vocab_size: int) -> list:
    def ids_ok(ids) -> bool:
        return all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < (vocab_size or 2**31) for t in ids)

    if isinstance(value, str):
        prompts = [value]
    elif isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        prompts = [value]
    elif isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
        prompts = value
    else:
        raise _bad("prompt", "'prompt' must be a string, a list of token ids, or a list of either")
    if len(prompts) > MAX_PROMPTS:
        raise _bad("prompt", f"'prompt' takes at most {MAX_PROMPTS} prompts")
    for p in prompts:
        if isinstance(p, list) and (not p or not ids_ok(p)):
            raise _bad("prompt", f"'prompt': token ids must be a non-empty list of ids below {vocab_size}")
        if isinstance(p, str) and not p:
            raise _bad("prompt", "'prompt' must not be empty")
    return prompts


# ---------------------------------------------------------------------------------------------- responses
def completion_name() -> str:
    return "cmpl-" + completion_id()[len("chatcmpl-") :]


class LegacyLogprobs:
    """One choice's tokens in the completions shape: tokens, token_logprobs, top_logprobs ({token: logprob}),
    text_offset (where each token starts in the choice's text)."""

    def __init__(self, offset: int = 0):
        self.tokens: list[str] = []
        self.token_logprobs: list[float] = []
        self.top: list[dict] = []
        self.offsets: list[int] = []
        self.offset = offset

    def add(self, scored: TokenLogprobs) -> None:
        self.tokens.append(scored.token)
        self.token_logprobs.append(scored.logprob)
        self.top.append({t["token"]: t["logprob"] for t in scored.top})
        self.offsets.append(self.offset)
        self.offset += len(scored.token)

    def take(self) -> dict:
        out = {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top,
            "text_offset": self.offsets,
        }
        self.tokens, self.token_logprobs, self.top, self.offsets = [], [], [], []
        return out


def choice(index: int, text: str, finish: str | None, logprobs: dict | None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}


def response(cid: str, created: int, model: str, choices: list[dict], usage: dict | None = None) -> dict:
    out = {"id": cid, "object": "text_completion", "created": created, "model": model, "choices": choices}
    if usage is not None:
        out["usage"] = usage
    return out
