"""Tool calls in the format of Qwen2.5 and its derivatives (Hermes' format): the chat template lists the tools in
the system turn and the model answers a call as

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call; results come back as `tool` messages, which the template renders as <tool_response> blocks.
Pure text: which templates take tools, the messages in the shape those templates expect, a streaming parser
that splits a reply into content and calls, and the grammar that makes a reply a call (tool_choice "required"
or a named function; model_loader.grammar compiles it). The R1 distills' template has no tools.
"""

from __future__ import annotations

import json

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def template_supports_tools(template: str | None) -> bool:
    """Does the chat template render a `tools` variable (Qwen2.5's does; R1's doesn't)?"""
    if not template:
        return False
    from jinja2 import meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        return "tools" in meta.find_undeclared_variables(ImmutableSandboxedEnvironment().parse(template))
    except Exception:  # a template jinja can't parse has no tools we could use
        return False


def template_messages(messages: list[dict]) -> list[dict]:
    """The messages as tool-aware templates take them: an assistant's call arguments as an object (OpenAI sends
    them as a JSON string; Qwen2.5's template writes `arguments | tojson`, which would quote the string again)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = {**m, "tool_calls": [_call_for_template(c) for c in calls]}
        out.append(m)
    return out


def _call_for_template(call: dict) -> dict:
    fn = dict(call.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            fn["arguments"] = json.loads(args)
        except ValueError:
            pass  # not JSON: the text as the client sent it
    return {**call, "function": fn}


class ToolCallParser:
    """Splits a reply, as it streams, into content and tool calls. feed() returns what is settled:
    ("content", text) and ("call", {"name", "arguments"}) items, arguments as a JSON string (OpenAI's shape).
    Text that may be the start of a call is held back until it is or isn't. A block that doesn't hold a call
    (bad JSON, no name) stays content: the client sees what the model wrote rather than nothing."""

    def __init__(self):
        self.buffer = ""
        self.in_call = False
        self.calls = 0

    def feed(self, text: str) -> list[tuple[str, object]]:
        self.buffer += text
        out: list[tuple[str, object]] = []
        while True:
            if self.in_call:
                end = self.buffer.find(CLOSE)
                if end < 0:
                    return out
                body, self.buffer = self.buffer[:end], self.buffer[end + len(CLOSE) :]
                self.in_call = False
                call = parse_call(body)
                if call is None:
                    out.append(("content", OPEN + body + CLOSE))
                else:
                    self.calls += 1
                    out.append(("call", call))
                continue
            start = self.buffer.find(OPEN)
            if start >= 0:
                if start:
                    out.append(("content", self.buffer[:start]))
                self.buffer = self.buffer[start + len(OPEN) :]
                self.in_call = True
                continue
            keep = _partial_suffix(self.buffer, OPEN)
            settled = self.buffer[: len(self.buffer) - keep]
            self.buffer = self.buffer[len(self.buffer) - keep :]
            if settled:
                out.append(("content", settled))
            return out

    def flush(self) -> list[tuple[str, object]]:
        """The reply has ended: an unfinished block is content as written."""
        rest = (OPEN if self.in_call else "") + self.buffer
        self.buffer, self.in_call = "", False
        return [("content", rest)] if rest else []


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of text that is a proper start of tag."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def parse_call(body: str) -> dict | None:
    try:
        obj = json.loads(body.strip())
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return {"name": obj["name"], "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}


def call_schema(tools: list[dict], names: list[str]) -> dict:
    """The JSON of one call to one of the named tools, arguments valid for the tool's parameters schema."""
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": by_name[name].get("parameters") or {"type": "object"}},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name in names
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


def tool_call_lark(
    tools: list[dict],
    names: list[str],
    parallel: bool,
    json_options: dict,
    tag_ids: tuple[int | None, int | None] = (None, None),
) -> str:
    """A Lark grammar (llguidance's dialect) for a reply that is one call, or several where parallel calls are
    allowed, to the named tools. tag_ids: the token ids of <tool_call> and </tool_call> where each is one added
    token (Qwen2.5's): the grammar names the token itself (`<[id]>`), which is what the model writes."""
    schema = {**call_schema(tools, names), "x-guidance": json_options}
    open_tag, close_tag = (f"<[{i}]>" if i is not None else json.dumps(t) for i, t in zip(tag_ids, (OPEN, CLOSE)))
    calls = 'call ("\\n" call)*' if parallel else "call"
    return f'start: {calls}\ncall: {open_tag} "\\n" body "\\n" {close_tag}\nbody: %json {json.dumps(schema)}\n'
