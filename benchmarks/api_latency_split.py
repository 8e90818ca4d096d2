"""Where does the local API's share of time-to-first-token go? Measured on any machine (no GPU, no model).

The real ApiServer + EngineService + engine worker thread run in this process exactly as `r1desk-cli serve` sets
them up (QCoreApplication, the app's Qt-integrated loop (desktop.fastloop; --loop qasync for qasync's own), the
same switch interval and GC guard), with a scripted engine that
spends a fixed time per token (tests/desktop/fakes.py's FakeEngine). Like the real engine, it yields Started and
the first token together, after the first token's time. The engine itself is not what is measured.

A client in a child process (as a real client is) streams N requests one at a time: raw http.client on one
kept-alive connection, then the official `openai` client (one client object, so its connection is kept alive
too). Every step is stamped with time.perf_counter (CLOCK_MONOTONIC on Linux: one clock for all threads and
processes), and each request is matched to its server-side stamps by an id it carries. Medians per phase:

    send -> handler        the client's call until the aiohttp handler runs (the client's own request building
                           and sending, the kernel, aiohttp's parsing, the event loop's hops)
    handler -> engine      the handler until the engine's generate() runs on the worker thread (parse, queue,
                           the queued signal to the worker thread)
    token -> client        the engine yields the first token until the client has the first reasoning/content
                           chunk (the queued signal back, the asyncio queue, the SSE writes, the client's parsing)
    TTFT - engine TTFT     the client's time to first token minus the engine's own (from generate() to its first
                           token): everything the API adds

Baseline: the same two clients against a minimal aiohttp app on plain asyncio that answers at once with a canned
SSE stream, so the openai client's own work can be told from the server's share.

With --model M the engine is the real one (model_loader.Engine on the GPU, loaded and warmed up as the app
does), stamped the same way: generate() entered, and its first Delta carrying text.

    python -m benchmarks.api_latency_split [-n 300] [--token-ms 1.4] [--model M [--context N]] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the client process runs this module from here

MODEL_PATH = "/models/DeepSeek-R1-Distill-Qwen-1.5B"
ID_HEADER = "X-Bench-Id"


# ---------------------------------------------------------------------------------------------- client side
def _is_first_text(line: bytes) -> bool:
    """An SSE line carrying reasoning or answer text (not the role chunk's empty content)."""
    if not line.startswith(b"data: {"):
        return False
    return b'"reasoning_content":"' in line or (b'"content":"' in line and b'"content":""' not in line)


def client_main(url: str, model: str, mode: str, n: int, warmup: int, prefix: str, max_tokens: int) -> None:
    """Runs in the child process; prints one JSON list of {id, send, first} (perf_counter seconds)."""
    from urllib.parse import urlsplit

    rows = []
    ids = [f"{prefix}-w{i}" for i in range(warmup)] + [f"{prefix}-{i}" for i in range(n)]
    if mode == "raw":
        import http.client

        u = urlsplit(url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        conn.connect()
        for rid in ids:
            body = json.dumps(
                {
                    "model": model,
                    "messages": [{"role": "user", "content": f"bench {rid}"}],
                    "max_tokens": max_tokens,
                    "stream": True,
                }
            ).encode()
            first = None
            send = time.perf_counter()
            conn.request(
                "POST",
                u.path + "/chat/completions",
                body=body,
                headers={"Content-Type": "application/json", ID_HEADER: rid},
            )
            resp = conn.getresponse()
            while True:
                line = resp.readline()
                if not line:
                    break
                if first is None and _is_first_text(line):
                    first = time.perf_counter()
            assert resp.status == 200 and first is not None, (resp.status, rid)
            rows.append({"id": rid, "send": send, "first": first})
        conn.close()
    else:
        import openai

        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
        pause = float(os.environ.get("R1DESK_BENCH_PAUSE_MS", "0")) / 1000
        for rid in ids:
            first = None
            if pause:
                time.sleep(pause)
            send = time.perf_counter()
            stream = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": f"bench {rid}"}],
                max_tokens=max_tokens,
                stream=True,
                extra_headers={ID_HEADER: rid},
            )
            for chunk in stream:
                if first is None and chunk.choices:
                    d = chunk.choices[0].delta
                    if d.content or (d.model_extra or {}).get("reasoning_content"):
                        first = time.perf_counter()
            assert first is not None, rid
            rows.append({"id": rid, "send": send, "first": first})
    print(json.dumps(rows[warmup:]))


def run_client(url: str, model: str, mode: str, n: int, warmup: int, prefix: str, max_tokens: int) -> list[dict]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.api_latency_split",
            "--client",
            mode,
            "--url",
            url,
            "--model-id",
            model,
            "-n",
            str(n),
            "--warmup",
            str(warmup),
            "--prefix",
            prefix,
            "--max-tokens",
            str(max_tokens),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    if out.returncode != 0:
        raise SystemExit(f"the {mode} client failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------- baseline
CANNED_MODEL = "instant"


def _canned_stream() -> bytes:
    from desktop.api import schema

    cid, created = "chatcmpl-instant", 0
    parts = [
        schema.chunk(cid, created, CANNED_MODEL, {"role": "assistant", "content": ""}),
        schema.chunk(cid, created, CANNED_MODEL, schema.delta_for("reasoning", "Okay")),
        schema.chunk(cid, created, CANNED_MODEL, {}, "stop"),
    ]
    return b"".join(schema.sse(p) for p in parts) + schema.SSE_DONE


def _qt_loop(app, kind: str):
    """The asyncio loop over Qt: qasync's own, or desktop.fastloop's (what the app uses)."""
    if kind == "qasync":
        import qasync

        return qasync.QEventLoop(app)
    from desktop.fastloop import FastQEventLoop

    return FastQEventLoop(app)


def baseline(n: int, warmup: int, on_qt: bool = False, loop_kind: str = "fast") -> dict:
    """Both clients against an aiohttp app that answers each request at once, on plain asyncio or (on_qt) on
    a Qt-integrated loop over a bare QCoreApplication: what the Qt loop alone costs."""
    import asyncio

    from aiohttp import web

    stamps: dict[str, float] = {}
    canned = _canned_stream()

    async def handler(request: web.Request) -> web.StreamResponse:
        stamps[request.headers.get(ID_HEADER, "")] = time.perf_counter()
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        await resp.write(canned)
        await resp.write_eof()
        return resp

    async def main() -> dict:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        loop = asyncio.get_running_loop()
        out = {}
        for mode in ("raw", "openai"):
            rows = await loop.run_in_executor(None, run_client, url, CANNED_MODEL, mode, n, warmup, f"base-{mode}", 1)
            out[mode] = {
                "send_to_handler_ms": _med(rows, lambda x: stamps[x["id"]] - x["send"]),
                "handler_to_client_ms": _med(rows, lambda x: x["first"] - stamps[x["id"]]),
                "ttft_ms": _med(rows, lambda x: x["first"] - x["send"]),
            }
        await runner.cleanup()
        return out

    if not on_qt:
        return asyncio.run(main())
    from PySide6.QtCore import QCoreApplication

    app = QCoreApplication.instance() or QCoreApplication(sys.argv[:1])
    loop = _qt_loop(app, loop_kind)
    asyncio.set_event_loop(loop)
    with loop:
        return loop.run_until_complete(main())


def _med(rows, f) -> float:
    return statistics.median(f(r) for r in rows) * 1000


# ---------------------------------------------------------------------------------------------- the real server
def _stamp_generate(generate, gen_t: dict, token_t: dict):
    """Wraps a real engine's generate(): stamps its entry and its first Delta with text (what a client sees)."""
    from model_loader.events import Delta

    def stamped(messages, settings=None, control=None):
        rid = messages[-1]["content"].removeprefix("bench ")
        gen_t[rid] = time.perf_counter()
        for ev in generate(messages, settings, control):
            if isinstance(ev, Delta) and ev.text and rid not in token_t:
                token_t[rid] = time.perf_counter()
            yield ev

    return stamped


def stamped_fake_engine(gen_t: dict, token_t: dict):
    """A FakeEngine class whose Started comes with the first token, as the real engine's does (Started is yielded
    after the prefill, right before the first token's Delta); it stamps generate() into gen_t and that first
    token into token_t, by the request id its last message carries ("bench ID")."""
    from model_loader.events import Delta, Started
    from tests.desktop import fakes

    class StampedEngine(fakes.FakeEngine):
        def generate(self, messages, settings=None, control=None):
            rid = messages[-1]["content"].removeprefix("bench ")
            gen_t[rid] = time.perf_counter()
            started = None
            for ev in super().generate(messages, settings, control):
                if isinstance(ev, Started):
                    started = ev
                    continue
                if isinstance(ev, Delta) and started is not None:
                    token_t[rid] = time.perf_counter()
                    yield started
                    started = None
                yield ev

    return StampedEngine


def real_server(
    n: int,
    warmup: int,
    token_ms: float,
    max_tokens: int,
    model: str | None = None,
    context: int = 4096,
    loop_kind: str = "fast",
) -> dict:
    """The real ApiServer on the same loop and service setup as `r1desk-cli serve` (desktop/serve.py)."""
    import asyncio
    import contextvars

    from PySide6.QtCore import QCoreApplication

    from desktop.api import server as server_module
    from desktop.api.server import ApiServer
    from desktop.gcguard import GuiThreadGC
    from desktop.service import EngineService
    from desktop.worker import LoadRequest
    from tests.desktop import fakes

    handler_t: dict[str, float] = {}
    gen_t: dict[str, float] = {}
    token_t: dict[str, float] = {}
    gui_t: dict[str, float] = {}  # the GUI thread has the first text (EngineService.request_progress)
    write_t: dict[str, float] = {}  # the handler's first write carrying text returned
    submit_t: dict[str, float] = {}  # EngineService.submit returned: the request is queued to the worker thread
    current_id: contextvars.ContextVar[str] = contextvars.ContextVar("bench_id", default="")

    class StampedService(EngineService):
        def submit(self, messages, *args, **kwargs):
            gen = super().submit(messages, *args, **kwargs)
            submit_t[messages[-1]["content"].removeprefix("bench ")] = time.perf_counter()
            return gen

    class StampedSse(server_module._SseResponse):
        async def write(self, data):
            await super().write(data)
            rid = current_id.get()
            if rid and rid not in write_t and any(_is_first_text(line) for line in data.split(b"\n")):
                write_t[rid] = time.perf_counter()

        async def write_eof(self, data=b""):  # a short stream's first text can come with the end
            await super().write_eof(data)
            rid = current_id.get()
            if rid and rid not in write_t and any(_is_first_text(line) for line in data.split(b"\n")):
                write_t[rid] = time.perf_counter()

    server_module._SseResponse = StampedSse

    StampedEngine = stamped_fake_engine(gen_t, token_t)

    class StampedServer(ApiServer):
        async def chat_completions(self, request):
            rid = request.headers.get(ID_HEADER, "")
            handler_t[rid] = time.perf_counter()
            current_id.set(rid)
            return await super().chat_completions(request)

    def real_factory(request, progress, on_compiling=None):
        from model_loader.engine import Engine

        engine = Engine.load(model, device=request["device"], context_length=context, progress=progress)
        engine.generate = _stamp_generate(engine.generate, gen_t, token_t)
        return engine

    device = "cpu"
    if model:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    sys.setswitchinterval(0.0005)  # as serve.run does
    app = QCoreApplication.instance() or QCoreApplication(sys.argv[:1])
    app._r1desk_gc = GuiThreadGC(parent=app)
    if model:
        service = StampedService(app, engine_factory=real_factory)  # the worker warms it up, as in the app
    else:
        service = StampedService(
            app, engine_factory=fakes.factory(StampedEngine(token_s=token_ms / 1000, prefill_s=0.0))
        )

    def on_progress(req, kind, tokens):
        rid = req.messages[-1]["content"].removeprefix("bench ")
        gui_t.setdefault(rid, time.perf_counter())

    service.request_progress.connect(on_progress)
    server = StampedServer(service, host="127.0.0.1", port=0, defaults={"temperature": 0.6, "top_p": 0.95})
    loop = _qt_loop(app, loop_kind)  # as serve.run does
    asyncio.set_event_loop(loop)

    async def main() -> dict:
        await server.start()
        ready = loop.create_future()
        service.ready.connect(lambda info: ready.done() or ready.set_result(info))
        failed = []
        service.load_failed.connect(
            lambda kind, message: failed.append(message) or ready.done() or ready.set_result(None)
        )
        service.load(LoadRequest(model or MODEL_PATH, device, context))
        await ready
        if failed:
            raise SystemExit(f"could not load the model: {failed[0]}")
        out = {}
        for mode in ("raw", "openai"):
            rows = await loop.run_in_executor(
                None, run_client, server.url, server.model_id, mode, n, warmup, f"real-{mode}", max_tokens
            )
            out[mode] = {
                "send_to_handler_ms": _med(rows, lambda x: handler_t[x["id"]] - x["send"]),
                "handler_to_engine_ms": _med(rows, lambda x: gen_t[x["id"]] - handler_t[x["id"]]),
                "handler_to_submitted_ms": _med(rows, lambda x: submit_t[x["id"]] - handler_t[x["id"]]),
                "submitted_to_engine_ms": _med(rows, lambda x: gen_t[x["id"]] - submit_t[x["id"]]),
                "token_to_client_ms": _med(rows, lambda x: x["first"] - token_t[x["id"]]),
                "token_to_gui_ms": _med(rows, lambda x: gui_t[x["id"]] - token_t[x["id"]]),
                "gui_to_written_ms": _med(rows, lambda x: write_t[x["id"]] - gui_t[x["id"]]),
                "written_to_client_ms": _med(rows, lambda x: x["first"] - write_t[x["id"]]),
                "ttft_ms": _med(rows, lambda x: x["first"] - x["send"]),
                "engine_ttft_ms": _med(rows, lambda x: token_t[x["id"]] - gen_t[x["id"]]),
                "ttft_minus_engine_ms": _med(
                    rows, lambda x: (x["first"] - x["send"]) - (token_t[x["id"]] - gen_t[x["id"]])
                ),
            }
        await server.stop()
        return out

    with loop:
        result = loop.run_until_complete(main())
    service.shutdown(3000)
    return result


# ---------------------------------------------------------------------------------------------- report
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=300, help="measured requests per client (default 300)")
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--token-ms", type=float, default=1.4, help="the scripted engine's time per token")
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument(
        "--pause-ms",
        type=float,
        default=0.0,
        help="the openai client waits this long before each request (not timed): a server with "
        "nothing left to do from the previous one",
    )
    ap.add_argument("--model", help="the real engine with this model on the GPU (default: a scripted engine)")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--json", help="also write the medians here")
    ap.add_argument(
        "--loop",
        choices=["fast", "qasync"],
        default="fast",
        help="the Qt-integrated asyncio loop: desktop.fastloop's (as the app runs it) or qasync's own",
    )
    ap.add_argument(
        "--parts",
        default="base,base_qt,real",
        help="which servers to measure, comma-separated: base (instant, plain asyncio), base_qt "
        "(instant, Qt loop), real (the real server)",
    )
    ap.add_argument("--client", choices=["raw", "openai"], help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--model-id", help=argparse.SUPPRESS)
    ap.add_argument("--prefix", default="r", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        client_main(args.url, args.model_id, args.client, args.n, args.warmup, args.prefix, args.max_tokens)
        return 0
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ["R1DESK_BENCH_PAUSE_MS"] = str(args.pause_ms)  # read by the client processes
    parts = set(args.parts.split(","))
    base = baseline(args.n, args.warmup) if "base" in parts else None
    base_qt = baseline(args.n, args.warmup, on_qt=True, loop_kind=args.loop) if "base_qt" in parts else None
    real = None
    if "real" in parts:
        real = real_server(args.n, args.warmup, args.token_ms, args.max_tokens, args.model, args.context, args.loop)
    engine = f"real engine, {args.model}" if args.model else f"scripted engine: {args.token_ms} ms/token"
    loop_name = {"fast": "desktop.fastloop's", "qasync": "qasync's own"}[args.loop]
    print(f"medians of {args.n} streamed requests per client, ms ({engine}; Qt loop: {loop_name})")
    print(f"{'':40s}{'raw http.client':>17s}{'openai':>10s}")
    rows = [
        ("send -> handler", "send_to_handler_ms"),
        ("handler -> engine generate()", "handler_to_engine_ms"),
        ("  handler -> queued to the worker", "handler_to_submitted_ms"),
        ("  queued -> engine generate()", "submitted_to_engine_ms"),
        ("engine first token -> client chunk", "token_to_client_ms"),
        ("  token -> GUI thread has it", "token_to_gui_ms"),
        ("  GUI thread -> first write returned", "gui_to_written_ms"),
        ("  write returned -> client has it", "written_to_client_ms"),
        ("client TTFT", "ttft_ms"),
        ("engine's own TTFT", "engine_ttft_ms"),
        ("client TTFT - engine TTFT", "ttft_minus_engine_ms"),
    ]
    short = [
        ("send -> handler", "send_to_handler_ms"),
        ("handler -> client chunk", "handler_to_client_ms"),
        ("client TTFT", "ttft_ms"),
    ]
    if real:
        print(f"real server ({loop_name} Qt loop, as r1desk-cli serve and the window run it)")
        for label, key in rows:
            print(f"  {label:38s}{real['raw'][key]:17.3f}{real['openai'][key]:10.3f}")
    if base:
        print("instant canned-SSE server (plain asyncio)")
        for label, key in short:
            print(f"  {label:38s}{base['raw'][key]:17.3f}{base['openai'][key]:10.3f}")
    if base_qt:
        print(f"the same instant server on {loop_name} Qt loop (a bare QCoreApplication)")
        for label, key in short:
            print(f"  {label:38s}{base_qt['raw'][key]:17.3f}{base_qt['openai'][key]:10.3f}")
    if base and real:
        client_own = base["openai"]["ttft_ms"] - base["raw"]["ttft_ms"]
        print(f"openai client's own cost over raw http.client (instant server): {client_own:.3f} ms")
        print(
            f"real server's share with the openai client (TTFT - engine TTFT - that): "
            f"{real['openai']['ttft_minus_engine_ms'] - client_own:.3f} ms"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"args": vars(args), "real_server": real, "instant_server": base, "instant_server_qt": base_qt},
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
