"""The Ollama dialect's routes on the ApiServer (desktop/api/ollama.py): the same service, queue, grammar,
tools and cancellation as the OpenAI routes (ApiServer.generations), answered as Ollama answers: NDJSON lines
while streaming (its default), one object otherwise."""

from __future__ import annotations

import json

from aiohttp import web

from desktop.api import ollama, schema
from model_loader.events import TokenLogprobs  # a plain dataclass: no torch

ROUTES = (
    ("GET", "/api/version"),
    ("GET", "/api/tags"),
    ("POST", "/api/show"),
    ("GET", "/api/ps"),
    ("POST", "/api/chat"),
    ("POST", "/api/generate"),
)


def add_routes(app: web.Application, server) -> None:
    handlers = {
        "/api/version": version,
        "/api/tags": tags,
        "/api/show": show,
        "/api/ps": ps,
        "/api/chat": chat,
        "/api/generate": generate,
    }
    for method, path in ROUTES:
        handler = handlers[path]
        app.router.add_route(method, path, lambda request, h=handler: h(server, request))


async def version(server, request: web.Request) -> web.Response:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        v = package_version("r1desk")
    except PackageNotFoundError:
        v = "0"
    return web.json_response({"version": v})


async def tags(server, request: web.Request) -> web.Response:
    info = server.service.info if server.service.state == "ready" else None
    if not info:
        return web.json_response({"models": []})
    return web.json_response(ollama.tags(server.model_ids, info, _modified(server)))


async def ps(server, request: web.Request) -> web.Response:
    info = server.service.info if server.service.state == "ready" else None
    if not info:
        return web.json_response({"models": []})
    size = int(info.get("weights_bytes", 0)) + int(info.get("kv_cache_bytes", 0))
    return web.json_response(
        {
            "models": [
                {
                    "name": n,
                    "model": n,
                    "size": size,
                    "size_vram": size,
                    "digest": ollama.digest(info),
                    "details": ollama.details(info),
                    "expires_at": "0001-01-01T00:00:00Z",  # loaded while the app runs
                    "context_length": int(info.get("context_length", 0)),
                }
                for n in server.model_ids
            ]
        }
    )


async def show(server, request: web.Request) -> web.Response:
    server._require_model()
    body = ollama._json(await server._body(request))
    ollama._model(body, server.model_ids)
    return web.json_response(ollama.show(server.service.info, _modified(server)))


def _modified(server) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(server.started_at))


async def chat(server, request: web.Request) -> web.StreamResponse:
    server._require_model()
    info = server.service.info or {}
    req = ollama.parse_chat(
        await server._body(request),
        server.model_ids,
        server.defaults,
        int(info.get("context_length", 0)),
        bool(info.get("reasons")),
    )
    return await _answer(server, request, req, "message")


async def generate(server, request: web.Request) -> web.StreamResponse:
    server._require_model()
    info = server.service.info or {}
    req = ollama.parse_generate(
        await server._body(request),
        server.model_ids,
        server.defaults,
        int(info.get("context_length", 0)),
        bool(info.get("reasons")),
        bool(info.get("fim")),
    )
    if req.load_only:
        return web.json_response(
            {"model": req.model, "created_at": ollama.now_iso(), "response": "", "done": True, "done_reason": "load"}
        )
    return await _answer(server, request, req, "response")


async def _answer(server, request, req: ollama.OllamaRequest, shape: str) -> web.StreamResponse:
    """shape: "message" (/api/chat: {"message": {role, content, thinking, tool_calls}}) or "response"
    (/api/generate: {"response", "thinking"})."""
    if req.tools is not None:
        if not (server.service.info or {}).get("tools"):
            raise schema.ApiError(400, "'tools': this model's chat template has no tool support", param="tools")
        req.settings["tools"] = req.tools
    if req.response_format is not None:
        req.settings["constraint"] = await server._constraint(req.response_format)
    async with server.generations(request, [(req.messages, req.settings)], 1, schema.completion_id()) as (gens, events):
        reply = _Reply(req, shape)
        if not req.stream:
            while not reply.done:
                reply.take(await events.get(), gens[0])
            return web.json_response(reply.whole(), dumps=lambda o: json.dumps(o, ensure_ascii=False))
        resp = await server.open_stream(request, "application/x-ndjson")
        out: list[bytes] = []
        while not reply.done:
            if out and events.empty():
                await resp.write(b"".join(out))
                out.clear()
            out += reply.take(await events.get(), gens[0])
        await resp.write_eof(b"".join(out))
        return resp


class _Reply:
    """One reply's events as Ollama's objects: its streamed lines (take) or its one object (whole)."""

    def __init__(self, req: ollama.OllamaRequest, shape: str):
        self.req, self.shape = req, shape
        self.stops = schema.StopMatcher(req.stop)
        self.calls = [] if req.tools is not None else None
        self.parser = None
        if req.tools is not None:
            from model_loader.tool_calls import ToolCallParser

            self.parser = ToolCallParser()
        self.content: list[str] = []
        self.thinking: list[str] = []
        self.logprobs: list[TokenLogprobs] = []
        self.done = False
        self.final: dict | None = None
        self.error = None  # the ApiError a failed reply ended with
        self.all_logprobs: list[TokenLogprobs] = []  # every scored token (the whole reply's object)

    def _line(
        self,
        content: str = "",
        thinking: str = "",
        calls: list | None = None,
        logprobs: list | None = None,
        final: dict | None = None,
    ) -> dict:
        obj = {"model": self.req.model, "created_at": ollama.now_iso()}
        if self.shape == "message":
            message = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            obj["message"] = message
        else:
            obj["response"] = content
            if thinking:
                obj["thinking"] = thinking
        if logprobs:
            obj["logprobs"] = ollama.logprob_entries(logprobs)
        obj["done"] = final is not None
        if final is not None:
            obj.update(final)
        return obj

    def _answer_text(self, text: str) -> tuple[str, list]:
        if self.parser is None:
            return text, []
        content, calls = [], []
        for kind, x in self.parser.feed(text):
            if kind == "content":
                content.append(x)
            else:  # Ollama's calls carry their arguments as an object
                calls.append({"function": {"name": x["name"], "arguments": json.loads(x["arguments"] or "{}")}})
        return "".join(content), calls

    def take(self, ev, gen) -> list[bytes]:
        """One event; returns the NDJSON lines it makes (and gathers the whole reply)."""
        from desktop.api.server import SHUTTING_DOWN, _generation_error

        kind = ev[1]
        if kind == "started":
            return []
        if kind == "logprobs":
            if not self.stops.hit:
                self.logprobs.append(ev[2])
            return []
        if kind == "delta":
            text, part = ev[2], ev[3]
            if part == "reasoning":
                self.thinking.append(text)
                return [self._emit(thinking=text)]
            text = self.stops.feed(text)
            if self.stops.hit:
                gen.cancel()
            content, calls = self._answer_text(text)
            self.content.append(content)
            if calls:
                self.calls += calls
            return [self._emit(content=content, calls=calls)] if content or calls else []
        if kind == "finished":
            stats = ev[2].stats
            tail, calls = self._answer_text(self.stops.flush())
            if self.parser is not None:
                for _, x in self.parser.flush():
                    tail += x
            self.content.append(tail)
            if calls:
                self.calls += calls
            reason = "stop" if self.stops.hit else ollama.DONE_REASONS.get(stats.finish_reason, "stop")
            self.final = {"done_reason": reason, **ollama.final_stats(stats)}
            self.done = True
            return [self._emit(content=tail, calls=calls, final=self.final)]
        self.done = True  # failed, or the server is closing
        self.error = _generation_error(ev[2], ev[3], started=True) if kind == "failed" else SHUTTING_DOWN
        return [json.dumps({"error": self.error.message}).encode() + b"\n"]

    def _emit(self, **kw) -> bytes:
        logprobs, self.logprobs = self.logprobs, []
        self.all_logprobs += logprobs
        line = self._line(logprobs=logprobs, **kw)
        return json.dumps(line, ensure_ascii=False).encode() + b"\n"

    def whole(self) -> dict:
        if self.error is not None:
            raise self.error
        return self._line(
            content="".join(self.content),
            thinking="".join(self.thinking),
            calls=self.calls,
            logprobs=self.all_logprobs + self.logprobs,
            final=self.final,
        )
