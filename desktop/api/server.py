"""The local HTTP server: aiohttp's web server on the app's own asyncio loop (qasync in the window, the same
loop in `r1desk-cli serve`), speaking OpenAI's chat-completions dialect. Every request goes through the
EngineService queue like a chat reply does.

Security: binds 127.0.0.1 unless told otherwise, and another address only with an API key. The Host header
must name a loopback host (DNS rebinding: a web page can make the browser send requests to localhost under
its own domain name, but not with a loopback Host header). No CORS headers unless origins are listed.
Nothing in a request can name a file or a model path: the model is whatever the service has loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
from pathlib import Path

from aiohttp import web

from desktop.api import schema
from desktop.api.schema import ApiError
from desktop.service import NotReady, QueueFull

MAX_BODY_BYTES = 4 * 2**20
LOOPBACK_NAMES = {"localhost", "localhost.", "ip6-localhost", "ip6-loopback"}
RETRY_AFTER_S = 5
# A preflight that names no headers gets these; one that names its own (the OpenAI JavaScript SDK sends
# x-stainless-* headers with every request) gets them back: the origin is listed, so its headers are welcome.
PREFLIGHT_HEADERS = "Authorization, Content-Type"

SHUTDOWN_GRACE_S = 1.0  # what a closing server gives its connections once every handler was told to end
# The body of every 500: what went wrong is in the server's log, never in an answer (it can name files, paths)
INTERNAL_ERROR = ApiError(
    500,
    "the server failed to answer this request; its log has the details",
    type_="server_error",
    code="internal_error",
)

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def normalize_origins(origins) -> frozenset:
    """The origins a server lets in, as it compares them with a request's Origin header (no trailing slash, no
    blanks, each once): what the window's settings hold is compared in this form too, so that an origin
    written with a slash doesn't look like a change."""
    return frozenset(o.strip().rstrip("/") for o in origins if o and o.strip())


def _host_name(header: str) -> str:
    """The host part of a Host header: "[::1]:8080" -> "::1", "localhost:80" -> "localhost"."""
    header = header.strip()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class ApiServer:
    """One server for one EngineService. start() binds and returns the port; stop() closes connections
    (requests in flight are cancelled through their disconnect)."""

    def __init__(
        self,
        service,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        allowed_origins: list[str] | tuple = (),
        defaults: dict | None = None,
        served_names: list[str] | tuple = (),
    ):
        """served_names: the model ids clients may ask for (the first is the one /v1/models lists first);
        none: the loaded folder's name."""
        if not is_loopback(host) and not api_key:
            raise ValueError(f"serving on {host} (reachable from other computers) needs an API key")
        self.service = service
        self.host = host
        self.requested_port = port  # 0: any free port
        self.port = port  # the port in use once started
        self.api_key = api_key or None
        self.allowed_origins = normalize_origins(allowed_origins)
        self.defaults = defaults if defaults is not None else {}  # the app's temperature/top_p, shared, live
        self.served_names = tuple(dict.fromkeys(n for n in served_names if n))
        self.runner: web.AppRunner | None = None
        self.started_at = schema.now()
        self.closing = False
        self._open: set[asyncio.Queue] = set()  # the events queue of each request being answered
        from desktop.api.metrics import ServiceMetrics

        self.metrics = ServiceMetrics(service)

    # ------------------------------------------------------------------ life
    def make_app(self) -> web.Application:
        # outermost first: CORS headers go on every response a listed origin gets, errors included (a browser
        # shows a page only "a CORS error" for a response without them, never the message)
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[self._cors, self._errors, self._guard])
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_page)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model:.+}", self.model)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        from desktop.api import ollama_route

        ollama_route.add_routes(app, self)
        app.router.add_get("/", self.root)
        return app

    async def start(self) -> int:
        # handler_cancellation: a client that hangs up cancels its handler, which cancels its generation.
        self.runner = web.AppRunner(
            self.make_app(), handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S
        )
        await self.runner.setup()
        # reuse_address left to asyncio: on POSIX it is on (a restart rebinds a port still in TIME_WAIT); on
        # Windows SO_REUSEADDR would let another program bind the same port beside us
        site = web.TCPSite(self.runner, self.host, self.port)
        await site.start()
        self.port = self.runner.addresses[0][1]
        return self.port

    async def stop(self) -> None:
        """Every request being answered ends now: a stream gets a last error event and [DONE], a request still
        waiting for its answer a 503, and their generations are cancelled. Then the connections close."""
        self.closing = True
        for events in list(self._open):
            events.put_nowait((-1, "shutdown"))
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await runner.cleanup()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    @property
    def model_id(self) -> str | None:
        """The loaded model's id: the first served name, else its folder (or HF repo) name. None while nothing
        is loaded."""
        ids = self.model_ids
        return ids[0] if ids else None

    @property
    def model_ids(self) -> tuple[str, ...]:
        """Every id the loaded model answers to (--served-model-name, several allowed); none while nothing is
        loaded."""
        info = self.service.info
        if not info:
            return ()
        return self.served_names or (info.get("model_name") or Path(info.get("model_path", "model")).name,)

    # ------------------------------------------------------------------ middlewares
    @web.middleware
    async def _cors(self, request: web.Request, handler):
        response = await handler(request)
        origin = self._listed_origin(request)
        if origin and not response.prepared:  # a stream sets them itself before it starts (_stream)
            for name, value in self._cors_headers(origin).items():
                response.headers.setdefault(name, value)  # a preflight's own stay
        return response

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        """Every error in OpenAI's shape, aiohttp's own (404, 405, 413) and our own bugs included."""
        try:
            return await handler(request)
        except ApiError as err:
            return _error_response(err, request.path)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            status = exc.status
            if status == 404:
                err = ApiError(404, f"no route {request.method} {request.path}", code="not_found")
            elif status == 405:
                err = ApiError(
                    405,
                    f"{request.method} is not allowed on {request.path}",
                    code="method_not_allowed",
                    headers={"Allow": exc.headers.get("Allow", "")},
                )
            elif status == 413:
                err = ApiError(
                    413, f"the request body is larger than {MAX_BODY_BYTES // 2**20} MiB", code="request_too_large"
                )
            else:
                err = ApiError(status, exc.reason or str(exc))
            return _error_response(err, request.path)
        except ConnectionError:  # the client went away mid-answer: nobody to answer; aiohttp closes it
            raise
        except Exception:  # not a client's fault: a generic answer; the traceback goes to the log
            log.exception("API request %s %s failed", request.method, request.path)
            return _error_response(INTERNAL_ERROR, request.path)

    @web.middleware
    async def _guard(self, request: web.Request, handler):
        host = _host_name(request.headers.get("Host", ""))
        if not self._host_allowed(host):
            raise ApiError(
                403,
                f"the Host header {host!r} is not a loopback name or address (requests through "
                "another name are refused: DNS-rebinding protection)",
                type_="permission_error",
                code="forbidden_host",
            )
        origin = self._listed_origin(request)
        if "Origin" in request.headers and origin is None:
            # A web page's request (a browser always names the page's origin; programs send none): a page not
            # listed gets nothing done. Without this, a form-like POST (text/plain needs no preflight) from any
            # site the user visits would make this computer generate, key or no key when none is set.
            raise ApiError(
                403,
                f"requests from the web page origin {request.headers['Origin']!r} are not allowed "
                "(list it with --allow-origin, or in Settings, to let that page use the API)",
                type_="permission_error",
                code="forbidden_origin",
            )
        if request.method == "OPTIONS" and origin:  # a browser's preflight for a listed origin
            asked = request.headers.get("Access-Control-Request-Headers", "").strip()
            return web.Response(status=204, headers=self._cors_headers(origin, preflight=asked or PREFLIGHT_HEADERS))
        if request.method == "POST" and request.content_type != "application/json":
            raise ApiError(
                415,
                f"the request body must be JSON sent as 'Content-Type: application/json' (got "
                f"{request.headers.get('Content-Type', 'none')!r})",
                code="unsupported_media_type",
            )
        if request.path.startswith(("/v1/", "/api/")) and self.api_key and not self._key_ok(request):
            raise ApiError(
                401, "a valid API key is required: send it as 'Authorization: Bearer KEY'", code="invalid_api_key"
            )
        return await handler(request)

    def _listed_origin(self, request: web.Request) -> str | None:
        origin = request.headers.get("Origin", "").rstrip("/")
        return origin if origin in self.allowed_origins else None

    def _host_allowed(self, host: str) -> bool:
        if is_loopback(host):
            return True
        if is_loopback(self.host):
            return False
        # Serving on another address (only with an API key): that address, or any name on a wildcard bind;
        # the key is what guards it there.
        return self.host in ("0.0.0.0", "::", "") or host.lower() == self.host.lower()

    def _key_ok(self, request: web.Request) -> bool:
        auth = request.headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        # surrogateescape: a header's bytes that aren't UTF-8 (aiohttp keeps them as surrogates) compare unequal
        # instead of raising
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode("utf-8", "surrogateescape"), self.api_key.encode()
        )

    def _cors_headers(self, origin: str, preflight: str = "") -> dict:
        """preflight: the headers the preflight's answer allows (a preflight only)."""
        h = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
        if preflight:
            h.update(
                {
                    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                    "Access-Control-Allow-Headers": preflight,
                    "Access-Control-Max-Age": "600",
                    "Vary": "Origin, Access-Control-Request-Headers",
                }
            )
        return h

    # ------------------------------------------------------------------ routes
    async def root(self, request: web.Request) -> web.Response:
        """What a client probing the port reads (Ollama's clients check that something answers here)."""
        return web.Response(text="r1desk is running: OpenAI's API at /v1, Ollama's at /api\n")

    async def health(self, request: web.Request) -> web.Response:
        s = self.service
        # Open without a key (a liveness probe), but what the last request was is for key holders only.
        last = s.last if not self.api_key or self._key_ok(request) else None
        status = {"ready": "ok", "warming": "loading"}.get(s.state, s.state)  # to a probe, warming up is loading
        return web.json_response(
            {
                "status": status,
                "model": self.model_id,
                "running": len(s.active),
                "waiting": len(s.waiting),
                "last": last,
            }
        )

    async def metrics_page(self, request: web.Request) -> web.Response:
        """Prometheus' text format; behind the API key where one is set (a shared server's load is its own)."""
        if self.api_key and not self._key_ok(request):
            raise ApiError(
                401, "a valid API key is required: send it as 'Authorization: Bearer KEY'", code="invalid_api_key"
            )
        return web.Response(body=self.metrics.render(), headers={"Content-Type": self.metrics.content_type})

    async def models(self, request: web.Request) -> web.Response:
        self._require_model()
        return web.json_response(schema.models_list(self.model_ids, self.started_at))

    async def model(self, request: web.Request) -> web.Response:
        self._require_model()
        name = request.match_info["model"]
        if name not in self.model_ids:
            raise ApiError(404, f"The model '{name}' does not exist", param="model", code="model_not_found")
        return web.json_response(schema.models_list((name,), self.started_at)["data"][0])

    def _require_model(self) -> str:
        model_id = self.model_id
        if self.closing:
            raise ApiError(503, "the server is shutting down", type_="server_error", code="server_shutdown")
        if self.service.state != "ready" or model_id is None:
            raise ApiError(
                503,
                "the model is not loaded yet; try again when it is ready",
                type_="server_error",
                code="model_not_ready",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        return model_id

    async def completions(self, request: web.Request) -> web.StreamResponse:
        from desktop.api import completions_route

        return await completions_route.handle(self, request)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        model_id = self._require_model()
        body = await self._body(request)
        req = schema.parse_chat_request(
            body, self.model_ids, self.defaults, int((self.service.info or {}).get("vocab_size") or 0)
        )
        model_id = req.model  # the name it asked for, of those it may (--served-model-name)
        if req.tools is not None:
            if not (self.service.info or {}).get("tools"):
                raise ApiError(
                    400,
                    "'tools': this model's chat template has no tool support (it doesn't render "
                    "tool definitions: the DeepSeek-R1 distills' doesn't); send the request without "
                    "tools, or with tool_choice none",
                    param="tools",
                    code="tools_not_supported",
                )
            req.settings["tools"] = req.tools
        if req.response_format is not None:
            req.settings["constraint"] = await self._constraint(req.response_format)
        elif req.tool_choice in ("required", "function"):  # the reply must be a call: a grammar makes it one
            req.settings["constraint"] = await self._tool_constraint(req)
        self._limit_tokens(req.settings)
        if req.continue_final:
            req.settings["continue_final"] = True
        cid = schema.completion_id()
        async with self.generations(request, [(req.messages, req.settings)], req.n, cid) as (gens, events):
            if req.stream:
                return await self._stream(request, req, gens, events, model_id, cid)
            return await self._collect(req, gens, events, model_id, cid)

    async def _body(self, request: web.Request) -> bytes:
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            raise web.HTTPRequestEntityTooLarge(MAX_BODY_BYTES, request.content_length)
        return await request.read()

    def _limit_tokens(self, settings: dict) -> None:
        # asked for: prompt + max_tokens past the context is a 400; not: the rest of the context (as vLLM does)
        if "max_new_tokens" in settings:
            settings["length_strict"] = True

    @contextlib.asynccontextmanager
    async def generations(self, request: web.Request, prompts: list[tuple], n: int, name: str):
        """Submit n replies to each of prompts ((messages, settings) pairs) and wait for the first event; yields
        (generations, events): reply i * n + j is the j-th sample of prompt i, and its events come on the queue as
        (index, kind, ...). The n samples of a prompt decode together and share its prefill. Whatever ends the
        block (the answer sent, the client gone, the server closing), replies still running are cancelled."""
        events: asyncio.Queue = asyncio.Queue()
        total = n * len(prompts)
        if total > 1 and self.service.state == "ready" and len(self.service.waiting) + total > self.service.max_waiting:
            raise ApiError(
                429,
                f"too many requests are waiting ({len(self.service.waiting)} of "
                f"{self.service.max_waiting}, and this one asks for {total} replies); retry later",
                type_="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        gens = []
        try:
            for p, (messages, base) in enumerate(prompts):
                for j in range(n):
                    settings = dict(base)
                    if "seed" in settings:  # n samples of one seed: seed, seed + 1, ... (each replays alone)
                        settings["seed"] = (settings["seed"] + j) % (2**32)
                    gens.append(
                        self.service.submit(
                            messages,
                            settings,
                            client="api",
                            label=_client_label(request),
                            samples_of=(f"{name}/{p}", n) if n > 1 else None,
                        )
                    )
                    self._route(gens[-1], len(gens) - 1, events)
        except QueueFull as err:
            for gen in gens:
                gen.cancel()
            raise ApiError(
                429,
                f"too many requests are waiting ({err}); retry later",
                type_="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from None
        except NotReady as err:
            for gen in gens:
                gen.cancel()
            raise ApiError(
                503,
                f"{err}; try again when it is ready",
                type_="server_error",
                code="model_not_ready",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from None
        self._open.add(events)
        try:
            first = await events.get()  # waits in the queue, then through the prefill
            if first[1] == "failed":
                raise _generation_error(first[2], first[3])
            if first[1] == "shutdown":
                raise SHUTTING_DOWN
            events.put_nowait(first)  # ... and is read again with the rest
            yield gens, events
        finally:
            self._open.discard(events)
            for gen in gens:
                if gen.state != "done":
                    gen.cancel()

    async def _constraint(self, response_format: dict):
        """The grammar of a structured output, compiled off the event loop (the first one also builds the
        grammar library's view of the tokenizer: about a second); 400 for a schema it can't compile."""
        from model_loader.grammar import GrammarError, compile_json

        info = self.service.info or {}
        try:
            return await asyncio.get_running_loop().run_in_executor(
                None, compile_json, info.get("model_path"), int(info.get("vocab_size") or 0), response_format["schema"]
            )
        except GrammarError as err:
            raise ApiError(
                400,
                f"'{response_format['param']}' can't be used: {err}",
                param=response_format["param"],
                code="invalid_schema",
            ) from None

    async def _tool_constraint(self, req):
        from model_loader.grammar import GrammarError, compile_tool_calls

        info = self.service.info or {}
        try:
            return await asyncio.get_running_loop().run_in_executor(
                None,
                compile_tool_calls,
                info.get("model_path"),
                int(info.get("vocab_size") or 0),
                req.tools,
                req.tool_names,
                req.parallel_tool_calls,
            )
        except GrammarError as err:
            raise ApiError(
                400, f"'tools': the parameters can't be used: {err}", param="tools", code="invalid_schema"
            ) from None

    async def open_stream(self, request: web.Request, content_type: str = "text/event-stream") -> web.StreamResponse:
        """A streamed answer's response, prepared (its headers go out with the first write), with the CORS
        headers a listed origin gets."""
        resp = _SseResponse(
            headers={"Content-Type": content_type, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        origin = self._listed_origin(request)
        if origin:
            resp.headers.update(self._cors_headers(origin))
        await resp.prepare(request)
        return resp

    @staticmethod
    def _route(gen, index: int, events: asyncio.Queue) -> None:
        gen.started.connect(lambda started: events.put_nowait((index, "started", started)))
        gen.delta.connect(lambda text, kind, n: events.put_nowait((index, "delta", text, kind)))
        gen.finished.connect(lambda result: events.put_nowait((index, "finished", result)))
        gen.failed.connect(lambda kind, message: events.put_nowait((index, "failed", kind, message)))
        gen.logprobs.connect(lambda scored: events.put_nowait((index, "logprobs", scored)))

    async def _collect(self, req, gens, events, model_id, cid) -> web.Response:
        stops = [schema.StopMatcher(req.stop) for _ in gens]
        reasoning, answer = [[] for _ in gens], [[] for _ in gens]
        choices, stats = [None] * len(gens), [None] * len(gens)
        scored = [schema.LogprobsBuffer() for _ in gens]
        while any(c is None for c in choices):
            ev = await events.get()
            i, kind = ev[0], ev[1]
            if kind == "logprobs":
                if not stops[i].hit:  # tokens past a stop string are not part of the reply
                    scored[i].add(ev[2])
            elif kind == "delta":
                if ev[3] == "reasoning":
                    reasoning[i].append(ev[2])
                else:
                    answer[i].append(stops[i].feed(ev[2]))
                    if stops[i].hit:
                        gens[i].cancel()
            elif kind == "finished":
                stats[i] = ev[2].stats
                answer[i].append(stops[i].flush())
                finish = "stop" if stops[i].hit else schema.FINISH_REASONS.get(stats[i].finish_reason, "stop")
                logprobs = scored[i].take() if "logprobs" in req.settings else None
                logprobs = logprobs or ({"content": []} if "logprobs" in req.settings else None)
                text = "".join(answer[i])
                if req.tools is not None:
                    content, calls = schema.split_tool_calls(text)
                    choices[i] = schema.choice(
                        i, "".join(reasoning[i]), content, "tool_calls" if calls else finish, logprobs, calls
                    )
                else:
                    choices[i] = schema.choice(i, "".join(reasoning[i]), text, finish, logprobs)
            elif kind == "failed":
                raise _generation_error(ev[2], ev[3], started=True)
            elif kind == "shutdown":
                raise SHUTTING_DOWN
        return web.json_response(schema.completion(cid, schema.now(), model_id, choices, stats), dumps=_dumps)

    async def _stream(self, request, req, gens, events, model_id, cid) -> web.StreamResponse:
        created = schema.now()
        stops = [schema.StopMatcher(req.stop) for _ in gens]
        sse_delta = [schema.SseChunks(cid, created, model_id, index=i) for i in range(len(gens))]
        resp = await self.open_stream(request)
        # What is ready goes out in one write: the headers, the role chunks and the first token (the real engine's
        # Started and first Delta arrive together), and later every delta that queued up during a write.
        out = [chunks({"role": "assistant", "content": ""}) for chunks in sse_delta]
        stats: list = [None] * len(gens)
        scored = [schema.LogprobsBuffer() for _ in gens]
        calls = [schema.StreamedToolCalls(sse_delta[i]) if req.tools is not None else None for i in range(len(gens))]
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
                text, part = ev[2], ev[3]
                if part == "answer":
                    text = stops[i].feed(text)
                    if stops[i].hit:
                        gens[i].cancel()
                if text and part == "answer" and calls[i] is not None:  # content, and tool calls as deltas
                    out += calls[i].feed(text, scored[i].take(part))
                elif text:  # the tokens scored so far go with the text they wrote
                    out.append(sse_delta[i](schema.delta_for(part, text), logprobs=scored[i].take(part)))
            elif kind == "finished":
                stats[i] = ev[2].stats
                tail = stops[i].flush()
                if calls[i] is not None:
                    out += calls[i].feed(tail, scored[i].take("answer")) + calls[i].flush()
                elif tail:
                    out.append(sse_delta[i]({"content": tail}, logprobs=scored[i].take("answer")))
                finish = "stop" if stops[i].hit else schema.FINISH_REASONS.get(stats[i].finish_reason, "stop")
                if calls[i] is not None and calls[i].count:
                    finish = "tool_calls"
                out.append(sse_delta[i]({}, finish, logprobs=scored[i].take()))
            elif kind == "failed":  # the 200 status is set: the error goes in the stream, as OpenAI's does
                err = _generation_error(ev[2], ev[3], started=True)
                out.append(schema.sse(err.body()))
                break
            elif kind == "shutdown":
                out.append(schema.sse(SHUTTING_DOWN.body()))
                break
        else:
            if req.include_usage:
                out.append(schema.sse(schema.usage_chunk(cid, created, model_id, stats)))
        out.append(schema.SSE_DONE)
        await resp.write_eof(b"".join(out))
        return resp


class _SseResponse(web.StreamResponse):
    """A StreamResponse whose headers go out with its first write (one packet with the first chunk) rather
    than on their own at prepare(), as aiohttp's web.Response already does."""

    _send_headers_immediately = False


SHUTTING_DOWN = ApiError(
    503, "the server is shutting down; the reply was ended", type_="server_error", code="server_shutdown"
)


def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False)


def _error_response(err: ApiError, path: str = "") -> web.Response:
    """OpenAI's error shape; Ollama's ({"error": message}) on its routes."""
    body = {"error": err.message} if path.startswith("/api/") else err.body()
    return web.json_response(body, status=err.status, headers=err.headers, dumps=_dumps)


def _generation_error(kind: str, message: str, started: bool = False) -> ApiError:
    if kind == "context_full" and not started:
        return ApiError(
            400,
            f"This model's context is too small for these messages: {message}",
            param="messages",
            code="context_length_exceeded",
        )
    if kind in ("unloaded", "not_ready"):
        return ApiError(
            503, message, type_="server_error", code="model_not_ready", headers={"Retry-After": str(RETRY_AFTER_S)}
        )
    if kind == "cancelled":
        return ApiError(503, f"the request was cancelled: {message}", type_="server_error", code="cancelled")
    if kind == "oom":
        return ApiError(500, f"out of GPU memory: {message}", type_="server_error", code="out_of_memory")
    if kind == "internal":  # a bug, not the request's fault: its text is for the log only
        log.error("a generation failed: %s", message)
        return INTERNAL_ERROR
    return ApiError(500, message, type_="server_error", code=kind or None)


def _client_label(request: web.Request) -> str:
    """Who asked, for the request log: the peer address and the client's name from its User-Agent."""
    peer = request.remote or "?"
    agent = request.headers.get("User-Agent", "").split(" ")[0][:40]
    if agent and is_loopback(peer):  # this computer: the program's name says who it is
        return agent
    return f"{peer} · {agent}" if agent else peer
