"""`r1desk-cli serve`: the local OpenAI-compatible API without a window.

The same EngineService and ApiServer the window uses, on a QCoreApplication (QtCore only: no display needed)
whose event loop is the asyncio loop (qasync), exactly as in the app. It listens at once (requests get 503 while
the model loads) and prints `serving MODEL on http://HOST:PORT/v1` once it is ready; Ctrl+C or SIGTERM ends the
replies running (their streams get a last error event) and stops it.
"""

from __future__ import annotations

import asyncio
import faulthandler
import signal
import sys


def run(args) -> int:
    """args: `r1desk-cli serve`'s options (desktop/cli.py)."""
    from PySide6.QtCore import QCoreApplication, QTimer

    from desktop.api.server import ApiServer, is_loopback
    from desktop.fastloop import qt_event_loop
    from desktop.gcguard import GuiThreadGC
    from desktop.service import EngineService
    from desktop.worker import LoadRequest

    if not is_loopback(args.host) and not args.api_key:
        print(
            f"r1desk serve: serving on {args.host} makes the API reachable from other computers; give it an --api-key",
            file=sys.stderr,
        )
        return 2
    faulthandler.enable()
    sys.setswitchinterval(0.0005)  # as in the app: the engine thread gets the GIL back within half a millisecond
    app = QCoreApplication.instance() or QCoreApplication(sys.argv[:1])
    app._r1desk_gc = GuiThreadGC(parent=app)  # Qt objects are finalized on this thread only
    service = EngineService(
        app, max_waiting=args.max_waiting, max_parallel=args.max_parallel, max_tokens_cap=args.max_tokens_cap
    )
    server = ApiServer(
        service,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        allowed_origins=args.allow_origin,
        served_names=args.served_model_name or (),
        defaults={"temperature": args.temperature, "top_p": args.top_p},
    )
    loop = qt_event_loop(app)  # as the app's (qasync's, with cheaper callbacks: desktop/fastloop.py)
    asyncio.set_event_loop(loop)
    done = asyncio.Event()
    code = [0]

    def finish(rc: int) -> None:
        code[0] = rc
        done.set()

    def on_ready(info: dict) -> None:
        parallel = info.get("max_parallel") or 1
        if parallel > 1:
            print(f"decoding up to {parallel} replies at once", file=sys.stderr, flush=True)
        print(f"serving {server.model_id} on {server.url}", flush=True)

    def on_load_failed(kind: str, message: str) -> None:
        print(f"r1desk serve: could not load the model: {message}", file=sys.stderr)
        finish(1)

    service.ready.connect(on_ready)
    service.load_failed.connect(on_load_failed)
    said = {
        "preparing": "preparing GPU kernels (first start only)…",
        "compiling": "loading, and compiling GPU kernels alongside (first start only)…",
    }
    service.stage.connect(lambda stage: print(said.get(stage, f"{stage}…"), file=sys.stderr, flush=True))
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, lambda: finish(0))
        except (NotImplementedError, RuntimeError):  # Windows: Ctrl+C arrives as KeyboardInterrupt instead
            # (a Ctrl+C after the loop closed, while the engine shuts down: nothing left to stop)
            signal.signal(sig, lambda *_: loop.is_closed() or loop.call_soon_threadsafe(finish, 0))
    # Python runs signal handlers only between bytecodes; a timer keeps the interpreter ticking while Qt waits.
    ticker = QTimer()
    ticker.start(200)
    ticker.timeout.connect(lambda: None)
    with loop:
        # Listen first: a client that starts with the server gets 503 + Retry-After while the model loads,
        # not "connection refused"; and a port that is taken is reported before seconds of loading.
        try:
            loop.run_until_complete(server.start())
        except OSError as err:
            print(f"r1desk serve: could not listen on {args.host}:{args.port}: {err.strerror or err}", file=sys.stderr)
            service.shutdown(3000)  # its engine thread runs already: a QThread destroyed running aborts Python
            return 1
        service.load(LoadRequest(args.model, args.device, args.context, args.dtype, args.kv_cache))
        loop.run_until_complete(done.wait())
        loop.run_until_complete(server.stop())
    if not service.shutdown(3000):
        print("r1desk serve: the engine did not stop in time; exiting anyway", file=sys.stderr)
    return code[0]
