"""POST /v1/completions on the ApiServer: the raw-prompt requests of desktop/api/completions.py, through the same
service, queue and cancellation as chat (ApiServer.generations)."""

from __future__ import annotations

from aiohttp import web

from model_loader.events import GenerationStats  # a plain dataclass: no torch

from desktop.api import completions as cmp
from desktop.api import schema


async def handle(server, request: web.Request) -> web.StreamResponse:
    server._require_model()
    body = await server._body(request)
    info = server.service.info or {}
    req = cmp.parse_completion_request(
        body, server.model_ids, server.defaults, int(info.get("vocab_size") or 0), bool(info.get("fim"))
    )
    req.settings["length_strict"] = True  # max_tokens is always set here (16 by default)
    cid = cmp.completion_name()
    prompts = [([], {**req.settings, "raw_prompt": p}) for p in req.prompts]
    async with server.generations(request, prompts, req.n, cid) as (gens, events):
        if req.stream:
            return await _stream(server, request, req, gens, events, cid)
        return await _collect(req, gens, events, cid)


def _usage(req, stats: list[GenerationStats]) -> dict:
    """Each prompt counted once (its n samples share it), every choice's tokens."""
    prompt = sum(stats[p * req.n].prompt_tokens for p in range(len(req.prompts)))
    completion = sum(s.completion_tokens for s in stats)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _echo(req, index: int) -> str:
    return req.echo_texts[index // req.n] if req.echo_texts else ""


async def _collect(req, gens, events, cid) -> web.Response:
    from desktop.api.server import SHUTTING_DOWN, _dumps, _generation_error

    stops = [schema.StopMatcher(req.stop) for _ in gens]
    texts = [[_echo(req, i)] for i in range(len(gens))]
    scored = [cmp.LegacyLogprobs(len(texts[i][0])) for i in range(len(gens))]
    choices, stats = [None] * len(gens), [None] * len(gens)
    while any(c is None for c in choices):
        ev = await events.get()
        i, kind = ev[0], ev[1]
        if kind == "logprobs":
            if not stops[i].hit:
                scored[i].add(ev[2])
        elif kind == "delta":  # a raw prompt has no reasoning split: every delta is the text
            texts[i].append(stops[i].feed(ev[2]))
            if stops[i].hit:
                gens[i].cancel()
        elif kind == "finished":
            stats[i] = ev[2].stats
            texts[i].append(stops[i].flush())
            finish = "stop" if stops[i].hit else schema.FINISH_REASONS.get(stats[i].finish_reason, "stop")
            choices[i] = cmp.choice(
                i, "".join(texts[i]), finish, scored[i].take() if req.logprobs is not None else None
            )
        elif kind == "failed":
            raise _generation_error(ev[2], ev[3], started=True)
        elif kind == "shutdown":
            raise SHUTTING_DOWN
    return web.json_response(cmp.response(cid, schema.now(), req.model, choices, _usage(req, stats)), dumps=_dumps)


async def _stream(server, request, req, gens, events, cid) -> web.StreamResponse:
    from desktop.api.server import SHUTTING_DOWN, _generation_error

    created = schema.now()
    resp = await server.open_stream(request)
    stops = [schema.StopMatcher(req.stop) for _ in gens]
    scored = [cmp.LegacyLogprobs(len(_echo(req, i))) for i in range(len(gens))]

    def piece(i: int, text: str, finish: str | None = None) -> bytes:
        logprobs = scored[i].take() if req.logprobs is not None else None
        return schema.sse(cmp.response(cid, created, req.model, [cmp.choice(i, text, finish, logprobs)]))

    out = [piece(i, _echo(req, i)) for i in range(len(gens)) if _echo(req, i)]
    stats: list = [None] * len(gens)
    while any(s is None for s in stats):
        if out and events.empty():
            await resp.write(b"".join(out))
            out.clear()
        ev = await events.get()
        i, kind = ev[0], ev[1]
        if kind == "logprobs":
            if not stops[i].hit:
                scored[i].add(ev[2])
        elif kind == "delta":
            text = stops[i].feed(ev[2])
            if stops[i].hit:
                gens[i].cancel()
            if text:
                out.append(piece(i, text))
        elif kind == "finished":
            stats[i] = ev[2].stats
            finish = "stop" if stops[i].hit else schema.FINISH_REASONS.get(stats[i].finish_reason, "stop")
            out.append(piece(i, stops[i].flush(), finish))
        elif kind == "failed":
            out.append(schema.sse(_generation_error(ev[2], ev[3], started=True).body()))
            break
        elif kind == "shutdown":
            out.append(schema.sse(SHUTTING_DOWN.body()))
            break
    else:
        if req.include_usage:
            out.append(schema.sse(cmp.response(cid, created, req.model, [], _usage(req, stats))))
    out.append(schema.SSE_DONE)
    await resp.write_eof(b"".join(out))
    return resp
