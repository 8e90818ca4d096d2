"""OpenAI chat-completions dialect: request validation and response shapes. Pure Python (no Qt, no aiohttp),
so every rule here is tested without a server.

R1's reasoning goes in `reasoning_content` (DeepSeek's own API) and `reasoning` (vLLM, OpenRouter); the answer in
`content`. Errors use OpenAI's shape {"error": {"message", "type", "param", "code"}} and name the field at fault.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass, field

from model_loader.chat import STOP_THINKING_TEXT, THINK_OPEN
from model_loader.events import GenerationStats, TokenLogprobs  # plain dataclasses: no torch
from model_loader.tool_calls import ToolCallParser

MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_N = 16  # choices a request may ask for (each is a reply; with several at once they decode together)
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MAX_TOOLS = 128  # OpenAI's limit
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names

# engine finish reasons -> OpenAI's. "cancelled" is only seen when a stop string ended the reply ("stop").
FINISH_REASONS = {"eos": "stop", "max_new_tokens": "length", "context_full": "length", "cancelled": "stop"}


class ApiError(Exception):
    """An HTTP error in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str, type_: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


@dataclass
class ChatRequest:
    model: str
    messages: list[dict]  # {"role": system|user|assistant, "content": str}
    settings: dict  # SamplingSettings fields: temperature, top_p, max_new_tokens, seed
    stream: bool = False
    include_usage: bool = False
    stop: list[str] = field(default_factory=list)
    n: int = 1  # replies (choices) to sample
    # structured output: {"schema": a JSON Schema, or None for any JSON object (json_object)}; None: free text
    response_format: dict | None = None
    tools: list[dict] | None = None  # for the chat template; None: no tools (or tool_choice "none")
    tool_choice: str = "none"  # auto | none | required | function (a named one: tool_names)
    tool_names: list[str] = field(default_factory=list)  # what a call may name
    parallel_tool_calls: bool = True
    continue_final: bool = False  # continue_final_message: the last (assistant) message is the reply so far


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param)


def _number(body: dict, name: str, lo: float, hi: float, default):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(name, f"'{name}' must be a number")
    if not lo <= value <= hi:
        raise _bad(name, f"'{name}' must be between {lo:g} and {hi:g}; got {value}")
    return float(value)


def _integer(body: dict, name: str, lo: int, hi: int | None = None):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, f"'{name}' must be an integer")
    if value < lo or (hi is not None and value > hi):
        raise _bad(
            name,
            f"'{name}' must be at least {lo}" + (f" and at most {hi}" if hi is not None else "") + f"; got {value}",
        )
    return value


def _content(value, where: str, allow_none: bool) -> str:
    """A message's content: a string, or a list of text parts ({"type": "text", "text": ...})."""
    if value is None and allow_none:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _bad(f"{where}[{j}]", f"'{where}[{j}]': only text parts are supported (got {kind!r})")
            texts.append(part["text"])
        return "".join(texts)
    raise _bad(where, f"'{where}' must be a string or a list of text parts")


def _check_unicode(body: dict) -> None:
    """400 for a string that is not Unicode text: JSON's \\ud800 escapes decode to lone surrogates, which no
    tokenizer, log or response can encode (they failed deep inside as a 500). Walks the whole body, keys too,
    without recursion."""
    todo = [("", body)]
    while todo:
        where, value = todo.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            path = f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else str(key)
            for text in (key, item):
                if isinstance(text, str):
                    try:
                        text.encode("utf-8")
                    except UnicodeEncodeError as err:
                        name = path.encode("utf-8", "backslashreplace").decode()
                        raise _bad(
                            name,
                            f"'{name}' is not valid Unicode text: an unpaired surrogate "
                            f"({text[err.start]!r}) at character {err.start}",
                        ) from None
            if isinstance(item, (dict, list)):
                todo.append((path, item))


def parse_messages(value) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise _bad("messages", "'messages' must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(where, f"'{where}' must be an object with 'role' and 'content'")
        role = m.get("role")
        if role not in ROLES:
            raise _bad(
                f"{where}.role",
                f"'{where}.role' must be one of system, developer, user, assistant, tool (got {role!r})",
            )
        if "content" not in m and role != "assistant":
            raise _bad(f"{where}.content", f"'{where}.content' is required")
        # Earlier assistant reasoning is dropped by the chat template (only the text after </think> goes back);
        # a client's reasoning_content field is not part of the prompt either.
        message = {
            "role": ROLES[role],
            "content": _content(m.get("content"), f"{where}.content", allow_none=role == "assistant"),
        }
        if role == "assistant" and m.get("tool_calls") is not None:
            message["tool_calls"] = _tool_calls(m["tool_calls"], f"{where}.tool_calls")
        if role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise _bad(
                    f"{where}.tool_call_id",
                    f"'{where}.tool_call_id' is required: the id of the call this is the result of",
                )
            message["tool_call_id"] = call_id
        out.append(message)
    return out


def _tool_calls(value, where: str) -> list[dict]:
    """An assistant message's calls, as OpenAI sends them back: [{id, type: function, function: {name,
    arguments: a JSON string}}]."""
    if not isinstance(value, list):
        raise _bad(where, f"'{where}' must be a list of tool calls")
    calls = []
    for j, call in enumerate(value):
        here = f"{where}[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
            or not isinstance(fn.get("arguments", ""), str)
        ):
            raise _bad(
                here,
                f'\'{here}\' must be {{"id", "type": "function", "function": {{"name", "arguments": a JSON string}}}}',
            )
        calls.append(
            {
                "id": str(call.get("id") or ""),
                "type": "function",
                "function": {"name": fn["name"], "arguments": fn.get("arguments") or "{}"},
            }
        )
    return calls


def parse_chat_request(raw: bytes, model_ids, defaults: dict | None = None, vocab_size: int = 0) -> ChatRequest:
    """model_ids: the names the loaded model answers to (a str: one). defaults: temperature and top_p for a
    request that leaves them out (the app's settings: DeepSeek's
    advice for R1, 0.6 and 0.95, as vLLM takes them from the model's generation_config). vocab_size: the
    model's (token ids in logit_bias must be below it; 0: not checked here)."""
    defaults = defaults or {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as err:  # ValueError: bad JSON or bytes; RecursionError: nested too deep
        raise ApiError(400, f"the request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    _check_unicode(body)
    _check_fields(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", "'model' is required: the id of the loaded model (GET /v1/models lists it)")
    model_ids = (model_ids,) if isinstance(model_ids, str) else tuple(model_ids)
    if model not in model_ids:
        names = " or ".join(f"'{m}'" for m in model_ids)
        raise ApiError(
            404,
            f"The model '{model}' does not exist; this server has {names} loaded",
            param="model",
            code="model_not_found",
        )
    messages = parse_messages(body.get("messages"))
    n = _integer(body, "n", 1)
    if n is not None and n > MAX_N:
        raise _bad("n", f"'n' must be at most {MAX_N}")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("stream", "'stream' must be true or false")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise _bad("stream_options", "'stream_options' must be an object")
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise _bad("stream_options.include_usage", "'stream_options.include_usage' must be true or false")
    # both checked, whichever is given: an invalid one is an error even beside a valid other
    limit, legacy = _integer(body, "max_completion_tokens", 1), _integer(body, "max_tokens", 1)
    if limit is None:
        limit = legacy
    settings = {
        "temperature": _number(body, "temperature", 0.0, 2.0, defaults.get("temperature", 0.6)),
        "top_p": _number(body, "top_p", 0.0, 1.0, defaults.get("top_p", 0.95)),
    }
    if settings["top_p"] <= 0:
        raise _bad("top_p", "'top_p' must be greater than 0")
    settings.update(sampler_options(body, vocab_size))
    continue_final = _continuation(body, messages)
    tools, tool_choice, tool_names, parallel = _tools(body)
    response_format = _response_format(body)
    if response_format is not None and tool_choice in ("required", "function"):
        raise _bad("response_format", "'response_format' can't be combined with a required tool call")
    seed = _integer(body, "seed", -(2**63))
    if seed is not None:
        settings["seed"] = seed % (2**32)  # the engine's generator takes 32 bits; equal seeds replay equal
    if limit is not None:
        settings["max_new_tokens"] = limit
    stop = body.get("stop")
    if stop is None:
        stops = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = list(stop)
    else:
        raise _bad("stop", "'stop' must be a string or a list of strings")
    if len(stops) > MAX_STOP_STRINGS:
        raise _bad("stop", f"'stop' takes at most {MAX_STOP_STRINGS} strings")
    return ChatRequest(
        model=model,
        messages=messages,
        settings=settings,
        stream=stream,
        include_usage=include_usage,
        stop=[s for s in stops if s],
        n=n or 1,
        response_format=response_format,
        tools=tools,
        tool_choice=tool_choice,
        tool_names=tool_names,
        parallel_tool_calls=parallel,
        continue_final=continue_final,
    )


# ------------------------------------------------------------------------------------------ field policy
# Every field of OpenAI's chat-completions request is honoured, accepted because it changes nothing about the
# output (bookkeeping fields), or refused with a 400 that names it; a field OpenAI doesn't know is refused as
# OpenAI refuses it ("Unrecognized request argument"). The extensions that vLLM and llama.cpp accept for
# sampling (top_k, min_p, repetition_penalty) are honoured too.
HONOURED = {
    "model",
    "messages",
    "n",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
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
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "continue_final_message",
    "add_generation_prompt",
}
BOOKKEEPING = {"user", "metadata", "service_tier", "safety_identifier", "prompt_cache_key", "store"}
# OpenAI's fields this server can't honour, with why
REFUSED = {
    "reasoning_effort": "this model's reasoning length can't be set; use max_tokens to bound the reply",
    "verbosity": "this model's answer length can't be set; use max_tokens to bound the reply",
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "functions": "the legacy 'functions' field is not supported; send 'tools'",
    "function_call": "the legacy 'function_call' field is not supported; send 'tool_choice'",
}
MAX_LOGIT_BIAS = 300  # entries in logit_bias (OpenAI's limit)


def _check_fields(body: dict) -> None:
    for name, value in body.items():
        if name in HONOURED or name in BOOKKEEPING:
            continue
        if name in REFUSED:
            if value is None:
                continue
            raise _bad(name, f"'{name}' is not supported: {REFUSED[name]}")
        if name == "modalities":
            if value is None or value == ["text"]:
                continue
            raise _bad(name, "'modalities': only [\"text\"] is supported")
        if name == "chat_template_kwargs":
            if not value:
                continue
            raise _bad(
                name,
                "'chat_template_kwargs' is not supported: this server renders the model's own chat template as it is",
            )
        raise _bad(name, f"Unrecognized request argument supplied: {name}")
    if body.get("store") not in (None, False):
        raise _bad("store", "'store': this server keeps no completions; send false or leave it out")


def _continuation(body: dict, messages: list[dict]) -> bool:
    """vLLM's continue_final_message (and add_generation_prompt): the last message, an assistant's, is the start of
    the reply, which the model continues. Its reasoning, where sent apart (reasoning_content or reasoning), is
    taken as finished: the reply so far is that reasoning closed by </think>, then the content. (Sent inside
    `content` without a </think>, the reasoning goes on.) This is how a client stops a reply's thinking: it
    cancels the stream and continues with the reasoning it has."""
    cont, gen = body.get("continue_final_message"), body.get("add_generation_prompt")
    for name, value in (("continue_final_message", cont), ("add_generation_prompt", gen)):
        if value is not None and not isinstance(value, bool):
            raise _bad(name, f"'{name}' must be true or false")
    if not cont:
        if gen is False:
            raise _bad(
                "add_generation_prompt",
                "'add_generation_prompt': false is supported only with continue_final_message: true",
            )
        return False
    if gen:
        raise _bad("add_generation_prompt", "'add_generation_prompt' and 'continue_final_message' can't both be true")
    raw = body["messages"][-1]
    if messages[-1]["role"] != "assistant" or len(messages) < 2:
        raise _bad(
            "messages",
            "'continue_final_message' needs an assistant message last (the reply so far), after "
            "the messages it answers",
        )
    reasoning = raw.get("reasoning_content", raw.get("reasoning"))
    if reasoning is not None:
        if not isinstance(reasoning, str):
            raise _bad(f"messages[{len(messages) - 1}].reasoning_content", "the reasoning must be a string")
        messages[-1]["content"] = f"{THINK_OPEN}\n{reasoning}{STOP_THINKING_TEXT}{messages[-1]['content']}"
    return True


def _tools(body: dict) -> tuple[list[dict] | None, str, list[str], bool]:
    """(tools, choice, names, parallel): the tool definitions (None: none, or tool_choice "none"); the choice
    ("auto", "none", "required" or "function"); the tools a call may name (required: any; a named function: that
    one); whether several calls may come in one reply."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _bad("parallel_tool_calls", "'parallel_tool_calls' must be true or false")
    if tools is not None:
        if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
            raise _bad("tools", f"'tools' must be a list of at most {MAX_TOOLS} tools")
        for i, tool in enumerate(tools):
            fn = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
                raise _bad(f"tools[{i}]", f'\'tools[{i}]\' must be {{"type": "function", "function": {{...}}}}')
            if not isinstance(fn.get("name"), str) or not TOOL_NAME.match(fn["name"]):
                raise _bad(
                    f"tools[{i}].function.name",
                    f"'tools[{i}].function.name' must be 1 to 64 letters, digits, underscores or dashes",
                )
            if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
                raise _bad(
                    f"tools[{i}].function.parameters", f"'tools[{i}].function.parameters' must be a JSON Schema object"
                )
    names = [t["function"]["name"] for t in tools or []]
    if choice is None:
        choice = "auto"
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise _bad(
                "tool_choice",
                '\'tool_choice\' must be none, auto, required or {"type": "function", "function": {"name": ...}}',
            )
        if name not in names:
            raise _bad("tool_choice", f"'tool_choice' names the function {name!r}, which is not in 'tools'")
        return tools, "function", [name], False
    if choice not in ("auto", "none", "required"):
        raise _bad("tool_choice", "'tool_choice' must be none, auto, required or a named function")
    if choice == "required" and not names:
        raise _bad("tool_choice", "'tool_choice' required needs 'tools'")
    if choice == "none" or not names:
        return None, "none", [], False
    return tools, choice, names, parallel is not False


def _response_format(body: dict) -> dict | None:
    """None for free text; {"schema": ..., "param": where it came from} for JSON (schema None: any object)."""
    value = body.get("response_format")
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise _bad("response_format", "'response_format' must be an object with a 'type'")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return {"schema": None, "param": "response_format"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise _bad(
                "response_format.json_schema",
                "'response_format.json_schema' must be an object with a 'name' and a 'schema'",
            )
        schema = spec.get("schema", {})
        if not isinstance(schema, dict):
            raise _bad(
                "response_format.json_schema.schema",
                "'response_format.json_schema.schema' must be a JSON Schema object",
            )
        if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
            raise _bad(
                "response_format.json_schema.strict", "'response_format.json_schema.strict' must be true or false"
            )
        # strict or not, the output follows the schema: decoding is constrained either way
        return {"schema": schema, "param": "response_format.json_schema.schema"}
    raise _bad(
        "response_format.type", f"'response_format.type' must be text, json_object or json_schema (got {kind!r})"
    )


def sampler_options(body: dict, vocab_size: int = 0) -> dict:
    """The SamplingSettings fields past temperature and top-p that the request sets (validated)."""
    out: dict = {}
    top_k = _integer(body, "top_k", -1)
    if top_k is not None and top_k > 0:  # 0 and -1: off (vLLM's and llama.cpp's spellings)
        out["top_k"] = top_k
    min_p = _number(body, "min_p", 0.0, 1.0, 0.0)
    if min_p > 0:
        out["min_p"] = min_p
    for name in ("frequency_penalty", "presence_penalty"):
        value = _number(body, name, -2.0, 2.0, 0.0)
        if value:
            out[name] = value
    repetition = _number(body, "repetition_penalty", 0.0, 2.0, 1.0)
    if repetition <= 0:
        raise _bad("repetition_penalty", "'repetition_penalty' must be greater than 0")
    if repetition != 1.0:
        out["repetition_penalty"] = repetition
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise _bad("logit_bias", "'logit_bias' must be an object mapping token ids to numbers")
        if len(bias) > MAX_LOGIT_BIAS:
            raise _bad("logit_bias", f"'logit_bias' takes at most {MAX_LOGIT_BIAS} tokens")
        parsed = {}
        for key, value in bias.items():
            try:
                token = int(key)
            except ValueError:
                raise _bad("logit_bias", f"'logit_bias': {key!r} is not a token id") from None
            if token < 0 or (vocab_size and token >= vocab_size):
                raise _bad(
                    "logit_bias",
                    f"'logit_bias': token id {token} is outside the model's vocabulary (0..{vocab_size - 1})",
                )
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
                raise _bad("logit_bias", f"'logit_bias[{key}]' must be a number between -100 and 100")
            if value:
                parsed[token] = float(value)
        if parsed:
            out["logit_bias"] = parsed
    want = body.get("logprobs")
    if want is not None and not isinstance(want, bool):
        raise _bad("logprobs", "'logprobs' must be true or false")
    top = _integer(body, "top_logprobs", 0, 20)
    if top is not None and not want:
        raise _bad("top_logprobs", "'top_logprobs' needs 'logprobs': true")
    if want:
        out["logprobs"] = top or 0
    return out


class StopMatcher:
    """Finds stop strings in streamed answer text. Text that could still become a stop string is held back,
    so nothing past a stop string is ever sent. Applies to the answer (`content`) only: a reasoning model drafts
    freely inside its reasoning, and cutting that off on a stop string would end the reply before it answers."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.held = ""
        self.hit = False

    def feed(self, text: str) -> str:
        """Returns the text that is safe to send; sets `hit` when a stop string appeared (text before it only)."""
        if not self.stops or self.hit:
            return "" if self.hit else text
        buf = self.held + text
        found = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if found:
            self.hit, self.held = True, ""
            return buf[: min(found)]
        keep = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:k]):
                    keep = k
                    break
        self.held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        held, self.held = self.held, ""
        return "" if self.hit else held


# ---------------------------------------------------------------------------------------------- responses
def completion_id() -> str:
    return "chatcmpl-" + secrets.token_hex(12)


def usage(stats: GenerationStats | list[GenerationStats]) -> dict:
    """OpenAI's usage of one reply's stats, or of n replies to one prompt (the prompt counted once, as OpenAI
    does; its cached tokens from the first reply)."""
    all_stats = stats if isinstance(stats, list) else [stats]
    first = all_stats[0]
    prompt = first.prompt_tokens
    completion = sum(s.completion_tokens for s in all_stats)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": first.prefix_reused_tokens},
        "completion_tokens_details": {"reasoning_tokens": sum(s.reasoning_tokens for s in all_stats)},
    }


def choice(
    index: int,
    reasoning: str,
    answer: str | None,
    finish: str,
    logprobs: dict | None = None,
    tool_calls: list[dict] | None = None,
) -> dict:
    message = {"role": "assistant", "content": answer}
    if reasoning:
        message["reasoning_content"] = message["reasoning"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"index": index, "message": message, "finish_reason": finish, "logprobs": logprobs}


def tool_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def split_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """A whole reply's content (None where it is only calls, as OpenAI sends it) and its calls in OpenAI's
    shape."""
    parser = ToolCallParser()
    items = parser.feed(text) + parser.flush()
    content = "".join(x for kind, x in items if kind == "content")
    calls = [{"id": tool_call_id(), "type": "function", "function": x} for kind, x in items if kind == "call"]
    return (content.strip() or None) if calls else content, calls


class StreamedToolCalls:
    """One streamed choice's answer through the tool-call parser: content deltas as the text settles, and each
    call as OpenAI streams one: its index, id, type and name first, then its arguments."""

    def __init__(self, chunks: "SseChunks"):
        self.chunks, self.parser, self.count = chunks, ToolCallParser(), 0

    def feed(self, text: str, logprobs: dict | None = None) -> list[bytes]:
        return self._out(self.parser.feed(text), logprobs)

    def flush(self) -> list[bytes]:
        return self._out(self.parser.flush(), None)

    def _out(self, items, logprobs) -> list[bytes]:
        out = []
        for kind, x in items:
            if kind == "content":
                if x:
                    out.append(self.chunks({"content": x}, logprobs=logprobs))
                    logprobs = None
                continue
            head = {
                "index": self.count,
                "id": tool_call_id(),
                "type": "function",
                "function": {"name": x["name"], "arguments": ""},
            }
            out.append(self.chunks({"tool_calls": [head]}, logprobs=logprobs))
            logprobs = None
            out.append(self.chunks({"tool_calls": [{"index": self.count, "function": {"arguments": x["arguments"]}}]}))
            self.count += 1
        if logprobs is not None:  # tokens of text still held (a tag's start): with the next chunk that goes out
            out.append(self.chunks({}, logprobs=logprobs))
        return out


def logprob_entry(scored: TokenLogprobs) -> dict:
    """OpenAI's shape of one token's log-probabilities."""
    return {
        "token": scored.token,
        "logprob": scored.logprob,
        "bytes": scored.bytes,
        "top_logprobs": [{"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"]} for t in scored.top],
    }


class LogprobsBuffer:
    """One choice's token log-probabilities until the text they belong to goes out. OpenAI's `content` list
    holds the answer's tokens; the reasoning's go in `reasoning_content` beside it (as its text does)."""

    def __init__(self):
        self.parts: dict[str, list] = {"answer": [], "reasoning": []}

    def add(self, scored: TokenLogprobs) -> None:
        self.parts[scored.kind].append(logprob_entry(scored))

    def take(self, kind: str | None = None) -> dict | None:
        """What has gathered (of one kind, or all): OpenAI's logprobs object, or None if nothing has."""
        kinds = [kind] if kind else list(self.parts)
        out = {}
        for k in kinds:
            if self.parts[k]:
                out["content" if k == "answer" else "reasoning_content"] = self.parts[k]
                self.parts[k] = []
        if not out:
            return None
        out.setdefault("content", [])
        return out


def completion(
    cid: str, created: int, model: str, choices: list[dict], stats: GenerationStats | list[GenerationStats]
) -> dict:
    return {
        "id": cid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(stats),
    }


def chunk(
    cid: str,
    created: int,
    model: str,
    delta: dict,
    finish: str | None = None,
    index: int = 0,
    logprobs: dict | None = None,
) -> dict:
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}],
    }


def usage_chunk(cid: str, created: int, model: str, stats: GenerationStats | list[GenerationStats]) -> dict:
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(stats),
    }


def delta_for(kind: str, text: str) -> dict:
    return {"reasoning_content": text, "reasoning": text} if kind == "reasoning" else {"content": text}


def models_list(model_ids, created: int) -> dict:
    """model_ids: the names of the loaded model (a str: one)."""
    model_ids = (model_ids,) if isinstance(model_ids, str) else model_ids
    return {
        "object": "list",
        "data": [{"id": m, "object": "model", "created": created, "owned_by": "r1desk"} for m in model_ids],
    }


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


class SseChunks:
    """sse(chunk(cid, created, model, delta, finish, index)) for one choice of a stream, with the bytes around the
    delta built once: the same bytes, without serializing the whole chunk for every token."""

    def __init__(self, cid: str, created: int, model: str, index: int = 0):
        head, _, tail = sse(chunk(cid, created, model, {"@": 0}, index=index)).rpartition(b'{"@":0}')
        self.head = head  # the whole chunk up to the delta, the last field but two
        self.tail = tail  # ',"finish_reason":null,"logprobs":null}]}\n\n'
        self.cid, self.created, self.model, self.index = cid, created, model, index

    def __call__(self, delta: dict, finish: str | None = None, logprobs: dict | None = None) -> bytes:
        if finish is not None or logprobs is not None:
            return sse(chunk(self.cid, self.created, self.model, delta, finish, self.index, logprobs))
        return self.head + json.dumps(delta, ensure_ascii=False, separators=(",", ":")).encode() + self.tail


def now() -> int:
    return int(time.time())
