"""Is desktop.fastloop's event loop still faster for the API than qasync's (R1DESK_QASYNC_LOOP=1) and asyncio's?

The same servers on different event loops, measured side by side: requests alternate between them.

On a small, busy machine the openai client's own time swings by a millisecond from one run to the next, more
than the differences between event loops, so measuring one loop per run tells little. Here each server runs in
its own process and one client process sends request i to every server in turn (in a shuffled order), so all
of them see the same noise; the report gives each server's median TTFT and the median of the per-round
difference to the first server of the same kind.

Servers (--servers, comma-separated KIND:LOOP):
    KIND  instant: a minimal aiohttp app answering at once with a canned SSE stream (api_latency_split's)
          real:    the real ApiServer + EngineService + worker thread with a scripted engine (fakes.FakeEngine),
                   set up as `r1desk-cli serve` does; its TTFT is reported minus the engine's own (stamped in
                   the server process, same clock)
    LOOP  asyncio (plain, instant only), qasync (qasync.QEventLoop), fast (desktop.fastloop.FastQEventLoop)

Clients (--clients): raw (http.client, one kept-alive connection per server), rawnew (http.client, a new
connection per request, as the openai client ends up doing), openai (one openai.OpenAI per server).

    QT_QPA_PLATFORM=offscreen python -m benchmarks.research.api_loop_ab -n 300 \\
        --servers instant:asyncio,instant:qasync,instant:fast,real:qasync,real:fast
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import api_latency_split as split

ROOT = Path(__file__).resolve().parents[2]  # the server processes run this module from here
ID = split.ID_HEADER


# ---------------------------------------------------------------------------------------------- servers
def serve(kind: str, loop_kind: str, token_ms: float) -> None:
    """Runs one server until stdin closes; prints its URL, then at the end the engine's stamps as JSON."""
    from aiohttp import web

    gen_t: dict[str, float] = {}
    token_t: dict[str, float] = {}
    stop = asyncio.Event()

    async def main(runner_factory) -> None:
        loop = asyncio.get_running_loop()
        url, cleanup = await runner_factory()
        print(url, flush=True)
        fd = sys.stdin.fileno()
        loop.add_reader(fd, lambda: os.read(fd, 100) or stop.set())
        await stop.wait()
        loop.remove_reader(fd)
        await cleanup()

    async def instant():
        canned = split._canned_stream()

        async def handler(request: web.Request) -> web.StreamResponse:
            await request.read()
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(canned)
            await resp.write_eof()
            return resp

        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}/v1 {split.CANNED_MODEL}", runner.cleanup

    if loop_kind == "asyncio":
        assert kind == "instant"
        asyncio.run(main(instant))
        print(json.dumps({"engine_ttft": {}}), flush=True)
        return
    from PySide6.QtCore import QCoreApplication

    app = QCoreApplication.instance() or QCoreApplication(sys.argv[:1])
    sys.setswitchinterval(0.0005)  # as serve.run does
    loop = split._qt_loop(app, loop_kind)
    asyncio.set_event_loop(loop)
    if kind == "instant":
        factory = instant
    else:
        from desktop.api.server import ApiServer
        from desktop.gcguard import GuiThreadGC
        from desktop.service import EngineService
        from desktop.worker import LoadRequest
        from tests.desktop import fakes

        StampedEngine = split.stamped_fake_engine(gen_t, token_t)  # Started comes with the first token

        app._r1desk_gc = GuiThreadGC(parent=app)
        service = EngineService(app, engine_factory=fakes.factory(StampedEngine(token_s=token_ms / 1000)))
        server = ApiServer(service, host="127.0.0.1", port=0, defaults={"temperature": 0.6, "top_p": 0.95})

        async def factory():
            await server.start()
            ready = loop.create_future()
            service.ready.connect(lambda info: ready.done() or ready.set_result(info))
            service.load(LoadRequest(split.MODEL_PATH, "cpu", 4096))
            await ready
            return f"{server.url} {server.model_id}", server.stop

    with loop:
        loop.run_until_complete(main(factory))
    if kind == "real":
        service.shutdown(3000)
    print(json.dumps({"engine_ttft": {k: token_t[k] - gen_t[k] for k in token_t}}), flush=True)


# ---------------------------------------------------------------------------------------------- client
class Client:
    def __init__(self, mode: str, url: str, model: str, max_tokens: int):
        from urllib.parse import urlsplit

        self.mode, self.url, self.model, self.max_tokens = mode, url, model, max_tokens
        self.u = urlsplit(url)
        self.conn = None
        if mode == "openai":
            import openai

            self.openai = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)

    def request(self, rid: str) -> float:
        """One streamed request; returns its TTFT in seconds."""
        if self.mode == "openai":
            send = time.perf_counter()
            first = None
            stream = self.openai.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": f"bench {rid}"}],
                max_tokens=self.max_tokens,
                stream=True,
                extra_headers={ID: rid},
            )
            for chunk in stream:
                if first is None and chunk.choices:
                    d = chunk.choices[0].delta
                    if d.content or (d.model_extra or {}).get("reasoning_content"):
                        first = time.perf_counter()
            return first - send
        import http.client

        body = json.dumps(
            {
                "model": self.model,
                "messages": [{"role": "user", "content": f"bench {rid}"}],
                "max_tokens": self.max_tokens,
                "stream": True,
            }
        ).encode()
        send = time.perf_counter()
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.u.hostname, self.u.port, timeout=60)
        first = None
        self.conn.request(
            "POST", self.u.path + "/chat/completions", body=body, headers={"Content-Type": "application/json", ID: rid}
        )
        resp = self.conn.getresponse()
        while line := resp.readline():
            if first is None and split._is_first_text(line):
                first = time.perf_counter()
        assert resp.status == 200 and first is not None
        if self.mode == "rawnew":
            self.conn.close()
            self.conn = None
        return first - send


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=300, help="rounds per client (each sends one request per server)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--servers", default="instant:asyncio,instant:qasync,instant:fast,real:qasync,real:fast")
    ap.add_argument("--clients", default="raw,rawnew,openai")
    ap.add_argument("--token-ms", type=float, default=1.4)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument(
        "--pause-ms",
        type=float,
        default=1.0,
        help="untimed pause before each request, so the previous server's after-work is done",
    )
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    if args.serve:
        kind, loop_kind = args.serve.split(":")
        serve(kind, loop_kind, args.token_ms)
        return 0
    names = args.servers.split(",")
    procs, urls = {}, {}
    for name in names:
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.research.api_loop_ab",
                "--serve",
                name,
                "--token-ms",
                str(args.token_ms),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        procs[name] = p
        urls[name] = p.stdout.readline().split()
    results: dict = {}
    try:
        for mode in args.clients.split(","):
            clients = {name: Client(mode, urls[name][0], urls[name][1], args.max_tokens) for name in names}
            ttft = {name: [] for name in names}
            for i in range(args.warmup + args.n):
                order = names[:]
                random.shuffle(order)
                for name in order:
                    if args.pause_ms:
                        time.sleep(args.pause_ms / 1000)  # the previous server's after-work is done
                    t = clients[name].request(f"{mode}-{i}")
                    if i >= args.warmup:
                        ttft[name].append((f"{mode}-{i}", t))
            results[mode] = ttft
    finally:
        engine: dict = {}
        for name, p in procs.items():
            out, _ = p.communicate("", timeout=60)
            engine[name] = json.loads(out.strip().splitlines()[-1])["engine_ttft"]
    report = {}
    print(
        f"medians over {args.n} rounds, ms; 'diff': the median per-round difference to the first server of"
        f" the same kind (real servers: client TTFT - engine TTFT)"
    )
    for mode, ttft in results.items():
        print(f"{mode} client")
        per = {}
        for name in names:
            per[name] = [(t - engine[name].get(rid, 0.0)) * 1000 for rid, t in ttft[name]]
        report[mode] = {}
        for name in names:
            ref = next(n for n in names if n.split(":")[0] == name.split(":")[0])
            diff = statistics.median(a - b for a, b in zip(per[name], per[ref]))
            med = statistics.median(per[name])
            report[mode][name] = {"median_ms": med, "diff_ms": diff}
            print(f"  {name:18s} {med:8.3f}   diff {diff:+8.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": report}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
